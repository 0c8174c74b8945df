"""The producer's accumulator, back-pressure, partitioning and idempotent sequencing.

The broker here is a fake cluster in memory (:class:`FakeCluster`): it keeps each partition's
log, applies Kafka's idempotent-producer rules (duplicates of the last five batches answered
with their original offsets, sequence gaps -> OUT_OF_ORDER_SEQUENCE_NUMBER, stale epoch ->
INVALID_PRODUCER_EPOCH, unknown producers accepted at any sequence) and can be told to lose a
request before or after applying it, to answer with an error, or to answer requests out of
order.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import random
import socket
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tidelog.client import ClientError, ConfigError, Producer
from tidelog.client.aio import AIOProducer
from tidelog.client.aio.producer import (
    BufferExhaustedError,
    BufferMemory,
    DeliveryFuture,
    _Batch,
    _outside,
    _Part,
    _RunOutcomes,
)
from tidelog.client.cluster import BrokerInfo, ClusterMetadata, PartitionInfo, TopicInfo
from tidelog.client.errors import BrokerConnectionError
from tidelog.client.partitioner import partition_for_key
from tidelog.client.types import TopicPartition
from tidelog.protocol import ApiKey, ErrorCode
from tidelog.records import BatchBuilder, Compression, decode_records, parse_header

# -- the record encoder ----------------------------------------------------------------------


record_st = st.tuples(
    st.one_of(st.none(), st.binary(max_size=300)),
    st.one_of(st.none(), st.binary(max_size=20_000)),
    st.lists(
        st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=8))), max_size=3
    ),
    st.integers(-(2**40), 2**40),
)


@settings(max_examples=60, deadline=None)
@given(records=st.lists(record_st, min_size=1, max_size=30), base=st.integers(0, 2**42))
def test_batch_bytes_equal_the_records_builder(
    records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]],
    base: int,
) -> None:
    """The producer's own per-record encoder writes the very bytes BatchBuilder writes."""
    from tidelog.client.aio.producer import _encode_headers

    ours = _Batch(TopicPartition("t", 0), 0.0)
    reference = BatchBuilder(producer_id=7, producer_epoch=3, base_sequence=11)
    for key, value, headers, delta in records:
        ts = base + delta
        ours.add(
            key,
            value,
            ts,
            DeliveryFuture(),
            None,
            _encode_headers(tuple(headers)) if headers else b"\x00",
        )
        reference.append(key, value, headers, timestamp=ts)
    ours.seal(Compression.NONE, None)
    assert ours.frame(Compression.NONE, 7, 3, 11) == reference.close()


@settings(max_examples=60, deadline=None)
@given(
    runs=st.lists(
        st.tuples(
            st.integers(-(2**33), 2**33),
            st.lists(st.one_of(st.none(), st.binary(max_size=300)), min_size=1, max_size=90),
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_keyless_records_handed_over_plain_encode_like_the_builder(
    runs: list[tuple[int, list[bytes | None]]],
) -> None:
    """Records added as the synchronous producer's plain hand-over adds them (values and
    futures only, one timestamp per run) encode to BatchBuilder's bytes: values of mixed
    and equal lengths, missing values, offset deltas on both sides of 64."""
    batch = _Batch(TopicPartition("t", 0), 0.0)
    reference = BatchBuilder(producer_id=1, producer_epoch=0, base_sequence=0)
    for timestamp, values in runs:
        batch.stamp_from_here(timestamp)
        for value in values:
            batch.values.append(value)
            batch.sinks.append(DeliveryFuture())
            reference.append(None, value, [], timestamp=timestamp)
    batch.seal(Compression.NONE, None)
    assert batch.frame(Compression.NONE, 1, 0, 0) == reference.close()


@pytest.mark.parametrize("keyed", [False, True])
def test_large_batches_encode_across_every_offset_delta_size(keyed: bool) -> None:
    """Offset deltas of one, two and three varint bytes and beyond the varint table, in runs
    of several timestamps, with equal and varied value lengths; without keys (the encoder's
    per-length path) and with a few (its general path)."""
    batch = _Batch(TopicPartition("t", 0), 0.0)
    reference = BatchBuilder()
    count = 17_000
    for i in range(count):
        timestamp = 5_000 + i // 3_000
        value = b"" if i % 5000 < 4000 else bytes([i % 251]) * (i % 9)
        key = b"k" if keyed and 16_500 <= i < 16_510 else None
        batch.add(key, value, timestamp, DeliveryFuture(), None)
        reference.append(key, value, [], timestamp=timestamp)
    batch.seal(Compression.NONE, None)
    ours = batch.frame(Compression.NONE, -1, -1, -1)
    assert ours == reference.close()
    decoded = decode_records(ours)
    assert len(decoded) == count and decoded[-1].timestamp == 5_000 + (count - 1) // 3_000


@pytest.mark.parametrize("codec", list(Compression))
def test_compressed_batches_decode(codec: Compression) -> None:
    batch = _Batch(TopicPartition("t", 0), 0.0)
    values = [bytes([i]) * (i * 7) for i in range(50)]
    for i, value in enumerate(values):
        batch.add(str(i).encode(), value, 1000 + i, DeliveryFuture(), None)
    batch.seal(codec, None)
    data = batch.frame(codec, 1, 0, 5)
    header = parse_header(data)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (1, 0, 5)
    decoded = decode_records(data)
    assert [r.value for r in decoded] == values
    assert [r.key for r in decoded] == [str(i).encode() for i in range(50)]
    assert [r.timestamp for r in decoded] == [1000 + i for i in range(50)]


def test_restamping_changes_only_the_producer_fields() -> None:
    batch = _Batch(TopicPartition("t", 0), 0.0)
    batch.add(b"k", b"v", 5, DeliveryFuture(), None)
    batch.seal(Compression.GZIP, None)
    first = batch.frame(Compression.GZIP, 9, 0, 40)
    again = batch.frame(Compression.GZIP, 9, 1, 0)
    assert first[61:] == again[61:]
    assert decode_records(again)[0].value == b"v"  # the CRC was recomputed
    assert parse_header(again).producer_epoch == 1


# -- a fake cluster ----------------------------------------------------------------------------


class FakeBroker:
    """Partition logs with Kafka's idempotence checks; ``fault`` decides each request's fate."""

    def __init__(self, partitions: int = 3) -> None:
        self.partitions = partitions
        self.logs: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
        # partition -> producer id -> (epoch, [(first_seq, last_seq, base_offset)] last 5)
        self.state: dict[int, dict[int, tuple[int, list[tuple[int, int, int]]]]] = {
            p: {} for p in range(partitions)
        }
        self.next_pid = 1000
        self.requests = 0
        self.init_calls: list[tuple[int, int]] = []
        # fault(request_index) -> "ok" | "lose-before" | "lose-after" | ErrorCode | "slow"
        self.fault: Callable[[int], Any] = lambda i: "ok"
        self.refusing: ErrorCode | None = None
        # True: an error fate answers one request only (tests of one error); False: every
        # request until the client refreshes its metadata (a leader that moved).
        self.refuse_once = True

    def init_producer_id(self, pid: int, epoch: int) -> Any:
        self.init_calls.append((pid, epoch))
        if pid >= 0:
            new = (pid, epoch + 1)
        else:
            self.next_pid += 1
            new = (self.next_pid, 0)
        return SimpleNamespace(error_code=0, producer_id=new[0], producer_epoch=new[1])

    def append(self, partition: int, data: bytes) -> tuple[ErrorCode, int]:
        h = parse_header(data)
        log = self.logs[partition]
        if h.producer_id < 0:
            log.append(data)
            return ErrorCode.NONE, len(log) - 1
        first, last = h.base_sequence, h.base_sequence + h.record_count - 1
        entry = self.state[partition].get(h.producer_id)
        if entry is not None:
            epoch, batches = entry
            if h.producer_epoch < epoch:
                return ErrorCode.INVALID_PRODUCER_EPOCH, -1
            if h.producer_epoch == epoch:
                for f, l_, offset in batches:
                    if (f, l_) == (first, last):
                        return ErrorCode.NONE, offset
                if first != batches[-1][1] + 1:
                    return ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, -1
            elif first != 0:
                return ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, -1
            else:
                batches = []
        else:
            batches = []
        offset = sum(parse_header(b).record_count for b in log)
        log.append(data)
        batches = [*batches, (first, last, offset)][-5:]
        self.state[partition][h.producer_id] = (h.producer_epoch, batches)
        return ErrorCode.NONE, offset

    def values(self, partition: int) -> list[bytes | None]:
        return [r.value for data in self.logs[partition] for r in decode_records(data)]


class FakeConnection:
    """One connection: requests are applied in the order they are sent, as a Kafka broker
    does per connection; once lost, every later request on it fails unapplied."""

    def __init__(self, broker: FakeBroker) -> None:
        self.broker = broker
        self.usable = True

    def version(self, api_key: int) -> int:
        return 9 if api_key == ApiKey.PRODUCE else 4

    async def call(self, api_key: int, values: Any, **kwargs: Any) -> Any:
        broker = self.broker
        if not self.usable:
            raise BrokerConnectionError("connection closed")
        if api_key == ApiKey.INIT_PRODUCER_ID:
            return broker.init_producer_id(values["producer_id"], values["producer_epoch"])
        assert api_key == ApiKey.PRODUCE
        index = broker.requests
        broker.requests += 1
        fate = broker.fault(index)
        if fate == "lose-before":
            self.usable = False
            raise BrokerConnectionError("lost before the broker read it")
        if isinstance(fate, ErrorCode):
            # The leader moved away until the client looks at the metadata again.
            broker.refusing = fate
        answers = []
        for topic in values["topic_data"]:
            parts = []
            for p in topic["partition_data"]:
                if broker.refusing is not None:
                    code, offset = broker.refusing, -1
                else:
                    code, offset = broker.append(p["index"], p["records"])
                parts.append(
                    SimpleNamespace(
                        index=p["index"],
                        error_code=int(code),
                        base_offset=offset,
                        log_append_time=None,
                        error_message=None,
                    )
                )
            answers.append(SimpleNamespace(name=topic["name"], partition_responses=parts))
        if broker.refusing is not None and broker.refuse_once:
            broker.refusing = None
        # "slow": answered after requests sent later (applied in order all the same).
        await asyncio.sleep(0.003 if fate == "slow" else 0)
        if fate == "lose-after":
            self.usable = False
        if not self.usable:
            raise BrokerConnectionError("lost after the broker wrote it")
        return SimpleNamespace(responses=answers)


class FakeCluster:
    def __init__(self, broker: FakeBroker, topic: str = "t") -> None:
        self.broker = broker
        self.conn = FakeConnection(broker)
        parts = tuple(PartitionInfo(topic, p, 1, 0, (1,), (1,)) for p in range(broker.partitions))
        self.metadata = ClusterMetadata(
            cluster_id="fake",
            controller_id=1,
            brokers={1: BrokerInfo(1, "fake", 1)},
            topics={topic: TopicInfo(topic, None, False, parts)},
        )

    async def connection(self, node_id: int) -> FakeConnection:
        if not self.conn.usable:
            self.conn = FakeConnection(self.broker)
        return self.conn

    async def refresh(self, *args: Any, **kwargs: Any) -> dict[str, ErrorCode]:
        self.broker.refusing = None
        return {}

    def stale(self) -> bool:
        return False

    async def forget(self, conn: Any) -> None:
        conn.usable = False

    async def close(self) -> None:
        pass


def make_producer(broker: FakeBroker, **config: Any) -> AIOProducer:
    settings_ = {
        "bootstrap.servers": "fake:1",
        "linger.ms": 0,
        "retry.backoff.ms": 0,
        **config,
    }
    producer = AIOProducer(settings_)
    producer.cluster = FakeCluster(broker)  # type: ignore[assignment]
    return producer


# -- sequencing --------------------------------------------------------------------------------

FATES = st.sampled_from(
    ["ok", "ok", "ok", "slow", "lose-before", "lose-after", ErrorCode.NOT_LEADER_OR_FOLLOWER]
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    fates=st.lists(FATES, min_size=1, max_size=60),
    count=st.integers(1, 300),
    batch_size=st.sampled_from([150, 300]),
)
# A slow answer, then later batches of its partition acknowledged and one more request whose
# answer is lost: unless the producer keeps the partition's unanswered batch among the last
# five it numbered, the broker no longer knows it when it is re-sent.
@example(
    fates=["slow", "ok", "ok", "ok", "lose-after", "ok", "ok", "ok"], count=161, batch_size=300
)
@example(
    fates=["slow", "ok", "ok", "ok", "lose-after", "ok", "ok", "ok"], count=161, batch_size=150
)
def test_idempotent_stream_survives_lost_duplicated_and_reordered_answers(
    fates: list[Any], count: int, batch_size: int
) -> None:
    """Whatever happens to requests and answers, each partition's log holds every record once,
    in send order, and every future reports the offset the record has in that log."""
    broker = FakeBroker()
    broker.refuse_once = False
    broker.fault = lambda i: fates[i] if i < len(fates) else "ok"

    async def run() -> list[Any]:
        producer = make_producer(broker, **{"batch.size": batch_size})
        futures = []
        for i in range(count):
            futures.append(producer.send("t", f"{i}".encode(), key=f"k{i % 7}".encode()))
            if i % 25 == 0:
                await asyncio.sleep(0)
        await producer.flush()
        results = [f.result() for f in futures]
        await producer.close()
        return results

    results = asyncio.run(run())
    expected: dict[int, list[bytes]] = {p: [] for p in range(3)}
    for i in range(count):
        expected[partition_for_key(f"k{i % 7}".encode(), 3)].append(f"{i}".encode())
    for p in range(3):
        assert broker.values(p) == expected[p]
    for i, md in enumerate(results):
        assert md.partition == partition_for_key(f"k{i % 7}".encode(), 3)
        assert broker.values(md.partition)[md.offset] == f"{i}".encode()


def test_up_to_five_batches_in_flight_per_partition() -> None:
    broker = FakeBroker(partitions=1)
    seen: list[int] = []

    async def run() -> None:
        producer = make_producer(broker, **{"batch.size": 100, "linger.ms": 50})
        original = FakeConnection.call

        async def call(self: FakeConnection, api_key: int, values: Any, **kw: Any) -> Any:
            if api_key == ApiKey.PRODUCE:
                seen.append(len(producer._states[TopicPartition("t", 0)].in_flight))
                await asyncio.sleep(0.01)
            return await original(self, api_key, values, **kw)

        producer.cluster.conn.call = call.__get__(producer.cluster.conn)  # type: ignore[attr-defined]
        futures = [producer.send("t", b"x" * 60, partition=0) for _ in range(40)]
        await producer.flush()
        assert all(f.result().offset == i for i, f in enumerate(futures))
        await producer.close()

    asyncio.run(run())
    assert max(seen) == 5
    assert broker.values(0) == [b"x" * 60] * 40


def test_sequence_numbers_continue_per_partition() -> None:
    broker = FakeBroker(partitions=2)

    async def run() -> None:
        producer = make_producer(broker, **{"batch.size": 200})
        for i in range(30):
            producer.send("t", b"%d" % i, partition=i % 2)
        await producer.flush()
        await producer.close()

    asyncio.run(run())
    for p in range(2):
        headers = [parse_header(b) for b in broker.logs[p]]
        seq = 0
        for h in headers:
            assert h.producer_id == 1001 and h.producer_epoch == 0
            assert h.base_sequence == seq
            seq += h.record_count
        assert seq == 15


def test_sequences_go_on_after_a_partition_was_idle() -> None:
    """A partition with nothing pending keeps its next sequence: starting again at 0 would
    look like a repeat of an earlier batch to the broker, which would drop it as a duplicate."""
    broker = FakeBroker(partitions=1)

    async def run() -> None:
        producer = make_producer(broker)
        for i in range(4):
            md = await producer.send("t", b"%d" % i, partition=0)
            assert md.offset == i
            await asyncio.sleep(0.01)  # the sender runs with nothing pending
        await producer.close()

    asyncio.run(run())
    assert broker.values(0) == [b"0", b"1", b"2", b"3"]
    assert [parse_header(b).base_sequence for b in broker.logs[0]] == [0, 1, 2, 3]


def test_out_of_order_for_the_next_sequence_bumps_the_epoch_and_resends() -> None:
    """The broker lost our state (OUT_OF_ORDER for the very batch it expects): the producer
    bumps its epoch, restarts at sequence 0 and delivers everything."""
    broker = FakeBroker(partitions=1)
    broker.fault = lambda i: ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER if i == 1 else "ok"

    async def run() -> None:
        producer = make_producer(broker)
        first = producer.send("t", b"a", partition=0)
        await first
        second = producer.send("t", b"b", partition=0)
        assert (await second).offset == 1
        assert producer.producer_epoch == 1
        await producer.close()

    asyncio.run(run())
    assert broker.init_calls == [(-1, -1), (1001, 0)]
    last = parse_header(broker.logs[0][-1])
    assert (last.producer_epoch, last.base_sequence) == (1, 0)
    assert broker.values(0) == [b"a", b"b"]


@pytest.mark.parametrize("code", [ErrorCode.UNKNOWN_PRODUCER_ID, ErrorCode.INVALID_PRODUCER_EPOCH])
def test_producer_id_errors_bump_the_epoch(code: ErrorCode) -> None:
    broker = FakeBroker(partitions=1)
    broker.fault = lambda i: code if i == 0 else "ok"

    async def run() -> None:
        producer = make_producer(broker)
        assert (await producer.send("t", b"a", partition=0)).offset == 0
        await producer.close()

    asyncio.run(run())
    assert broker.init_calls == [(-1, -1), (1001, 0)]
    assert broker.values(0) == [b"a"]


def test_a_failed_sent_batch_resets_the_sequences() -> None:
    """A batch that fails for good leaves a gap in the sequences; the producer bumps its epoch
    so that the next batches do not stall behind it."""
    broker = FakeBroker(partitions=1)
    broker.fault = lambda i: ErrorCode.INVALID_RECORD if i == 1 else "ok"

    async def run() -> None:
        producer = make_producer(broker)
        assert (await producer.send("t", b"a", partition=0)).offset == 0
        with pytest.raises(ClientError) as info:
            await producer.send("t", b"bad", partition=0)
        assert info.value.code is ErrorCode.INVALID_RECORD
        assert (await producer.send("t", b"good", partition=0)).offset == 1
        await producer.close()

    asyncio.run(run())
    assert broker.values(0) == [b"a", b"good"]
    last = parse_header(broker.logs[0][-1])
    assert (last.producer_epoch, last.base_sequence) == (1, 0)


def test_duplicate_sequence_number_counts_as_success() -> None:
    broker = FakeBroker(partitions=1)
    broker.fault = lambda i: ErrorCode.DUPLICATE_SEQUENCE_NUMBER if i == 0 else "ok"

    async def run() -> None:
        producer = make_producer(broker)
        await producer.send("t", b"a", partition=0)
        await producer.close()

    asyncio.run(run())


def test_delivery_timeout_fails_with_a_clear_error() -> None:
    broker = FakeBroker(partitions=1)
    broker.fault = lambda i: ErrorCode.NOT_LEADER_OR_FOLLOWER

    async def run() -> None:
        producer = make_producer(
            broker, **{"delivery.timeout.ms": 80, "retry.backoff.ms": 5, "request.timeout.ms": 50}
        )
        future = producer.send("t", b"a", partition=0)
        with pytest.raises(ClientError, match=r"delivery\.timeout\.ms=80") as info:
            await future
        assert info.value.code in (ErrorCode.REQUEST_TIMED_OUT, ErrorCode.NOT_LEADER_OR_FOLLOWER)
        await producer.close()

    asyncio.run(run())
    assert broker.values(0) == []


def test_retries_bound_the_resends() -> None:
    broker = FakeBroker(partitions=1)
    broker.fault = lambda i: ErrorCode.NOT_LEADER_OR_FOLLOWER

    async def run() -> None:
        producer = make_producer(broker, retries=2, **{"enable.idempotence": False, "acks": 1})
        with pytest.raises(ClientError) as info:
            await producer.send("t", b"a", partition=0)
        assert info.value.code is ErrorCode.NOT_LEADER_OR_FOLLOWER
        await producer.close()

    asyncio.run(run())
    assert broker.requests == 3


def test_non_idempotent_batches_carry_no_producer_id() -> None:
    broker = FakeBroker(partitions=1)

    async def run() -> None:
        producer = make_producer(broker, acks=1)
        assert not producer.idempotent  # idempotence is a default, quietly off with acks=1
        await producer.send("t", b"a", partition=0)
        await producer.close()

    asyncio.run(run())
    assert broker.init_calls == []
    assert parse_header(broker.logs[0][0]).producer_id == -1


def test_explicit_idempotence_with_conflicting_settings_is_refused() -> None:
    with pytest.raises(ConfigError, match="acks must be all"):
        AIOProducer({"bootstrap.servers": "x:1", "enable.idempotence": True, "acks": 1})
    with pytest.raises(ConfigError, match="at most 5"):
        AIOProducer(
            {
                "bootstrap.servers": "x:1",
                "enable.idempotence": "true",
                "max.in.flight.requests.per.connection": 6,
            }
        )
    assert AIOProducer({"bootstrap.servers": "x:1"}).idempotent


# -- accumulator -----------------------------------------------------------------------------


def test_batches_respect_batch_size_and_linger() -> None:
    broker = FakeBroker(partitions=1)

    async def run() -> None:
        producer = make_producer(broker, **{"batch.size": 1000, "linger.ms": 30_000})
        futures = [producer.send("t", b"v" * 100, partition=0) for _ in range(25)]
        await asyncio.sleep(0.05)
        # Full batches left at once; the last, partly filled one lingers.
        full = len(broker.logs[0])
        assert full >= 2 and all(f.done() for f in futures[: full * 7])
        assert not futures[-1].done()
        assert await producer.flush() == 0
        assert futures[-1].done()
        await producer.close()

    asyncio.run(run())
    sizes = [len(b) for b in broker.logs[0]]
    assert max(sizes) <= 1000
    assert sum(parse_header(b).record_count for b in broker.logs[0]) == 25


def test_sticky_partition_moves_when_a_batch_is_full() -> None:
    broker = FakeBroker(partitions=4)

    async def run() -> list[int]:
        producer = make_producer(broker, **{"batch.size": 500, "linger.ms": 30_000})
        futures = [producer.send("t", b"v" * 100) for _ in range(40)]
        await producer.flush()
        partitions = [(await f).partition for f in futures]
        await producer.close()
        return partitions

    partitions = asyncio.run(run())
    runs = [partitions[0]]
    for p in partitions[1:]:
        if p != runs[-1]:
            runs.append(p)
    # Records stay on one partition for a whole batch (4 records of ~121 bytes fit in 500),
    # and each switch goes to another partition.
    assert len(runs) >= 5
    for p in set(partitions):
        assert partitions.count(p) >= 3
    for a, b in itertools.pairwise(runs):
        assert a != b


def test_custom_partitioner_and_serializers() -> None:
    broker = FakeBroker(partitions=3)
    calls: list[tuple[str, bytes | None, bytes | None, int]] = []

    def partitioner(topic: str, key: bytes | None, value: bytes | None, n: int) -> int:
        calls.append((topic, key, value, n))
        return len(value or b"") % n

    async def run() -> None:
        producer = make_producer(
            broker,
            **{
                "partitioner.class": partitioner,
                "key.serializer": lambda k: str(k).encode(),
                "value.serializer": lambda v: v.upper(),
            },
        )
        md = await producer.send("t", "abcd", key=42)
        assert md.partition == 4 % 3
        await producer.close()

    asyncio.run(run())
    assert calls == [("t", b"42", b"ABCD", 3)]
    assert broker.values(1) == [b"ABCD"]


def test_keys_go_where_the_java_client_puts_them() -> None:
    broker = FakeBroker(partitions=3)

    async def run() -> None:
        producer = make_producer(broker)
        for i in range(30):
            md = await producer.send("t", b"v", key=b"key-%d" % i)
            assert md.partition == partition_for_key(b"key-%d" % i, 3)
        await producer.close()

    asyncio.run(run())


# -- back-pressure -----------------------------------------------------------------------------


def test_buffer_memory_blocks_then_raises() -> None:
    memory = BufferMemory(1000)
    memory.reserve(900, 1)
    with pytest.raises(BufferExhaustedError, match=r"max\.block\.ms=50"):
        memory.reserve(200, 0.05)
    assert memory.used == 900
    released = threading.Timer(0.02, memory.release, (900,))
    released.start()
    memory.reserve(200, 5)  # unblocked by the release
    released.join()
    assert memory.used == 200


def test_buffer_memory_admits_one_oversized_record_when_empty() -> None:
    memory = BufferMemory(100)
    assert memory.try_reserve(500)
    assert not memory.try_reserve(1)


def test_buffer_memory_async_waiter_is_woken() -> None:
    async def run() -> None:
        memory = BufferMemory(100)
        assert memory.try_reserve(100)
        asyncio.get_running_loop().call_later(0.01, memory.release, 100)
        await memory.reserve_async(50, 5)
        assert memory.used == 50

    asyncio.run(run())


def test_sync_send_blocks_on_a_full_buffer_and_raises_after_max_block() -> None:
    """Nothing is ever acknowledged (a broker that never answers): once buffer.memory is
    used up, send waits max.block.ms and then raises, and the records already queued are not
    lost from view."""
    # It accepts connections (the kernel does) and never answers: the producer's metadata
    # request for the topic is still waiting when the blocked send gives up. (A refused
    # connection would instead fail the queued records after max.block.ms, freeing the
    # buffer at the very moment the blocked send's own max.block.ms runs out.)
    silent = socket.create_server(("127.0.0.1", 0))
    producer = Producer(
        {
            "bootstrap.servers": f"127.0.0.1:{silent.getsockname()[1]}",
            "buffer.memory": 2000,
            "max.block.ms": 100,
            "delivery.timeout.ms": 60_000,
        }
    )
    try:
        sent = [producer.send("t", b"x" * 100) for _ in range(16)]
        with pytest.raises(BufferExhaustedError, match=r"buffer\.memory=2000"):
            for _ in range(10):
                producer.send("t", b"x" * 100)
        assert not any(f.done() for f in sent)
    finally:
        producer.close(timeout=0)
        silent.close()
    for future in sent:
        with pytest.raises(ClientError):
            future.result(timeout=5)


# -- DeliveryFuture --------------------------------------------------------------------------


def test_delivery_future_behaves_like_a_future() -> None:
    future: concurrent.futures.Future[Any] = DeliveryFuture()
    seen: list[Any] = []
    future.add_done_callback(lambda f: seen.append(f.result()))
    waiter = concurrent.futures.ThreadPoolExecutor(1).submit(future.result, 5)
    time.sleep(0.01)
    future.set_result(42)
    assert waiter.result(5) == 42
    assert seen == [42]
    with pytest.raises(concurrent.futures.InvalidStateError):
        future.set_result(1)
    failed = DeliveryFuture()
    done, _ = concurrent.futures.wait([failed, future], timeout=0)
    assert done == {future}
    failed.set_exception(ValueError("x"))
    assert isinstance(failed.exception(), ValueError)
    # A delivery is under way from the start: the future cannot be cancelled.
    running = DeliveryFuture()
    assert running.running() and not running.cancel() and not running.cancelled()


def test_many_threads_wait_on_delivery_futures() -> None:
    futures: list[concurrent.futures.Future[Any]] = [DeliveryFuture() for _ in range(200)]
    rng = random.Random(5)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        waits = [pool.submit(f.result, 10) for f in futures]
        order = list(range(200))
        rng.shuffle(order)
        for i in order:
            futures[i].set_result(i)
        assert [w.result(10) for w in waits] == list(range(200))


# -- plain records in runs ---------------------------------------------------------------------
# The synchronous ``send`` of a record that is only a topic and a ``bytes`` value appends it to
# a *run* (``AIOProducer.plain_sender``); the loop moves runs into batches by slices, and an
# acknowledged (or failed) batch settles each part of a run it holds once, not each future.
# Driven from the loop's own thread; what is checked is what a user sees.

# An operation: ("plain", value length, callback number) | ("keyed", key number) | ("yield",)
# | ("wait",)
op_st = st.one_of(
    st.tuples(st.just("plain"), st.integers(0, 120), st.integers(0, 2)),
    st.tuples(st.just("keyed"), st.integers(0, 6)),
    st.tuples(st.just("yield")),
    st.tuples(st.just("wait")),
)


def _sender(producer: AIOProducer) -> Callable[..., DeliveryFuture]:
    """The producer's plain sender, for records it must take."""
    send_plain = producer.plain_sender(asyncio.get_running_loop())

    def send(topic: str, value: bytes, on_delivery: Any = None) -> DeliveryFuture:
        future = send_plain(topic, value, on_delivery=on_delivery)
        assert future is not None
        return future

    return send


def _built(future: Any) -> bool:
    return bool(getattr(future, "_DeliveryFuture__built", False))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(op_st, min_size=1, max_size=120),
    batch_size=st.sampled_from([200, 700, 16_384]),
    linger=st.sampled_from([0, 2]),
)
def test_runs_keep_order_and_every_future_its_offset(
    ops: list[tuple[Any, ...]], batch_size: int, linger: int
) -> None:
    """Plain records (in runs, split over batches of any size) mixed with keyed ones (the
    general path, which ends the current run): each partition's log holds the records in send
    order, each future gives the offset of its record there, and a future someone waited on
    (built as a standard Future while pending) gets the same answer; each record's
    on_delivery (none, or one of two) is called once, with that answer."""
    broker = FakeBroker()
    calls: dict[int, list[Any]] = {1: [], 2: []}
    callbacks: dict[int, Any] = {
        n: (lambda error, md, n=n: calls[n].append((error, md))) for n in calls
    }

    async def run() -> tuple[list[tuple[bytes | None, int | None, Any]], int]:
        producer = make_producer(broker, **{"batch.size": batch_size, "linger.ms": linger})
        loop = asyncio.get_running_loop()
        send_plain = _sender(producer)
        sent: list[tuple[bytes | None, int | None, Any]] = []
        waited: list[concurrent.futures.Future[Any]] = []
        for n, op in enumerate(ops):
            if op[0] == "plain":
                value = n.to_bytes(2, "big") * (op[1] // 2 + 1)
                sent.append((value, op[2], send_plain("t", value, callbacks.get(op[2]))))
            elif op[0] == "keyed":
                # As the synchronous send hands a general record over: after the run.
                key, value, headers, size = producer.prepare(
                    "t", b"k%d" % n, b"key%d" % op[1], None, None
                )
                assert key is not None
                general = DeliveryFuture()
                item = ("t", key, value, headers, None, None, None, general, size)
                producer.hand_over(loop, item, size)
                sent.append((value, -1 - partition_for_key(key, 3), general))
            elif op[0] == "yield":
                await asyncio.sleep(0)
            elif sent and isinstance(sent[-1][2], DeliveryFuture):
                # Someone waits on it: it becomes a standard Future while (likely) pending.
                concurrent.futures.wait([sent[-1][2]], timeout=0)
                waited.append(sent[-1][2])
        left = await producer.flush()
        await producer.close()
        for future in waited:
            assert _built(future)
        return sent, left

    sent, left = asyncio.run(run())
    assert left == 0
    logs = {p: broker.values(p) for p in range(3)}
    position = dict.fromkeys(range(3), -1)
    expected_calls: dict[int, list[Any]] = {1: [], 2: []}
    for value, how, future in sent:
        md = future.result(0)
        assert md.topic == "t"
        if how is not None and how < 0:  # keyed: the key's partition
            assert md.partition == -1 - how
        elif how:
            expected_calls[how].append((None, md))
        assert logs[md.partition][md.offset] == value
        assert md.offset > position[md.partition]  # send order within the partition
        position[md.partition] = md.offset
        assert md.timestamp > 0
    assert sum(len(log) for log in logs.values()) == len(sent)
    for n in calls:  # each callback's calls in send order within each partition
        assert sorted(calls[n], key=lambda c: (c[1].partition, c[1].offset)) == sorted(
            expected_calls[n], key=lambda c: (c[1].partition, c[1].offset)
        )


def test_plain_futures_are_settled_without_being_touched() -> None:
    """An acknowledged run costs its futures nothing: they stay bare, and answer from their
    run's parts."""
    broker = FakeBroker(partitions=1)

    futures: list[Any] = []

    async def run() -> None:
        producer = make_producer(broker, **{"batch.size": 2_000})
        send_plain = _sender(producer)
        futures.extend(send_plain("t", b"%03d" % i) for i in range(300))
        assert all(not f.done() and f.running() for f in futures)
        await producer.flush()
        await producer.close()

    # (Not the coroutine's result: asyncio may show a finished task's result, and the repr
    # of a DeliveryFuture is the standard Future's.)
    asyncio.run(run())
    assert len(broker.logs[0]) > 1  # the run was split over several batches
    assert [f.result().offset for f in futures] == list(range(300))
    assert all(f.done() and not f.running() and f.exception() is None for f in futures)
    assert not any(_built(f) for f in futures)
    assert broker.values(0) == [b"%03d" % i for i in range(300)]


def test_a_callback_per_record_is_called_for_that_record() -> None:
    """Plain records each with its own on_delivery (a closure per record, as a perf tool
    passes; some with none) are split over batches like any run: each callback is called
    once, with its own record's offset."""
    broker = FakeBroker(partitions=1)
    calls: dict[int, list[tuple[Any, int]]] = {}

    def callback_for(i: int) -> Any:
        def delivered(error: Any, md: Any) -> None:
            calls.setdefault(i, []).append((error, md.offset))

        return delivered

    async def run() -> None:
        producer = make_producer(broker, **{"batch.size": 2_000})
        send_plain = _sender(producer)
        for i in range(300):
            send_plain("t", b"%03d" % i, None if i % 7 == 3 else callback_for(i))
        await producer.flush()
        await producer.close()

    asyncio.run(run())
    assert len(broker.logs[0]) > 1  # the records were split over several batches
    assert broker.values(0) == [b"%03d" % i for i in range(300)]
    assert calls == {i: [(None, i)] for i in range(300) if i % 7 != 3}


def test_waiting_futures_of_a_run_are_woken_by_their_part() -> None:
    """Futures of a run that became standard Futures (a thread blocked in result(), a done
    callback) are settled when the batch holding them is, with their own offsets."""
    broker = FakeBroker(partitions=1)
    seen: list[int] = []

    async def run() -> list[Any]:
        producer = make_producer(broker, **{"batch.size": 1_000, "linger.ms": 5})
        send_plain = _sender(producer)
        futures = [send_plain("t", b"v%d" % i) for i in range(100)]
        futures[3].add_done_callback(lambda f: seen.append(f.result().offset))
        pool = concurrent.futures.ThreadPoolExecutor(2)
        waits = [pool.submit(futures[i].result, 10) for i in (0, 57, 99)]
        await producer.flush()
        await producer.close()
        answers = [w.result(10) for w in waits]
        pool.shutdown()
        return answers

    answers = asyncio.run(run())
    assert [md.offset for md in answers] == [0, 57, 99]
    assert seen == [3]


def test_a_failed_batch_fails_every_future_of_its_parts() -> None:
    """A batch refused for good fails the futures of its runs, bare or waiting."""
    broker = FakeBroker(partitions=1)
    broker.fault = lambda i: ErrorCode.CORRUPT_MESSAGE

    futures: list[DeliveryFuture] = []

    errors: list[Any] = []

    def on_delivery(error: Any, md: Any) -> None:
        errors.append((error.code, md))

    async def run() -> None:
        producer = make_producer(broker, **{"retries": 0, "enable.idempotence": False})
        send_plain = _sender(producer)
        futures.extend(
            send_plain("t", b"x%d" % i, on_delivery if i % 2 else None) for i in range(50)
        )
        concurrent.futures.wait([futures[10]], timeout=0)  # built while pending
        await producer.flush()
        await producer.close()

    asyncio.run(run())
    for future in futures:
        assert future.done()
        error = future.exception(0)
        assert isinstance(error, ClientError) and error.code is ErrorCode.CORRUPT_MESSAGE
    assert _built(futures[10])
    assert errors == [(ErrorCode.CORRUPT_MESSAGE, None)] * 25


def test_plain_records_of_an_unknown_topic_take_the_general_path() -> None:
    """Without the topic's metadata a run's records go the general way (waiting for it) and
    fail alone after max.block.ms, each future with the error."""
    broker = FakeBroker()

    futures: list[DeliveryFuture] = []

    async def run() -> None:
        producer = make_producer(broker, **{"max.block.ms": 50})
        send_plain = _sender(producer)
        futures.extend(send_plain("nowhere", b"x") for _ in range(5))
        ok = send_plain("t", b"y")
        await producer.flush(5)
        assert ok.result(0).offset == 0
        await producer.close()

    asyncio.run(run())
    for future in futures:
        assert isinstance(future.exception(0), ClientError)


def test_plain_sender_declines_what_it_cannot_take() -> None:
    """A value too large for one request, or a topic that is not a non-empty str: None (the
    caller takes the general path, which reports the problem)."""

    async def run() -> None:
        producer = make_producer(FakeBroker(), **{"max.request.size": 1_000})
        send_plain = producer.plain_sender(asyncio.get_running_loop())
        assert send_plain("t", b"x" * 1_000) is None
        assert send_plain("", b"x") is None
        assert send_plain(b"t", b"x") is None  # type: ignore[arg-type]
        assert producer.buffer.used == 0
        await producer.close()

    asyncio.run(run())


@given(
    parts=st.lists(st.tuples(st.integers(0, 5), st.integers(1, 5)), max_size=6),
    tail=st.integers(0, 5),
)
def test_outside_lists_the_indices_no_part_holds(parts: list[tuple[int, int]], tail: int) -> None:
    owner = _RunOutcomes()
    held: list[_Part] = []
    at = 0
    covered: set[int] = set()
    for gap, size in parts:
        at += gap
        held.append(_Part(owner, 0, size, at))
        covered.update(range(at, at + size))
        at += size
    count = at + tail
    assert _outside(held, count) == [i for i in range(count) if i not in covered]


def test_run_outcomes_lookup() -> None:
    """A record's outcome is its part's, at its index in the batch; records of no part yet,
    or of a part not settled, are pending."""
    outcomes = _RunOutcomes()
    first = outcomes.add(0, 4, 10)
    outcomes.add(4, 6, 0)
    assert outcomes.lookup(2)[0] is outcomes.lookup(7)[0]  # both pending
    marker = object()
    first.outcome = marker
    assert outcomes.lookup(2) == (marker, 12)
    assert outcomes.lookup(5)[0] is not marker
    assert outcomes.lookup(6)[0] is not marker  # beyond the last part


def test_plain_sender_passes_other_records_on_and_refuses_once_closed() -> None:
    """Anything but a plain record goes to ``general`` with send()'s arguments, in order;
    after refuse_sends() every send raises ClientClosedError."""
    passed: list[tuple[Any, ...]] = []

    def general(*args: Any) -> DeliveryFuture:
        passed.append(args)
        return DeliveryFuture()

    async def run() -> None:
        producer = make_producer(FakeBroker())
        send = producer.plain_sender(asyncio.get_running_loop(), general)
        send("t", b"v", b"k")
        send("t", "text")
        send("t", b"v", partition=1, timestamp=5)
        send("t", b"v", headers=[("h", b"1")])
        assert isinstance(send("t", b"v"), DeliveryFuture)  # plain: not passed on
        producer.refuse_sends()
        for args in (("t", b"v"), ("t", b"v", b"k")):
            with pytest.raises(ClientError, match="closed"):
                send(*args)
        await producer.close()

    asyncio.run(run())
    assert passed == [
        ("t", b"v", b"k", None, None, None, None),
        ("t", "text", None, None, None, None, None),
        ("t", b"v", None, None, 1, 5, None),
        ("t", b"v", None, [("h", b"1")], None, None, None),
    ]


def test_sync_send_is_the_fast_sender_unless_overridden() -> None:
    """A Producer's send is the core's sender (one call per record), documented as send; a
    subclass's own send is kept."""
    silent = socket.create_server(("127.0.0.1", 0))
    config = {"bootstrap.servers": f"127.0.0.1:{silent.getsockname()[1]}"}

    class Counting(Producer):
        calls = 0

        def send(self, *args: Any, **kwargs: Any) -> Any:
            Counting.calls += 1
            return super().send(*args, **kwargs)

    plain, counting = Producer(config), Counting(config)
    try:
        assert plain.send.__name__ == "send" and plain.send.__doc__ == Producer.send.__doc__
        assert plain.send("t", b"x").running()
        assert counting.send("t", b"x").running() and Counting.calls == 1
    finally:
        plain.close(timeout=0)
        counting.close(timeout=0)
        silent.close()
    with pytest.raises(ClientError, match="closed"):
        plain.send("t", b"x")


def test_every_future_of_runs_waited_on_gets_its_own_answer() -> None:
    """concurrent.futures.wait() on all the futures of several runs while they are pending
    (each becomes a standard Future waiting for its part): each is settled once, with its own
    offset, whether its part holds fewer or more records than are waiting."""
    broker = FakeBroker(partitions=1)
    futures: list[DeliveryFuture] = []

    async def run() -> None:
        producer = make_producer(broker, **{"batch.size": 3_000, "linger.ms": 5})
        send_plain = _sender(producer)
        for n in range(4):
            futures.extend(send_plain("t", b"%04d" % i) for i in range(n * 500, n * 500 + 500))
            await asyncio.sleep(0)  # a new run each time
        assert concurrent.futures.wait(futures, timeout=0).done == set()
        await producer.flush()
        await producer.close()

    asyncio.run(run())
    assert len(concurrent.futures.wait(futures, timeout=5).done) == 2000
    assert [f.result().offset for f in futures] == list(range(2000))
    assert broker.values(0) == [b"%04d" % i for i in range(2000)]
