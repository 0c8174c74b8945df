"""Mutated requests against a real broker: it must stay up, keep its data and never crash.

Seeds are valid encoded requests of several APIs and versions (flexible and not):
ApiVersions, Metadata, Produce (with a real record batch, acks 0, 1 and -1), Fetch,
ListOffsets, CreateTopics, InitProducerId, DescribeProducers. A seeded RNG mutates them:
flipped bytes, truncation, junk appended, 16/32-bit fields overwritten with huge or negative
values, runs of 0xff (huge varints), a random API key or version in a valid header, record
batches mutated *with their CRC recomputed* (so the records decoder is reached, not only the
CRC check), random garbage frames, and size prefixes that are negative, too large, or lie
about the length. Frames go out pipelined, a burst per connection, followed by a valid
ApiVersions request as a sentinel; each connection ends as

- ``survived``: the sentinel was answered (every earlier frame was handled or refused),
- ``closed``: the broker closed the connection (what it does with a request it cannot parse),
- ``stalled``: neither within the read timeout (a size prefix promised more bytes than came,
  or a long poll; the broker is right to wait).

Then: the broker process is alive; its log holds no traceback (an unhandled exception in a
handler is a bug: the test names the request that caused it and keeps its bytes in
``fuzz-failures/``); confluent-kafka still produces and consumes; the records produced
before the fuzzing read back byte-exactly; and every partition the broker has (the fuzzed
produce requests wrote into some) reads through from its log start to its end as valid
batches, by our fetch and by a confluent-kafka consumer.
"""

from __future__ import annotations

import random
import re
import socket
import struct
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from interop_broker import BrokerProcess
from system_wire import (
    EARLIEST,
    LATEST,
    WireClient,
    api_versions_request,
    create_topics_request,
    describe_producers_request,
    fetch_request,
    init_producer_id_request,
    list_offsets_request,
    make_batch,
    metadata_request,
    produce_request,
    whole_batches,
)

from tidelog.protocol import (
    SUPPORTED_VERSIONS,
    ApiKey,
    ErrorCode,
    FrameDecoder,
    FrameError,
    ProtocolError,
    UnsupportedVersionError,
    VersionRange,
    decode_response,
    encode_request,
    parse_request,
)
from tidelog.records import RecordsError, compute_crc, iter_records

SEED = 20261121
REQUESTS = 12_000
BAD_FRAMES = 1_500
KEEP_TOPIC = "fuzz-keep"
TARGET_TOPIC = "fuzz-target"
PARTITIONS = 3
SENTINEL_CORRELATION = 0x5E571E1
# Every connection half-closes after its frames, so only a long poll (a Fetch whose mutated
# max wait and min bytes make it wait for data) can keep an answer from coming.
READ_TIMEOUT_S = 5.0
WORKERS = 16
CRC_OFFSET = 17  # of the CRC-32C in a record batch header; it covers the bytes after it
CRC_START = 21

_HUGE = (0x7FFFFFFF, 0xFFFFFFFF, 0x80000000, 0x7FFF, 0xFFFF, 0x8000, 0x40000000)


def _encode(request: object, correlation_id: int) -> bytes:
    return encode_request(request, correlation_id=correlation_id, client_id="fuzz")


@dataclass(frozen=True)
class Seed:
    name: str
    frame: bytes  # size prefix included
    batch_at: int = -1  # where a record batch starts inside the frame, or -1
    batch_size: int = 0


def seeds(rng: random.Random) -> list[Seed]:
    out: list[Seed] = []

    def add(name: str, request: object, batch: bytes | None = None) -> None:
        frame = _encode(request, rng.randrange(1 << 31))
        at = -1 if batch is None else frame.find(batch)
        assert batch is None or at > 0
        out.append(Seed(name, frame, at, 0 if batch is None else len(batch)))

    for version in (0, 3):
        add(f"ApiVersions v{version}", api_versions_request(version))
    for version in (1, 9, 12):
        add(f"Metadata v{version}", metadata_request([TARGET_TOPIC, KEEP_TOPIC], version))
        add(f"Metadata v{version} all", metadata_request(None, version))
    for version in (3, 9):
        batch = make_batch(
            [b"fuzz-%d" % i for i in range(4)], key=b"k", producer=(5_000 + version, 0, 0)
        )
        for acks in (0, 1, -1):
            add(
                f"Produce v{version} acks={acks}",
                produce_request(TARGET_TOPIC, rng.randrange(PARTITIONS), batch, acks, version),
                batch,
            )
    for version in (4, 12):
        add(f"Fetch v{version}", fetch_request(TARGET_TOPIC, 0, 0, 1 << 16, version))
    for version in (1, 7):
        add(f"ListOffsets v{version}", list_offsets_request(TARGET_TOPIC, 1, EARLIEST, version))
    for version in (2, 7):
        add(f"CreateTopics v{version}", create_topics_request(f"fz-{version}-topic", 2, version))
    add("InitProducerId v4", init_producer_id_request(4))
    add("DescribeProducers v0", describe_producers_request(TARGET_TOPIC, (0, 1, 2)))
    return out


def _with_size(body: bytes | bytearray) -> bytes:
    return struct.pack(">i", len(body)) + bytes(body)


def mutate(rng: random.Random, seed: Seed) -> tuple[str, bytes]:
    """One mutated frame (size prefix included) and the name of the mutation."""
    body = bytearray(seed.frame[4:])
    kind = rng.choice(
        (
            "flip",
            "flip",
            "flip",
            "truncate",
            "extend",
            "huge-int",
            "huge-int",
            "varint",
            "header",
            "batch",
            "batch",
            "garbage",
            "bad-size",
            "lying-size",
        )
    )
    if kind == "batch" and seed.batch_at < 0:
        kind = "flip"
    if kind == "flip":
        for _ in range(rng.randint(1, 8)):
            body[rng.randrange(len(body))] = rng.randrange(256)
    elif kind == "truncate":
        del body[rng.randrange(len(body)) :]
    elif kind == "extend":
        body += rng.randbytes(rng.randint(1, 64))
    elif kind == "huge-int":
        for _ in range(rng.randint(1, 3)):
            value = rng.choice(_HUGE)
            width = 2 if value <= 0xFFFF else 4
            at = rng.randrange(max(1, len(body) - width))
            body[at : at + width] = value.to_bytes(width, "big")[-width:]
    elif kind == "varint":
        at = rng.randrange(len(body))
        body[at : at + 1] = b"\xff" * rng.randint(1, 10)
    elif kind == "header":
        struct.pack_into(
            ">hh", body, 0, rng.choice((rng.randrange(-5, 100), 0, 1, 3, 18)), rng.randrange(-3, 30)
        )
    elif kind == "batch":
        # Mutate inside the record batch, then fix its CRC so that the decoder sees it.
        at, size = seed.batch_at - 4, seed.batch_size
        batch = body[at : at + size]
        for _ in range(rng.randint(1, 4)):
            spot = rng.randrange(len(batch))
            if rng.random() < 0.3:
                value = rng.choice(_HUGE)
                batch[spot : spot + 4] = value.to_bytes(4, "big")
                del batch[size:]
            else:
                batch[spot] = rng.randrange(256)
        if len(batch) >= CRC_START:
            struct.pack_into(">I", batch, CRC_OFFSET, compute_crc(batch, 0, len(batch)))
        body[at : at + size] = batch
    elif kind == "garbage":
        return kind, _with_size(rng.randbytes(rng.randint(0, 300)))
    elif kind == "bad-size":
        size = rng.choice((-1, -(1 << 31), 0x7FFFFFFF, 104_857_601, 0x40000000))
        return kind, struct.pack(">i", size) + bytes(body)
    else:  # lying-size: the prefix promises more (or less) than the frame holds
        size = max(0, len(body) + rng.choice((-7, -1, 1, 9, 5000)))
        return kind, struct.pack(">i", size) + bytes(body)
    return kind, _with_size(body)


@dataclass(frozen=True)
class Frame:
    seed: str
    mutation: str
    data: bytes
    # What our own parser makes of it, with the broker's versions: "ok" (a request the
    # broker serves), "fallback" (ApiVersions of a version it does not know: answered with
    # v0), "refused" (cannot be parsed: the broker must close the connection),
    # "incomplete" (the size prefix promises more than comes: the broker waits).
    verdict: str
    api: str  # the API name in its header when it parses, else ""

    @property
    def parses(self) -> bool:
        return self.verdict in ("ok", "fallback")


def classify(
    seed: Seed, mutation: str, data: bytes, accepted: Mapping[ApiKey, VersionRange]
) -> Frame:
    def verdict(v: str, api: str = "") -> Frame:
        return Frame(seed.name, mutation, data, v, api)

    decoder = FrameDecoder()
    try:
        frames = decoder.feed(data)
    except FrameError:
        return verdict("refused")
    if not frames:
        return verdict("incomplete")
    try:
        header, _ = parse_request(frames[0], accepted)
    except UnsupportedVersionError as exc:
        assert exc.header is not None
        api_versions = exc.header.api_key == ApiKey.API_VERSIONS
        return verdict("fallback" if api_versions and len(frames) == 1 else "refused")
    except ProtocolError:
        return verdict("refused")
    if len(frames) > 1 or decoder.buffered:
        # A prefix that promised less: what follows is read as another frame.
        return verdict("incomplete")
    return verdict("ok", ApiKey(header.api_key).name)


def served_versions(client: WireClient) -> Mapping[ApiKey, VersionRange]:
    """The broker's accepted versions, as its ApiVersions answer says."""
    response = client.call(api_versions_request(3))
    served = {}
    for entry in response.api_keys:
        key = ApiKey(entry.api_key)
        lowest = (
            SUPPORTED_VERSIONS[key].min_accepted if key in SUPPORTED_VERSIONS else entry.min_version
        )
        served[key] = VersionRange(
            key, entry.min_version, entry.max_version, max(lowest, entry.min_version)
        )
    return served


def make_bursts(rng: random.Random, accepted: Mapping[ApiKey, VersionRange]) -> list[list[Frame]]:
    """Connections' frames: mutated frames the broker should serve (the handlers see them),
    and, on most connections, one it cannot parse at the end (the parser sees it). Valid
    seeds are mixed in unmutated now and then."""
    seed_list = seeds(rng)
    good: list[Frame] = []
    bad: list[Frame] = []
    # Most mutations make a frame unparseable; each of those ends its connection, and
    # connections are what costs time, so only some of them are sent.
    while len(good) < REQUESTS - BAD_FRAMES or len(bad) < BAD_FRAMES:
        seed = rng.choice(seed_list)
        if rng.random() < 0.05:
            frame = classify(seed, "none", seed.frame, accepted)
        else:
            frame = classify(seed, *mutate(rng, seed), accepted)
        (good if frame.parses else bad).append(frame)
    del good[REQUESTS - BAD_FRAMES :]
    del bad[BAD_FRAMES:]
    bursts: list[list[Frame]] = []
    per_connection = 2 * len(good) // len(bad)
    while good or bad:
        burst = [good.pop() for _ in range(min(len(good), rng.randint(0, per_connection)))]
        if bad and (rng.random() < 0.9 or not good):
            burst.append(bad.pop())
        if burst:
            bursts.append(burst)
    return bursts


@dataclass
class Outcome:
    port: int
    frames: list[Frame]
    ending: str = ""
    responses: int = 0
    errors: list[str] = field(default_factory=list)


def run_connection(host: str, port: int, frames: list[Frame]) -> Outcome:
    sentinel_request = api_versions_request(3)
    sentinel = _encode(sentinel_request, SENTINEL_CORRELATION)
    sock = socket.create_connection((host, port), timeout=READ_TIMEOUT_S)
    outcome = Outcome(sock.getsockname()[1], frames)
    try:
        try:
            sock.sendall(b"".join(f.data for f in frames) + sentinel)
            # End of input: the broker answers what it took and closes; nothing waits for
            # the rest of a frame that promised more than it had.
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            outcome.ending = "closed"
            return outcome
        decoder = FrameDecoder()
        while True:
            try:
                data = sock.recv(1 << 16)
            except TimeoutError:
                outcome.ending = "stalled"
                return outcome
            except ConnectionResetError:
                data = b""
            if not data:
                outcome.ending = "closed"
                return outcome
            for response in decoder.feed(data):
                outcome.responses += 1
                if bytes(response[:4]) == SENTINEL_CORRELATION.to_bytes(4, "big"):
                    _, answer = decode_response(
                        response, api_key=18, api_version=3, correlation_id=SENTINEL_CORRELATION
                    )
                    if answer.error_code != 0:
                        outcome.errors.append(f"sentinel answered with {answer.error_code}")
                    outcome.ending = "survived"
                    return outcome
    finally:
        sock.close()


# -- data before and after ------------------------------------------------------------------


Kept = tuple[int, bytes, bytes, list[tuple[str, bytes]]]


def produce_keep_records(bootstrap: str, count: int, salt: int) -> list[Kept]:
    """Records with awkward bytes, produced with confluent-kafka: (partition, key, value,
    headers) of each, in acknowledgement order (which is log order per partition)."""
    rng = random.Random(SEED + salt)
    acked: list[Kept] = []
    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "log_level": 0}
    )
    for i in range(count):
        key = b"key-%d-" % (i % 7) + rng.randbytes(rng.randint(0, 8))
        value = rng.randbytes(rng.randint(0, 2000))
        headers = [("h", rng.randbytes(3)), ("n\u00e4me", b"")] if i % 3 == 0 else []

        def report(err: KafkaError | None, msg: Any, sent: tuple = (key, value, headers)) -> None:
            assert err is None, err
            acked.append((msg.partition(), *sent))

        producer.produce(KEEP_TOPIC, value=value, key=key, headers=headers, on_delivery=report)
        producer.poll(0)
    assert producer.flush(30) == 0
    assert len(acked) == count
    return acked


def consume_all(bootstrap: str, topic: str, partitions: int, ends: list[int]) -> list:
    """Every record of ``topic`` from the beginning up to ``ends`` with confluent-kafka."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"fuzz-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    records: list = []
    positions = [0] * partitions
    # A consumer that stops making progress is stuck (librdkafka does not report a batch it
    # cannot decode; it stops at it).
    progress = time.monotonic()
    try:
        while any(positions[p] < ends[p] for p in range(partitions)):
            assert time.monotonic() - progress < 8, f"stuck at {positions} of {ends}"
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            records.append((msg.partition(), msg.offset(), msg.key(), msg.value(), msg.headers()))
            positions[msg.partition()] = msg.offset() + 1
            progress = time.monotonic()
    finally:
        consumer.close()
    return records


def read_partition(client: WireClient, topic: str, partition: int) -> tuple[int, list[str]]:
    """Fetch the partition from its log start to its end and decode every record: the
    number of records, and what could not be decoded (with the raw batch, to reproduce)."""
    start = client.list_offset(topic, partition, EARLIEST)
    end = client.list_offset(topic, partition, LATEST)
    offset, count, problems = start, 0, []
    while offset < end:
        response = client.call(fetch_request(topic, partition, offset))
        result = response.responses[0].partitions[0]
        assert result.error_code == 0, (topic, partition, offset, result.error_code)
        batches = [b for b in whole_batches(bytes(result.records or b"")) if b[1] >= offset]
        assert batches, f"{topic}-{partition}@{offset} (end {end}): no batch"
        for batch, last in batches:
            try:
                count += sum(1 for _ in iter_records(batch))
            except RecordsError as exc:
                problems.append(f"{topic}-{partition}@{offset}: {exc}; batch {batch.hex()}")
            offset = last + 1
    return count, problems


def broker_topics(client: WireClient) -> dict[str, int]:
    response = client.call(metadata_request(None))
    return {str(t.name): len(t.partitions) for t in response.topics if t.error_code == 0}


# -- the test --------------------------------------------------------------------------------


def tracebacks(log_text: str) -> list[tuple[str, str]]:
    """(peer port, traceback text) of each handler failure the broker logged."""
    found: list[tuple[str, str]] = []
    for match in re.finditer(
        r"^[^\n]*failed; closing the connection\n(Traceback.*?)(?=^\d{4}-\d\d-\d\d |^===|\Z)",
        log_text,
        flags=re.M | re.S,
    ):
        line = match.group(0).splitlines()[0]
        port = re.search(r"from [^ ]+:(\d+) failed", line)
        found.append((port.group(1) if port else "?", line + "\n" + match.group(1)))
    return found


def test_fuzzed_requests_do_not_hurt_the_broker(
    brokers: Callable[[], BrokerProcess], tmp_path: Path
) -> None:
    broker = brokers()
    with WireClient(broker.host, broker.port) as client:
        client.create_topic(KEEP_TOPIC, PARTITIONS)
        client.create_topic(TARGET_TOPIC, PARTITIONS)
    kept = produce_keep_records(broker.bootstrap, 600, salt=1)

    with WireClient(broker.host, broker.port) as client:
        accepted = served_versions(client)
    bursts = make_bursts(random.Random(SEED), accepted)
    total = sum(len(b) for b in bursts)

    started = time.monotonic()
    with ThreadPoolExecutor(WORKERS) as pool:
        outcomes = list(pool.map(lambda b: run_connection(broker.host, broker.port, b), bursts))
    elapsed = time.monotonic() - started
    endings = Counter(o.ending for o in outcomes)
    mutations = Counter(f.mutation for b in bursts for f in b)
    parsed = sum(f.parses for b in bursts for f in b)
    mutated = total - mutations["none"]
    print(
        f"fuzz: {total} frames ({parsed} parse) over {len(bursts)} connections in "
        f"{elapsed:.1f}s; "
        f"endings {dict(endings)}; responses {sum(o.responses for o in outcomes)}; "
        f"mutations {dict(mutations)}"
    )

    assert mutated >= 10_000
    assert broker.running(), broker.log_tail()
    assert not [e for o in outcomes for e in o.errors]
    # A connection whose burst ends with a frame that cannot be parsed is closed by the
    # broker; so is one whose produce with acks=0 failed (how Kafka tells that client).
    for outcome in outcomes:
        if outcome.ending == "stalled":
            assert "FETCH" in {f.api for f in outcome.frames}, outcome.frames
        elif outcome.frames[-1].verdict == "refused":
            assert outcome.ending == "closed", outcome.frames
    assert endings["closed"] > 0 and endings["survived"] > 0

    # A real client still works, and the records from before the fuzzing are intact.
    with WireClient(broker.host, broker.port) as client:
        ends = [client.list_offset(KEEP_TOPIC, p, LATEST) for p in range(PARTITIONS)]
    assert sum(ends) == len(kept)
    read = consume_all(broker.bootstrap, KEEP_TOPIC, PARTITIONS, ends)
    assert len(read) == len(kept)
    for p in range(PARTITIONS):
        got = [(k, v, h or []) for q, _, k, v, h in sorted(read) if q == p]
        assert got == [(k, v, h) for q, k, v, h in kept if q == p], f"{KEEP_TOPIC}-{p} changed"

    # And takes new records after them.
    more = produce_keep_records(broker.bootstrap, 50, salt=2)
    with WireClient(broker.host, broker.port) as client:
        new_ends = [client.list_offset(KEEP_TOPIC, p, LATEST) for p in range(PARTITIONS)]
    read = consume_all(broker.bootstrap, KEEP_TOPIC, PARTITIONS, new_ends)
    assert len(read) == len(kept) + len(more)

    # Every partition of every topic reads through as valid batches.
    with WireClient(broker.host, broker.port) as client:
        topics = broker_topics(client)
        assert TARGET_TOPIC in topics and KEEP_TOPIC in topics
        counts: dict[tuple[str, int], int] = {}
        undecodable: list[str] = []
        for t, n in topics.items():
            for p in range(n):
                counts[(t, p)], problems = read_partition(client, t, p)
                undecodable += problems
        target_ends = [client.list_offset(TARGET_TOPIC, p, LATEST) for p in range(PARTITIONS)]
    print(f"fuzz: topics after the run {topics}")
    # What follows is gathered and reported together: each is a broker bug.
    findings: list[str] = []
    if undecodable:
        findings.append(
            f"{len(undecodable)} stored batch(es) whose records do not decode:\n"
            + "\n".join(undecodable[:5])
        )
    assert sum(counts[(TARGET_TOPIC, p)] for p in range(PARTITIONS)) > 0
    try:
        target = consume_all(broker.bootstrap, TARGET_TOPIC, PARTITIONS, target_ends)
        assert len(target) == sum(counts[(TARGET_TOPIC, p)] for p in range(PARTITIONS))
    except AssertionError as exc:
        findings.append(f"confluent-kafka cannot read {TARGET_TOPIC} through: {exc}")

    # Last (so that the checks above run whatever this finds): unhandled exceptions. Name
    # the requests that caused them (the connection's frames of that API) and keep the
    # bytes of every frame of those connections for reproduction.
    log_text = broker.log_path.read_text(errors="replace")
    failures = tracebacks(log_text)
    if failures or "Traceback" in log_text:
        by_port = {str(o.port): o for o in outcomes}
        keep = tmp_path / "fuzz-failures"
        keep.mkdir(exist_ok=True)
        report = []
        for i, (port, text) in enumerate(failures):
            outcome = by_port.get(port)
            api = re.search(r"(\w+) v(\d+) from", text)
            suspects = []
            if outcome is not None:
                for j, frame in enumerate(outcome.frames):
                    (keep / f"failure{i}-frame{j}-{frame.mutation}.bin").write_bytes(frame.data)
                    if frame.parses and api and frame.api == api.group(1):
                        suspects.append(
                            f"  frame {j}: {frame.seed} mutated by {frame.mutation}: "
                            f"{frame.data.hex()}"
                        )
            report.append(f"{text.strip()}\n" + "\n".join(suspects[:3]))
        findings.append(
            f"{len(failures)} unhandled exception(s) in the broker (frames kept in {keep}):\n"
            + "\n\n".join(report[:5])
            + ("" if failures else "\n" + log_text[log_text.index("Traceback") - 300 :][:3000])
        )
    assert not findings, "\n\n".join(findings)


# -- null where the schema says an array can never be null -----------------------------------


def _request(api_key: int, version: int, body: bytes, *, flexible: bool) -> bytes:
    header = struct.pack(">hhih", api_key, version, 77, 4) + b"null"
    return _with_size(header + (b"\x00" if flexible else b"") + body)


_NULL32 = struct.pack(">i", -1)
# Minimal requests, built by hand, whose array is null (length -1; 0 in compact form) where
# Kafka's schema does not allow null. Kafka refuses such a request ("non-nullable field ...
# was serialized as null"); it must never reach a handler as None.
NULL_ARRAYS = {
    "ListOffsets v1 topics": _request(2, 1, _NULL32 + _NULL32, flexible=False),
    "Produce v3 topic_data": _request(
        0, 3, struct.pack(">hhi", -1, 1, 1000) + _NULL32, flexible=False
    ),
    "Fetch v4 topics": _request(
        1, 4, struct.pack(">iiiib", -1, 0, 0, 1 << 20, 0) + _NULL32, flexible=False
    ),
    "CreateTopics v2 configs": _request(
        19,
        2,
        struct.pack(">ih", 1, 6)
        + b"nulled"
        + struct.pack(">ih", 1, 1)
        + struct.pack(">i", 0)
        + _NULL32
        + struct.pack(">ib", 5000, 0),
        flexible=False,
    ),
    "DescribeProducers v0 topics": _request(61, 0, b"\x00\x00", flexible=True),
}


def test_null_non_nullable_arrays_are_refused_not_crashed_on(
    brokers: Callable[[], BrokerProcess],
) -> None:
    """Each request on its own connection, followed by ApiVersions: the broker may answer it
    or close the connection, but no handler may fail on it (a traceback in the log)."""
    broker = brokers()
    with WireClient(broker.host, broker.port) as client:
        client.create_topic("nulls", 1)
    crashed = {}
    for name, frame in NULL_ARRAYS.items():
        before = broker.log_path.read_text(errors="replace")
        outcome = run_connection(broker.host, broker.port, [Frame(name, "null", frame, "ok", "")])
        after = broker.log_path.read_text(errors="replace")[len(before) :]
        if "Traceback" in after:
            crashed[name] = (frame.hex(), after.strip().splitlines()[-1])
        assert outcome.ending in ("survived", "closed")
    assert broker.running()
    # A null array where the schema allows it (all topics) is answered as usual.
    metadata_all = _request(3, 1, _NULL32, flexible=False)
    control = run_connection(
        broker.host, broker.port, [Frame("all", "none", metadata_all, "ok", "")]
    )
    assert control.ending == "survived" and control.responses == 2
    assert not crashed, "handlers crashed on null arrays:\n" + "\n".join(
        f"{name}: frame {hex_} -> {error}" for name, (hex_, error) in crashed.items()
    )


# -- record batches with a valid CRC whose records do not decode ------------------------------


def _corrupt(position: int, value: int) -> bytes:
    """A one-record batch (key b"k", value b"value") with one byte of its records block
    replaced and its CRC recomputed, so only decoding the records can tell."""
    batch = bytearray(make_batch([b"value"], key=b"k"))
    batch[position] = value
    struct.pack_into(">I", batch, CRC_OFFSET, compute_crc(batch, 0, len(batch)))
    return bytes(batch)


# Record 0 starts at 61: length, attributes, timestamp delta, offset delta, key length
# (zigzag varints), key, value length, value, header count (the last byte).
UNDECODABLE = {
    "key length past the record": _corrupt(65, 0x6E),
    "offset delta beyond the last offset delta": _corrupt(64, 0x02),
    "negative header count": _corrupt(-1, 0x49),
}


def test_produce_refuses_batches_whose_records_do_not_decode(
    brokers: Callable[[], BrokerProcess],
) -> None:
    """Kafka decodes every record of a produced batch (LogValidator) and refuses one that
    does not parse (CORRUPT_MESSAGE or INVALID_RECORD); a stored one would stop every
    consumer of the partition at that offset."""
    broker = brokers()
    stored = {}
    with WireClient(broker.host, broker.port) as client:
        client.create_topic("undecodable", len(UNDECODABLE))
        for partition, (name, batch) in enumerate(UNDECODABLE.items()):
            with pytest.raises(RecordsError):
                list(iter_records(batch))
            response = client.produce("undecodable", partition, batch, acks=1)
            end = client.list_offset("undecodable", partition, LATEST)
            if response.error_code not in (ErrorCode.CORRUPT_MESSAGE, ErrorCode.INVALID_RECORD):
                stored[name] = (response.error_code, end, batch.hex())
            else:
                assert end == 0
        # The same batch unharmed is accepted.
        assert client.produce("undecodable", 0, make_batch([b"value"], key=b"k")).error_code == 0
    assert not stored, "accepted batches whose records do not decode:\n" + "\n".join(
        f"{name}: error {code}, log end {end}, batch {hex_}"
        for name, (code, end, hex_) in stored.items()
    )
