"""Deterministic records for the interoperability tests, and the checks applied to what is read.

A `Rec` is what a test asks a client to write: key, value and headers as bytes (or None), the
partition it goes to and its CreateTime timestamp. `Got` is what a client read back, with the
offset the broker assigned. `assert_read_back` compares them byte for byte, per partition, in
order, and checks that the offsets of each partition are contiguous from the first offset read.

The data exercises the edges a broker can get wrong: non-UTF-8 bytes, an empty value, a null
value, a null key, duplicate header names, a non-ASCII header name, an empty header value, and a
value large enough that a compressed batch is much smaller than the raw one.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

Header = tuple[str, bytes | None]
T = TypeVar("T")


@dataclass(frozen=True)
class Rec:
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()
    # None: the writing client's partitioner chooses (where its writer supports that).
    partition: int | None = 0
    timestamp: int | None = None


@dataclass(frozen=True)
class Got:
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = field(default=())


def make_records(
    count: int,
    *,
    seed: int,
    partitions: int = 1,
    base_timestamp: int | None = None,
    headers: bool = True,
    null_key: bool = True,
) -> list[Rec]:
    """`count` records spread round-robin over `partitions`, timestamps 10 ms apart."""
    rng = random.Random(seed)
    records = []
    for i in range(count):
        key: bytes | None = b"k-%d" % i
        if null_key and i == 4:
            key = None
        if i == 1:
            value: bytes | None = b""
        elif i == 2:
            value = None
        elif i == 5:
            # Compressible and larger than a small batch: codecs really compress here.
            value = b"v-5|" + (b"tidelog " * 2500) + rng.randbytes(64)
        else:
            # Starts with bytes that are not UTF-8, and holds NUL bytes.
            value = b"\xff\xfe\x00v-%d|" % i + rng.randbytes(rng.randint(0, 300))
        record_headers: tuple[Header, ...] = ()
        if headers and i % 3 == 1:
            record_headers = (("h1", b"x"), ("h1", b"\x00\xff\x80"))
        elif headers and i % 3 == 2:
            record_headers = (("ключ", rng.randbytes(8)), ("empty", b""))
        timestamp = None if base_timestamp is None else base_timestamp + 10 * i
        records.append(Rec(key, value, record_headers, i % partitions, timestamp))
    return records


def by_partition(items: Iterable[Got]) -> dict[int, list[Got]]:
    grouped: dict[int, list[Got]] = defaultdict(list)
    for item in items:
        grouped[item.partition].append(item)
    return dict(grouped)


def assert_read_back(
    expected: Sequence[Rec],
    got: Sequence[Got],
    *,
    first_offset: int = 0,
    check_timestamps: bool = True,
    check_headers: bool = True,
) -> None:
    """`got` holds exactly `expected`: per partition, in order, byte-exact, offsets contiguous."""
    assert len(got) == len(expected), f"read {len(got)} records, wrote {len(expected)}"
    want: dict[int, list[Rec]] = defaultdict(list)
    for rec in expected:
        want[rec.partition].append(rec)
    have = by_partition(got)
    assert sorted(have) == sorted(want), f"partitions read {sorted(have)}, written {sorted(want)}"
    for partition, recs in want.items():
        reads = have[partition]
        offsets = [g.offset for g in reads]
        assert offsets == list(range(first_offset, first_offset + len(recs))), (
            f"partition {partition}: offsets {offsets}"
        )
        for index, (rec, read) in enumerate(zip(recs, reads, strict=True)):
            where = f"partition {partition} offset {read.offset} (record {index})"
            assert read.key == rec.key, f"{where}: key {read.key!r} != {rec.key!r}"
            assert read.value == rec.value, (
                f"{where}: value {_short(read.value)} != {_short(rec.value)}"
            )
            if check_headers:
                assert tuple(read.headers) == tuple(rec.headers), (
                    f"{where}: headers {read.headers!r} != {rec.headers!r}"
                )
            if check_timestamps and rec.timestamp is not None:
                assert read.timestamp == rec.timestamp, (
                    f"{where}: timestamp {read.timestamp} != {rec.timestamp}"
                )


def _short(data: bytes | None) -> str:
    if data is None:
        return "None"
    return repr(data[:40]) + (f"...({len(data)} bytes)" if len(data) > 40 else "")


def offset_at_or_after(records: Sequence[Rec], partition: int, timestamp: int) -> int | None:
    """The offset ListOffsets by timestamp must answer: first record with ts >= `timestamp`."""
    in_partition = [r for r in records if r.partition == partition]
    for offset, rec in enumerate(in_partition):
        assert rec.timestamp is not None
        if rec.timestamp >= timestamp:
            return offset
    return None


CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def base_timestamp() -> int:
    """A CreateTime an hour ago, on a whole second: inside any retention, clearly in the past."""
    return (int(time.time()) - 3600) * 1000


def wait_until(predicate: Callable[[], T], what: str, timeout: float = 15.0) -> T:
    """Polls `predicate` until it is truthy, and returns that value; fails naming `what`
    (for eventual broker state)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


# -- broker configs ------------------------------------------------------------------------

#: A Kafka broker config Tidelog accepts and stores but does not act on (no Kerberos).
KERBEROS_RELOGIN = "sasl.kerberos.min.time.before.relogin"
INVALID_CONFIG = 40
INVALID_REQUEST = 42

#: (name, value, Kafka error code) of broker-config changes on broker "1" that Kafka refuses:
#: read-only keys and a value of the wrong type are INVALID_REQUEST, an unknown name is
#: INVALID_CONFIG. Every client family's admin test runs the same cases.
BROKER_CONFIG_REFUSALS = (
    ("broker.id", "7", INVALID_REQUEST),
    ("log.dirs", "/elsewhere", INVALID_REQUEST),
    (KERBEROS_RELOGIN, "soon", INVALID_REQUEST),
    ("sasl.kerberos.no.such.key", "1", INVALID_CONFIG),
)
BROKER_CONFIG_REFUSAL_IDS = ("read-only-id", "read-only-dirs", "wrong-type", "unknown")
