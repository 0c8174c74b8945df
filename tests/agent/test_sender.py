"""The sender's answers to the broker's idempotence errors, against a scripted broker."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tidelog.agent.agent import parse_agent_config
from tidelog.agent.event import encode_body
from tidelog.agent.queue import ENTRY_SIZE, DiskQueue
from tidelog.agent.sender import Sender
from tidelog.client.errors import BrokerConnectionError
from tidelog.protocol import ApiKey, ErrorCode
from tidelog.records import decode_records, parse_header


class ScriptedBroker:
    """Answers Produce with the next scripted error code (NONE when the script is empty),
    InitProducerId with fresh ids, DescribeProducers with ``last_sequence``.

    As Kafka's idempotence does: a batch that repeats one written (same producer, same
    sequences; ``written``) is answered with its offset and not written again; any other
    batch whose sequences the producer has used already is OUT_OF_ORDER_SEQUENCE_NUMBER.
    """

    def __init__(
        self,
        produce_codes: list[ErrorCode],
        refuse: Callable[[bytes | None], bool] | None = None,
        name_refused: bool = True,
    ) -> None:
        self.produce_codes = produce_codes
        # Records whose value ``refuse`` picks make their batch fail with INVALID_TIMESTAMP,
        # naming them in record_errors when ``name_refused`` (as protocol v8+ brokers do).
        self.refuse = refuse
        self.name_refused = name_refused
        self.refusals = 0
        # Answers of written batches to lose (the connection breaks instead), and what
        # happens then.
        self.lose_answers = 0
        self.on_lost_answer: Callable[[], None] = lambda: None
        # What a lost answer becomes: a broken connection (None), or this partition error
        # (REQUEST_TIMED_OUT under acks=all, a failed fsync's KAFKA_STORAGE_ERROR...).
        self.lost_answer_code: ErrorCode | None = None
        # Batches of more records are refused MESSAGE_TOO_LARGE (max.message.bytes).
        self.max_records: int | None = None
        # Runs after a DescribeProducers is answered (what the broker then loses).
        self.on_describe: Callable[[], None] = lambda: None
        self.produced: list[bytes] = []
        self.next_id = 100
        self.last_sequence: dict[int, int] = {}
        # (producer id, first sequence, last sequence) -> base offset of each batch written
        self.written: dict[tuple[int, int, int], int] = {}
        self.offset = 0

    # the Connection and ClusterClient surface the sender uses
    metadata = SimpleNamespace(topic_id=lambda topic: None)

    def version(self, api_key: int) -> int:
        return 9

    def supports(self, api_key: int) -> bool:
        return True

    async def leader_connection(self, topic: str, partition: int) -> ScriptedBroker:
        return self

    async def any_connection(self) -> ScriptedBroker:
        return self

    async def forget(self, conn: object) -> None:
        pass

    async def call(self, api_key: int, values: dict[str, Any], version: int | None = None) -> Any:
        if api_key == ApiKey.INIT_PRODUCER_ID:
            self.next_id += 1
            return SimpleNamespace(error_code=0, producer_id=self.next_id, producer_epoch=0)
        if api_key == ApiKey.DESCRIBE_PRODUCERS:
            states = [
                SimpleNamespace(producer_id=pid, producer_epoch=0, last_sequence=seq)
                for pid, seq in self.last_sequence.items()
            ]
            self.on_describe()
            part = SimpleNamespace(partition_index=0, error_code=0, active_producers=states)
            return SimpleNamespace(topics=[SimpleNamespace(partitions=[part])])
        assert api_key == ApiKey.PRODUCE
        data = values["topic_data"][0]["partition_data"][0]["records"]
        code = self.produce_codes.pop(0) if self.produce_codes else ErrorCode.NONE
        refuse = self.refuse
        refused = (
            []
            if refuse is None
            else [i for i, r in enumerate(decode_records(data)) if refuse(r.value)]
        )
        if refused:
            self.refusals += 1
            named = [
                SimpleNamespace(batch_index=i, batch_index_error_message="out of range")
                for i in refused
            ]
            part = SimpleNamespace(
                index=0,
                error_code=int(ErrorCode.INVALID_TIMESTAMP),
                base_offset=-1,
                record_errors=named if self.name_refused else [],
                error_message="One or more records have been rejected due to invalid timestamp",
            )
            return SimpleNamespace(responses=[SimpleNamespace(partition_responses=[part])])
        base = -1
        header = parse_header(data)
        if self.max_records is not None and header.last_offset_delta + 1 > self.max_records:
            self.refusals += 1
            code = ErrorCode.MESSAGE_TOO_LARGE
        batch = (header.producer_id, header.base_sequence, header.last_sequence)
        if code is ErrorCode.NONE and batch in self.written:
            part = SimpleNamespace(index=0, error_code=0, base_offset=self.written[batch])
            return SimpleNamespace(responses=[SimpleNamespace(partition_responses=[part])])
        used = self.last_sequence.get(header.producer_id, -1)
        if code is ErrorCode.NONE and header.base_sequence <= used:
            code = ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        if code is ErrorCode.NONE:
            self.written[batch] = self.offset
            self.produced.append(data)
            self.last_sequence[header.producer_id] = header.base_sequence + header.last_offset_delta
            base = self.offset
            self.offset += header.last_offset_delta + 1
            if self.lose_answers:
                self.lose_answers -= 1
                self.on_lost_answer()
                if self.lost_answer_code is None:
                    raise BrokerConnectionError("the connection broke before the answer")
                code, base = self.lost_answer_code, -1
        part = SimpleNamespace(index=0, error_code=int(code), base_offset=base)
        return SimpleNamespace(responses=[SimpleNamespace(partition_responses=[part])])


class FakeAgent:
    def __init__(self, broker: ScriptedBroker) -> None:
        self.config = parse_agent_config(
            {
                "bootstrap.servers": "127.0.0.1:1",
                "data.dir": "x",
                "linger.ms": 0,
                "retry.backoff.ms": 1,
            }
        )
        self.cluster = broker

    async def refresh_topic(self, topic: str) -> None:
        pass

    def run_callbacks(self, *args: object) -> None:
        pass


async def deliver(sender: Sender, until: int) -> None:
    sender.start()
    # The sender's own position, not the cursor's: the cursor moves in the commit's worker
    # thread before the commit returns and the sender counts the batch.
    while sender.n < until:
        await asyncio.sleep(0.005)
    await sender.stop()


def fill(directory: Path, count: int) -> DiskQueue:
    queue = DiskQueue.open(directory)
    queue.append([encode_body(None, b"e%d" % i, None, 1) for i in range(count)])
    return queue


def values(broker: ScriptedBroker) -> list[bytes | None]:
    return [r.value for data in broker.produced for r in decode_records(data)]


def test_unknown_producer_id_takes_a_new_id_and_restarts_sequences(tmp_path: Path) -> None:
    broker = ScriptedBroker([ErrorCode.NONE, ErrorCode.UNKNOWN_PRODUCER_ID])
    queue = fill(tmp_path / "q", 3)
    sender = Sender(FakeAgent(broker), queue, "t", 0)  # type: ignore[arg-type]
    sender.batch_size = 1  # one event per batch
    asyncio.run(deliver(sender, 3))
    headers = [parse_header(d) for d in broker.produced]
    assert [(h.producer_id, h.base_sequence) for h in headers] == [(101, 0), (102, 0), (102, 1)]
    assert values(broker) == [b"e0", b"e1", b"e2"]
    queue.close()
    reopened = DiskQueue.open(tmp_path / "q")
    assert (reopened.cursor.producer_id, reopened.cursor.next_seq) == (102, 2)
    reopened.close()


def test_out_of_order_sequence_is_resolved_with_describe_producers(tmp_path: Path) -> None:
    """The broker already holds the first two events of the batch (a resend after a crash
    with other batch boundaries): only the rest is sent, under the same producer id."""
    broker = ScriptedBroker([ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER])
    queue = fill(tmp_path / "q", 5)
    queue.commit(0, 0, 0, 7, 0)
    broker.last_sequence[7] = 1
    sender = Sender(FakeAgent(broker), queue, "t", 0)  # type: ignore[arg-type]
    sender.must_resolve = False  # the crash check is what this test leaves out
    asyncio.run(deliver(sender, 5))
    assert values(broker) == [b"e2", b"e3", b"e4"]
    assert parse_header(broker.produced[0]).base_sequence == 2
    assert sender.duplicates_avoided == 2
    queue.close()


def test_restart_skips_what_the_broker_already_holds(tmp_path: Path) -> None:
    broker = ScriptedBroker([])
    queue = fill(tmp_path / "q", 10)
    queue.commit(0, 0, 0, 7, 0)
    broker.last_sequence[7] = 5  # events 0..5 arrived before the crash
    sender = Sender(FakeAgent(broker), queue, "t", 0)  # type: ignore[arg-type]
    assert sender.must_resolve
    asyncio.run(deliver(sender, 10))
    assert values(broker) == [b"e%d" % i for i in range(6, 10)]
    assert sender.duplicates_avoided == 6
    queue.close()


def test_a_gap_on_the_broker_takes_a_new_producer(tmp_path: Path) -> None:
    """The broker's last sequence is behind ours (it lost acknowledged batches): nothing
    can be matched, so the sender continues under a new producer id from sequence 0."""
    broker = ScriptedBroker([ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER])
    queue = fill(tmp_path / "q", 2)
    queue.commit(0, 0, 50, 7, 0)
    broker.last_sequence[7] = 10
    sender = Sender(FakeAgent(broker), queue, "t", 0)  # type: ignore[arg-type]
    sender.must_resolve = False
    asyncio.run(deliver(sender, 2))
    assert [
        (parse_header(d).producer_id, parse_header(d).base_sequence) for d in broker.produced
    ] == [(101, 0)]
    assert values(broker) == [b"e0", b"e1"]
    queue.close()


def test_refused_events_are_skipped_and_the_rest_delivered_in_order(tmp_path: Path) -> None:
    """Events the broker refuses as such (here INVALID_TIMESTAMP) can never be delivered: they
    are skipped, recorded as dropped, and everything else arrives once, in order, with
    consecutive sequences. Named refusals cost a round trip per run of them; unnamed ones
    are found by halving the batch."""
    bad = {1, 2, 3, 7, 12, 13}

    def refuse(value: bytes | None) -> bool:
        return value is not None and int(value[1:]) in bad

    for named in (True, False):
        broker = ScriptedBroker([], refuse=refuse, name_refused=named)
        queue = fill(tmp_path / f"q{named}", 16)
        sender = Sender(FakeAgent(broker), queue, "t", 0)  # type: ignore[arg-type]
        sender.must_resolve = False
        asyncio.run(deliver(sender, 16))
        assert values(broker) == [b"e%d" % i for i in range(16) if i not in bad]
        sequences = [parse_header(d).base_sequence for d in broker.produced]
        counts = [parse_header(d).last_offset_delta + 1 for d in broker.produced]
        assert sequences == [sum(counts[:i]) for i in range(len(counts))]
        assert sender.rejected == len(bad)
        assert [sender.offset_of(n)[0] for n in range(16)] == [
            "dropped" if n in bad else "delivered" for n in range(16)
        ]
        if named:
            # Refused: [0..15] (then [0] goes alone), [1..15] (1-3 skipped), [4..15] (then
            # [4..6]), [7..15] (7 skipped), [8..15] (then [8..11]), [12..15] (12-13 skipped);
            # [14, 15] goes.
            assert broker.refusals == 6
        else:
            assert broker.refusals > 6
        queue.close()
        # What was refused stays known as such after a restart.
        reopened = DiskQueue.open(tmp_path / f"q{named}")
        assert reopened.cursor.read_n == 16
        assert sorted(n for f, e in reopened.dropped_ranges for n in range(f, e)) == sorted(bad)
        assert reopened.dropped == 0  # drop-oldest's counter: nothing dropped for space
        reopened.close()


@pytest.mark.parametrize(
    "lost_as",
    [
        None,
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        ErrorCode.KAFKA_STORAGE_ERROR,
        # An acks=all request waiting for its replicas when leadership moves, or the
        # partition goes: answered so after the append.
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ],
    ids=[
        "connection",
        "timed-out",
        "not-enough-replicas-after-append",
        "storage-error",
        "not-leader",
        "unknown-partition",
    ],
)
def test_a_refused_resend_of_a_batch_in_doubt_asks_what_the_broker_holds(
    tmp_path: Path, lost_as: ErrorCode | None
) -> None:
    """A batch is written but its answer lost (the connection broke, or the broker answered
    an error after the append); its resend is refused, because the broker checks records
    before it looks for a duplicate (the event has aged past the topic's
    message.timestamp.before.max.ms meanwhile). The broker holds the first attempt: the
    events are delivered (offset unknown), not refused, and the next events get the next
    sequences, not the ones already used."""
    aged: set[bytes | None] = set()
    broker = ScriptedBroker([], refuse=lambda value: value in aged)
    broker.lose_answers = 1
    broker.lost_answer_code = lost_as
    broker.on_lost_answer = lambda: aged.add(b"e0")
    queue = fill(tmp_path / "q", 3)
    sender = Sender(FakeAgent(broker), queue, "t", 0)  # type: ignore[arg-type]
    sender.batch_size = 1  # one event per batch
    asyncio.run(deliver(sender, 3))
    assert broker.refusals == 1
    assert values(broker) == [b"e0", b"e1", b"e2"]
    assert [parse_header(d).base_sequence for d in broker.produced] == [0, 1, 2]
    assert sender.rejected == 0
    assert [sender.offset_of(n) for n in range(3)] == [
        ("delivered", -1),
        ("delivered", 1),
        ("delivered", 2),
    ]
    queue.close()


def test_a_new_producer_id_is_used_only_once_persisted(tmp_path: Path) -> None:
    """The cursor write that persists a new producer id fails: that id is not used (a batch
    sent under it would be sent again under another after a restart); the next one is."""
    broker = ScriptedBroker([])
    queue = fill(tmp_path / "q", 2)
    real_commit = queue.commit
    failures = [1]

    def commit(*args: Any, **kwargs: Any) -> None:
        if failures[0]:
            failures[0] -= 1
            raise OSError(5, "Input/output error")
        real_commit(*args, **kwargs)

    queue.commit = commit  # type: ignore[method-assign]
    sender = Sender(FakeAgent(broker), queue, "t", 0)  # type: ignore[arg-type]
    asyncio.run(deliver(sender, 2))
    assert {parse_header(d).producer_id for d in broker.produced} == {102}
    queue.close()
    reopened = DiskQueue.open(tmp_path / "q")
    assert reopened.cursor.producer_id == 102
    reopened.close()


def test_events_in_doubt_get_their_offsets_from_a_repeat_of_the_broker_batch(
    tmp_path: Path,
) -> None:
    """After a crash, the broker says it holds the first two events (its batch at offset
    40): they are sent again as exactly that batch, which the broker answers with its
    offsets instead of writing it twice."""
    broker = ScriptedBroker([])
    broker.last_sequence[7] = 1
    broker.written[(7, 0, 1)] = 40
    broker.offset = 42
    queue = fill(tmp_path / "q", 5)
    queue.commit(0, 0, 0, 7, 0)
    sender = Sender(FakeAgent(broker), queue, "t", 0)  # type: ignore[arg-type]
    assert sender.must_resolve
    asyncio.run(deliver(sender, 5))
    assert values(broker) == [b"e2", b"e3", b"e4"]
    assert [sender.offset_of(n) for n in range(5)] == [("delivered", 40 + n) for n in range(5)]
    assert sender.duplicates_avoided == 2
    queue.close()


def test_events_in_doubt_the_broker_loses_after_saying_it_holds_them_are_written(
    tmp_path: Path,
) -> None:
    """The broker says it holds the first two events, then loses them (a failover before
    they were replicated, a crash before its fsync): taken at its word, they would be lost;
    sent again as the repeat of that batch, they are written."""
    broker = ScriptedBroker([])
    broker.last_sequence[7] = 1

    def failover() -> None:
        broker.last_sequence.clear()

    broker.on_describe = failover
    queue = fill(tmp_path / "q", 5)
    queue.commit(0, 0, 0, 7, 0)
    sender = Sender(FakeAgent(broker), queue, "t", 0)  # type: ignore[arg-type]
    asyncio.run(deliver(sender, 5))
    assert values(broker) == [b"e%d" % i for i in range(5)]
    assert [sender.offset_of(n) for n in range(5)] == [("delivered", n) for n in range(5)]
    queue.close()


def test_a_duplicate_answer_to_a_resend_counts_its_events_once(tmp_path: Path) -> None:
    broker = ScriptedBroker([ErrorCode.NONE, ErrorCode.DUPLICATE_SEQUENCE_NUMBER])
    broker.lose_answers = 1  # written, answer lost: the resend is answered as a duplicate
    queue = fill(tmp_path / "q", 4)
    sender = Sender(FakeAgent(broker), queue, "t", 0)  # type: ignore[arg-type]
    asyncio.run(deliver(sender, 4))
    assert values(broker) == [b"e0", b"e1", b"e2", b"e3"]
    assert (sender.delivered, sender.duplicates_avoided) == (4, 4)
    queue.close()


def test_a_batch_too_large_is_halved_and_the_count_that_fits_kept(tmp_path: Path) -> None:
    """The topic takes 4 events per batch: found by halving once, not for every batch."""
    broker = ScriptedBroker([])
    broker.max_records = 4
    queue = fill(tmp_path / "q", 64)
    sender = Sender(FakeAgent(broker), queue, "t", 0)  # type: ignore[arg-type]
    asyncio.run(deliver(sender, 64))
    assert values(broker) == [b"e%d" % i for i in range(64)]
    assert broker.refusals == 4  # 64 -> 32 -> 16 -> 8 -> 4
    assert sender.rejected == 0
    queue.close()


def test_batches_are_capped_by_max_request_size(tmp_path: Path) -> None:
    broker = ScriptedBroker([])
    agent = FakeAgent(broker)
    agent.config = {**agent.config, "batch.size": 1 << 30, "max.request.size": 1000}
    queue = DiskQueue.open(tmp_path / "q")
    events = [b"e%d-" % i + bytes(100) for i in range(100)]  # 12 kB in all
    queue.append([encode_body(None, value, None, 1) for value in events])
    sender = Sender(agent, queue, "t", 0)  # type: ignore[arg-type]
    asyncio.run(deliver(sender, 100))
    assert len(broker.produced) > 10
    assert max(len(data) for data in broker.produced) <= 1000 + 200  # one event may pass it
    assert values(broker) == events
    queue.close()


def test_events_the_broker_holds_up_to_inside_damaged_data_are_not_sent_again(
    tmp_path: Path,
) -> None:
    """After a crash the broker holds entries 0..14 of the queue's producer; entries 10..19
    were damaged on disk since. The held ones count as delivered, the damaged rest is
    dropped, and sending goes on at entry 20 with the next sequence: nothing twice."""
    queue = fill(tmp_path / "q", 30)
    queue.commit(0, 0, 0, 7, 0)  # producer 7 persisted, nothing acknowledged yet
    entries = queue.read(0, 0, 1 << 20)
    start = entries[10].position
    end = entries[19].position + ENTRY_SIZE + len(entries[19].body)
    queue.close()
    (segment,) = (tmp_path / "q").glob("*.q")
    with segment.open("r+b") as f:
        f.seek(start)
        f.write(b"\xff" * (end - start))
    queue = DiskQueue.open(tmp_path / "q")
    broker = ScriptedBroker([])
    broker.last_sequence[7] = 14
    sender = Sender(FakeAgent(broker), queue, "t", 0)  # type: ignore[arg-type]
    asyncio.run(deliver(sender, 30))
    assert values(broker) == [b"e%d" % i for i in range(20, 30)]
    assert [
        (parse_header(d).producer_id, parse_header(d).base_sequence) for d in broker.produced
    ] == [(7, 15)]
    assert [sender.offset_of(n)[0] for n in (0, 14, 15, 19, 20)] == [
        "delivered",
        "delivered",
        "dropped",
        "dropped",
        "delivered",
    ]
    queue.close()
