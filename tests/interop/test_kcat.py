"""kcat (librdkafka bundled with kcat) against a real broker.

kcat has no admin commands: topics are created with confluent-kafka's admin client, or by
auto-creation on first produce. kcat reads and writes raw bytes, so records are framed with
delimiters on the way in (-K/-D) and with a length-prefixed format string on the way out (-f).
kcat sets no per-record timestamps and the same headers (-H) on every record of a run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Sequence
from itertools import groupby

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from interop_broker import BrokerProcess
from interop_data import CODECS, Got, Rec, assert_read_back, base_timestamp, make_records

KCAT = shutil.which("kcat") or "kcat"
# kcat keeps delimiters as C strings: no NUL byte in them.
KEY_DELIM = b"\x01<key>\x02"
MSG_DELIM = b"\x01<end>\x02"
# One line per record, then exactly key-length bytes of key and value-length bytes of value.
FORMAT = "@@%p|%o|%T|%K|%S|%h\n%k%s"
TIMEOUT = 30.0


# (bootstrap, broker pid) -> why kcat cannot talk to that broker, or "" when it can.
_reachability: dict[tuple[str, int | None], str] = {}


def require_reachable(broker: BrokerProcess) -> None:
    """Fails at once when kcat cannot even get metadata from the broker.

    Without this every kcat step would wait out its metadata timeout before failing.
    """
    key = (broker.bootstrap, broker.pid)
    if key not in _reachability:
        result = subprocess.run(
            [KCAT, "-b", broker.bootstrap, "-m", "5", "-L"], capture_output=True, timeout=TIMEOUT
        )
        _reachability[key] = (
            "" if result.returncode == 0 else result.stderr.decode(errors="replace")[-2000:]
        )
    if _reachability[key]:
        raise AssertionError(f"kcat cannot get metadata from the broker:\n{_reachability[key]}")


def kcat(broker: BrokerProcess, *args: str, stdin: bytes = b"") -> bytes:
    require_reachable(broker)
    result = subprocess.run(
        [KCAT, "-b", broker.bootstrap, "-m", "10", *args],
        input=stdin,
        capture_output=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == 0, (
        f"kcat {' '.join(args)} exited {result.returncode}:\n"
        + result.stderr.decode(errors="replace")[-3000:]
    )
    return result.stdout


def create_topic(broker: BrokerProcess, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(TIMEOUT)


def produce(
    broker: BrokerProcess,
    topic: str,
    records: Sequence[Rec],
    *options: str,
    headers: Sequence[tuple[str, bytes]] = (),
) -> None:
    """Writes `records` in order, one kcat run per partition and run of null-ness.

    kcat can send an empty key or value, or (with -Z) a null one, but not both in one run, so
    consecutive records that need -Z are sent by their own process.
    """
    header_args = [a for name, value in headers for a in ("-H", f"{name}={value.decode()}")]

    def needs_null(rec: Rec) -> bool:
        return rec.key is None or rec.value is None

    by_part = sorted(records, key=lambda r: r.partition)  # stable: keeps per-partition order
    for partition, in_partition in groupby(by_part, key=lambda r: r.partition):
        for with_null, run in groupby(in_partition, key=needs_null):
            chunk = list(run)
            body = b""
            for rec in chunk:
                key, value = rec.key or b"", rec.value or b""
                assert not with_null or (rec.key != b"" and rec.value != b""), rec
                assert KEY_DELIM not in key + value and MSG_DELIM not in key + value, rec
                body += key + KEY_DELIM + value + MSG_DELIM
            args = ["-P", "-t", topic, "-p", str(partition)]
            args += ["-K", _escape(KEY_DELIM), "-D", _escape(MSG_DELIM)]
            args += ["-Z"] if with_null else []
            kcat(broker, *args, *header_args, *options, stdin=body)


def _escape(delim: bytes) -> str:
    # kcat's delimiter syntax: \xNN for a byte, other characters as they are.
    return "".join(f"\\x{b:02x}" if b < 0x20 or b > 0x7E or b == 0x5C else chr(b) for b in delim)


def consume(
    broker: BrokerProcess, topic: str, partition: int, count: int, offset: str = "beginning"
) -> list[Got]:
    out = kcat(
        broker,
        *("-C", "-t", topic, "-p", str(partition), "-o", offset, "-c", str(count), "-e"),
        *("-f", FORMAT),
    )
    return parse(out)


def parse(out: bytes) -> list[Got]:
    got = []
    pos = 0
    while pos < len(out):
        assert out.startswith(b"@@", pos), f"bad kcat output at {pos}: {out[pos : pos + 60]!r}"
        end = out.index(b"\n", pos)
        fields = out[pos + 2 : end].split(b"|", 5)
        partition, offset, timestamp, key_len, value_len = (int(f) for f in fields[:5])
        headers = parse_headers(fields[5])
        pos = end + 1
        key = None if key_len < 0 else out[pos : pos + key_len]
        pos += max(key_len, 0)
        value = None if value_len < 0 else out[pos : pos + value_len]
        pos += max(value_len, 0)
        got.append(Got(partition, offset, timestamp, key, value, headers))
    return got


def parse_headers(text: bytes) -> tuple[tuple[str, bytes | None], ...]:
    if not text:
        return ()
    pairs = []
    for item in text.split(b","):
        name, _, value = item.partition(b"=")
        pairs.append((name.decode(), value))
    return tuple(pairs)


def test_metadata(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker, topic_name, 3)
    metadata = json.loads(kcat(broker, "-L", "-J", "-t", topic_name))
    assert [b["name"] for b in metadata["brokers"]] == [broker.bootstrap]
    node = metadata["brokers"][0]["id"]
    (topic,) = metadata["topics"]
    assert topic["topic"] == topic_name
    assert "error" not in topic
    assert sorted(p["partition"] for p in topic["partitions"]) == [0, 1, 2]
    for partition in topic["partitions"]:
        assert partition["leader"] == node
        assert [r["id"] for r in partition["replicas"]] == [node]
        assert [r["id"] for r in partition["isrs"]] == [node]


@pytest.mark.parametrize("idempotence", [False, True], ids=["plain", "idempotent"])
@pytest.mark.parametrize("codec", CODECS)
def test_produce_and_read_back(
    broker: BrokerProcess, topic_name: str, codec: str, idempotence: bool
) -> None:
    create_topic(broker, topic_name, 2)
    records = make_records(10, seed=21, partitions=2, headers=False)
    produce(
        broker,
        topic_name,
        records,
        *("-z", codec, "-X", f"enable.idempotence={str(idempotence).lower()}"),
    )
    got = consume(broker, topic_name, 0, 5) + consume(broker, topic_name, 1, 5)
    assert_read_back(records, got, check_timestamps=False)


def test_headers(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker, topic_name, 1)
    headers = (("trace", b"abc-123"), ("trace", b"second"), ("empty", b""))
    records = [Rec(b"k-%d" % i, b"v-%d" % i, headers) for i in range(3)]
    produce(broker, topic_name, records, headers=headers)
    assert_read_back(records, consume(broker, topic_name, 0, 3), check_timestamps=False)


def test_read_from_offset(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker, topic_name, 1)
    records = make_records(10, seed=22, headers=False)
    produce(broker, topic_name, records)
    got = consume(broker, topic_name, 0, 4, offset="6")
    assert_read_back(records[6:], got, first_offset=6, check_timestamps=False)


def test_query_offsets_by_timestamp(broker: BrokerProcess, topic_name: str) -> None:
    """kcat -Q is ListOffsets: a timestamp, or -1 for the end and -2 for the start."""
    create_topic(broker, topic_name, 1)
    records = make_records(8, seed=23, base_timestamp=base_timestamp())
    # kcat cannot set CreateTime; another librdkafka client writes the timestamps.
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for rec in records:
        producer.produce(
            topic_name, rec.value, rec.key, 0, timestamp=rec.timestamp, headers=list(rec.headers)
        )
    assert producer.flush(TIMEOUT) == 0
    target = records[5].timestamp
    assert target is not None

    def query(timestamp: int) -> int:
        answer = json.loads(kcat(broker, "-Q", "-J", "-t", f"{topic_name}:0:{timestamp}"))
        # {"<topic>": {"topic": "<topic>", "<partition>": {"partition": 0, "offset": N}}}
        return int(answer[topic_name]["0"]["offset"])

    assert query(target - 3) == 5
    assert query(target) == 5
    assert query(-2) == 0
    assert query(-1) == len(records)
    got = consume(broker, topic_name, 0, 3, offset=str(query(target)))
    assert [g.value for g in got] == [r.value for r in records[5:]]
    assert [g.timestamp for g in got] == [r.timestamp for r in records[5:]]


def test_produce_auto_creates_topic(broker: BrokerProcess, topic_name: str) -> None:
    """Like Kafka with auto.create.topics.enable=true (its default)."""
    records = [Rec(b"k-%d" % i, b"v-%d" % i) for i in range(3)]
    produce(broker, topic_name, records)
    metadata = json.loads(kcat(broker, "-L", "-J", "-t", topic_name))
    (topic,) = metadata["topics"]
    assert "error" not in topic
    assert len(topic["partitions"]) >= 1
    assert_read_back(records, consume(broker, topic_name, 0, 3), check_timestamps=False)
