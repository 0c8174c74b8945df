"""The partition leader's side of transactions: producer state with ongoing transactions,
COMMIT/ABORT markers, the last stable offset, the aborted-transaction index, read_committed
Fetch and ListOffsets, WriteTxnMarkers, KIP-890 produce checks, and all of it across
restarts, truncation and retention."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tidelog.broker.broker import Broker
from tidelog.broker.handlers.produce import handle_produce
from tidelog.broker.handlers.txn_markers import TxnMarker, apply_txn_markers
from tidelog.broker.partitions import Partition, PartitionError, Partitions
from tidelog.broker.reply import Deferred
from tidelog.protocol import ApiKey, ErrorCode
from tidelog.records import BatchBuilder, iter_batches, iter_records
from tidelog.records.control import parse_end_txn_marker
from tidelog.storage import LogConfig, LogManager
from tidelog.storage.txn_index import ENTRY_SIZE, AbortedTxn

from .conftest import context, produce_request, run
from .test_fetch_helpers import Want, call, fetch, fetch_request, make, module

A, B, C = 7001, 7002, 7003


def txn_batch(pid: int, seq: int, n: int = 2, *, epoch: int = 0, tag: bytes = b"") -> bytes:
    """A transactional batch as a producer sends it, built with the project's builder."""
    builder = BatchBuilder(transactional=True)
    builder.set_producer(pid, epoch, seq)
    for i in range(n):
        builder.append(b"k", tag + b"%d" % (seq + i), timestamp=1_700_000_000_000)
    return builder.close()


def plain_batch(n: int = 3, tag: bytes = b"p") -> bytes:
    builder = BatchBuilder()
    for i in range(n):
        builder.append(b"k", tag + b"%d" % i, timestamp=1_700_000_000_000)
    return builder.close()


def open_partition(broker: Broker, topic: str = "t", config: LogConfig | None = None) -> Partition:
    return broker.partitions.ensure(
        topic, 0, config=config or LogConfig(), topic_id=None, leader_epoch=0
    )


def append(partition: Partition, data: bytes) -> tuple[int, int]:
    info = partition.append(bytearray(data))
    return info.first_offset, info.last_offset


def index_entries(partition: Partition) -> list[AbortedTxn]:
    return [entry for segment in partition.log.segments for entry in segment.txn_index.entries]


def values_read_committed(broker: Broker, topic: str = "t") -> tuple[Any, list[bytes]]:
    """One read_committed Fetch from 0 filtered as a consumer does: the response partition
    and the values a read_committed consumer would deliver."""
    response, _ = fetch(broker, fetch_request(broker, 12, [Want(topic)], isolation_level=1))
    (part,) = response.responses[0].partitions
    aborted = {(int(a.producer_id), int(a.first_offset)) for a in part.aborted_transactions}
    data = bytes(part.records or b"")
    dropping: set[int] = set()
    values: list[bytes] = []
    for position, header in iter_batches(data):
        pid = header.producer_id
        if header.is_control:
            dropping.discard(pid)
            continue
        if header.is_transactional and any(
            p == pid and first <= header.base_offset for p, first in aborted
        ):
            dropping.add(pid)
            aborted = {(p, f) for p, f in aborted if not (p == pid and f <= header.base_offset)}
        if pid in dropping:
            continue
        values.extend(r.value or b"" for r in iter_records(data, position, header=header))
    return part, values


# -- LSO, markers, index --------------------------------------------------------------------


def test_an_ongoing_transaction_holds_the_lso_and_its_commit_releases_it(broker: Broker) -> None:
    partition = open_partition(broker)
    append(partition, plain_batch())  # 0-2
    assert partition.last_stable_offset == 3
    append(partition, txn_batch(A, 0))  # 3-4
    append(partition, plain_batch())  # 5-7
    assert partition.high_watermark == 8
    assert partition.last_stable_offset == 3
    assert partition.producers.ongoing == {A: 3}
    marker = partition.append_txn_marker(A, 0, 5, True, 1_700_000_000_000)
    assert marker == 8
    assert partition.last_stable_offset == partition.high_watermark == 9
    assert partition.producers.ongoing == {}
    assert index_entries(partition) == []  # commits are not indexed
    data = partition.log.read_bytes(8, 1 << 20)
    (position, header), *_ = list(iter_batches(data))
    assert header.is_control and header.is_transactional and header.producer_id == A
    (record,) = list(iter_records(data, position, header=header))
    assert parse_end_txn_marker(record.key, record.value) == (True, 5, 0)


def test_an_abort_is_indexed_with_the_lso_of_the_other_open_transactions(broker: Broker) -> None:
    partition = open_partition(broker)
    append(partition, txn_batch(A, 0))  # 0-1
    append(partition, txn_batch(B, 0, n=3))  # 2-4
    append(partition, txn_batch(A, 2))  # 5-6, same transaction of A
    assert partition.last_stable_offset == 0
    assert partition.append_txn_marker(A, 0, 1, False, 1) == 7
    assert partition.last_stable_offset == 2  # B still open
    assert index_entries(partition) == [AbortedTxn(A, 0, 7, 2)]
    partition.append_txn_marker(B, 0, 1, True, 1)  # 8
    assert partition.last_stable_offset == 9
    assert partition.aborted_transactions(0, 9) == [(A, 0)]
    assert partition.aborted_transactions(8, 9) == []  # the range starts after the marker
    files = list(partition.log.directory.glob("*.txnindex"))
    assert [f.stat().st_size for f in files] == [ENTRY_SIZE]


def test_marker_checks_follow_kafka(broker: Broker) -> None:
    partition = open_partition(broker)
    append(partition, txn_batch(A, 0, epoch=3))
    with pytest.raises(PartitionError) as stale:
        partition.append_txn_marker(A, 2, 0, True, 1)
    assert stale.value.code is ErrorCode.INVALID_PRODUCER_EPOCH
    partition.append_txn_marker(A, 3, 4, False, 1)  # coordinator epoch 4 now known
    append(partition, txn_batch(A, 2, epoch=3))
    with pytest.raises(PartitionError) as fenced:
        partition.append_txn_marker(A, 3, 3, True, 1)
    assert fenced.value.code is ErrorCode.TRANSACTION_COORDINATOR_FENCED
    assert fenced.value.api_error.code is ErrorCode.TRANSACTION_COORDINATOR_FENCED
    assert partition.producers.ongoing == {A: 3}  # refused markers end nothing
    end = partition.log.log_end_offset
    # A producer with no transaction here: the marker is written, ends and indexes nothing.
    assert partition.append_txn_marker(B, 0, 0, False, 1) == end
    assert partition.log.log_end_offset == end + 1
    assert index_entries(partition) == [AbortedTxn(A, 0, 2, 3)]
    assert partition.last_stable_offset == 3


def test_apply_txn_markers_answers_per_partition(broker: Broker) -> None:
    partition = open_partition(broker)
    append(partition, txn_batch(A, 0))
    results = apply_txn_markers(
        broker,
        [
            TxnMarker(A, 0, 0, False, [("t", 0), ("t", 1), ("missing", 0)]),
            TxnMarker(B, 0, 0, True, [("t", 0)]),
        ],
    )
    assert results == [
        {
            ("t", 0): ErrorCode.NONE,
            ("t", 1): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            ("missing", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        },
        {("t", 0): ErrorCode.NONE},
    ]
    assert partition.last_stable_offset == partition.log.log_end_offset == 4
    assert index_entries(partition) == [AbortedTxn(A, 0, 2, 3)]
    (same_epoch,) = apply_txn_markers(broker, [TxnMarker(A, 0, 0, True, [("t", 0)])])
    assert same_epoch == {("t", 0): ErrorCode.NONE}  # an equal epoch passes (Kafka's TV1 rule)


@pytest.mark.parametrize("version", [1, 2])
def test_write_txn_markers_api(broker: Broker, version: int) -> None:
    partition = open_partition(broker)
    append(partition, txn_batch(A, 0))
    schema = module("write_txn_markers", version)
    request = schema.WriteTxnMarkersRequest(
        markers=(
            make(
                schema.WritableTxnMarker,
                producer_id=A,
                producer_epoch=0,
                transaction_result=False,
                coordinator_epoch=2,
                topics=(
                    schema.WritableTxnMarkerTopic(name="t", partition_indexes=(0, 3)),
                    schema.WritableTxnMarkerTopic(name="nope", partition_indexes=(0,)),
                ),
            ),
            make(
                schema.WritableTxnMarker,
                producer_id=A,
                producer_epoch=0,
                transaction_result=True,
                coordinator_epoch=1,
                topics=(schema.WritableTxnMarkerTopic(name="t", partition_indexes=(0,)),),
            ),
        )
    )
    response = call(broker, ApiKey.WRITE_TXN_MARKERS, request)
    codes = [
        [
            (t.name, int(p.partition_index), p.error_code.value)
            for t in m.topics
            for p in t.partitions
        ]
        for m in response.markers
    ]
    assert [int(m.producer_id) for m in response.markers] == [A, A]
    assert codes == [
        [("t", 0, 0), ("t", 3, 3), ("nope", 0, 3)],
        [("t", 0, int(ErrorCode.TRANSACTION_COORDINATOR_FENCED))],
    ]
    assert index_entries(partition) == [AbortedTxn(A, 0, 2, 3)]
    assert partition.log.recovery_point >= 3  # answered only once the marker was fsynced


# -- produce: KIP-890 checks ----------------------------------------------------------------


class Verifier:
    """A coordinator's answer: the partitions in each producer's ongoing transaction."""

    def __init__(self) -> None:
        self.members: set[tuple[int, int, str, int]] = set()
        self.calls: list[tuple[str | None, int, int, str, int]] = []

    def verify(
        self, transactional_id: str | None, producer_id: int, epoch: int, topic: str, index: int
    ) -> ErrorCode:
        self.calls.append((transactional_id, producer_id, epoch, topic, index))
        if (producer_id, epoch, topic, index) in self.members:
            return ErrorCode.NONE
        return ErrorCode.INVALID_TXN_STATE


def produce(broker: Broker, data: bytes, txn_id: str | None = "tx") -> Any:
    async def go() -> Any:
        reply = await handle_produce(
            context(broker, ApiKey.PRODUCE, 9),
            produce_request(9, {"t": {0: data}}, acks=-1, transactional_id=txn_id),
        )
        return await reply.waiter if isinstance(reply, Deferred) else reply

    return run(go()).responses[0].partition_responses[0]


def test_transactional_produce_is_refused_without_a_coordinator(broker: Broker) -> None:
    partition = open_partition(broker)
    refused = produce(broker, txn_batch(A, 0))
    assert refused.error_code == ErrorCode.INVALID_TXN_STATE
    assert partition.log.log_end_offset == 0


def test_a_transactional_batch_needs_a_producer_id(broker: Broker) -> None:
    partition = open_partition(broker)
    broker.transaction_verifier = Verifier()
    builder = BatchBuilder(transactional=True)
    builder.append(b"k", b"v", timestamp=1_700_000_000_000)
    refused = produce(broker, builder.close())
    assert refused.error_code == ErrorCode.INVALID_RECORD
    assert partition.log.log_end_offset == 0


def test_kip_890_checks_on_the_produce_path(broker: Broker) -> None:
    partition = open_partition(broker)
    verifier = Verifier()
    broker.transaction_verifier = verifier
    # Not added to the transaction: refused before anything else.
    assert produce(broker, txn_batch(A, 0)).error_code == ErrorCode.INVALID_TXN_STATE
    verifier.members.add((A, 0, "t", 0))
    assert produce(broker, txn_batch(A, 0)).base_offset == 0
    assert produce(broker, txn_batch(A, 2)).base_offset == 2
    assert len(verifier.calls) == 2  # the ongoing transaction needs no second verification
    assert verifier.calls[-1] == ("tx", A, 0, "t", 0)
    assert partition.last_stable_offset == 0
    # A non-transactional batch of a producer in a transaction.
    plain = BatchBuilder()
    plain.set_producer(A, 0, 4)
    plain.append(b"k", b"x", timestamp=1_700_000_000_000)
    assert produce(broker, plain.close(), None).error_code == ErrorCode.INVALID_TXN_STATE
    partition.append_txn_marker(A, 0, 0, True, 1)
    verifier.members.clear()
    # A late batch of the ended transaction cannot start a new one (KAFKA-17754).
    assert produce(broker, txn_batch(A, 4)).error_code == ErrorCode.INVALID_TXN_STATE
    verifier.members.add((A, 0, "t", 0))
    assert produce(broker, txn_batch(A, 4)).base_offset == 5
    # An older epoch, and a first batch of an unknown producer past sequence 0.
    verifier.members.add((B, 0, "t", 0))
    assert produce(broker, txn_batch(B, 5)).error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    partition.append_txn_marker(A, 1, 0, False, 1)  # the coordinator bumped A's epoch
    verifier.members.add((A, 0, "t", 0))
    assert produce(broker, txn_batch(A, 6)).error_code == ErrorCode.INVALID_PRODUCER_EPOCH
    assert partition.last_stable_offset == partition.high_watermark


# -- read_committed Fetch and ListOffsets ---------------------------------------------------


def test_read_committed_fetch_stops_at_the_lso_and_lists_aborted_transactions(
    broker: Broker,
) -> None:
    partition = open_partition(broker)
    append(partition, plain_batch(2, b"a"))  # 0-1
    append(partition, txn_batch(A, 0, tag=b"aborted"))  # 2-3
    append(partition, txn_batch(B, 0, tag=b"committed"))  # 4-5
    partition.append_txn_marker(A, 0, 0, False, 1)  # 6
    append(partition, txn_batch(C, 0, tag=b"open"))  # 7-8
    partition.append_txn_marker(B, 0, 0, True, 1)  # 9
    append(partition, plain_batch(1, b"z"))  # 10
    part, values = values_read_committed(broker)
    assert part.last_stable_offset == 7 and part.high_watermark == 11
    assert [(int(a.producer_id), int(a.first_offset)) for a in part.aborted_transactions] == [
        (A, 2)
    ]
    assert values == [b"a0", b"a1", b"committed0", b"committed1"]
    last = list(iter_batches(bytes(part.records)))[-1][1]
    assert last.next_offset == 7  # nothing at or past the LSO
    uncommitted, _ = fetch(broker, fetch_request(broker, 12, [Want("t")]))
    (plain,) = uncommitted.responses[0].partitions
    assert plain.aborted_transactions is None
    assert plain.last_stable_offset == 7
    assert list(iter_batches(bytes(plain.records)))[-1][1].next_offset == 11
    partition.append_txn_marker(C, 0, 0, True, 1)
    part, values = values_read_committed(broker)
    assert part.last_stable_offset == part.high_watermark == 12
    assert values[-3:] == [b"open0", b"open1", b"z0"]


def test_list_offsets_read_committed_latest_is_the_lso(broker: Broker) -> None:
    partition = open_partition(broker)
    append(partition, plain_batch())
    append(partition, txn_batch(A, 0))
    schema = module("list_offsets", 5)

    def latest(isolation: int) -> int:
        import datetime

        from kio.static.primitive import i32Timedelta

        request = make(
            schema.ListOffsetsRequest,
            replica_id=-1,
            isolation_level=isolation,
            topics=(
                make(
                    schema.ListOffsetsTopic,
                    name="t",
                    partitions=(
                        make(schema.ListOffsetsPartition, partition_index=0, timestamp=-1),
                    ),
                ),
            ),
            timeout=i32Timedelta.parse(datetime.timedelta(seconds=1)),
        )
        response = call(broker, ApiKey.LIST_OFFSETS, request)
        return int(response.topics[0].partitions[0].offset)

    assert (latest(0), latest(1)) == (5, 3)
    partition.append_txn_marker(A, 0, 0, True, 1)
    assert (latest(0), latest(1)) == (6, 6)


# -- restarts, truncation, retention --------------------------------------------------------


def restart(broker: Broker, tmp_path: Path, clock: Any, *, clean: bool, snapshots: bool) -> Broker:
    """Close (cleanly or as a crash would leave it) and reopen the partition."""
    if clean:
        broker.partitions.close()
    broker.partitions.logs.close()
    if not clean:
        (tmp_path / "data" / ".clean-shutdown").unlink(missing_ok=True)
    if not snapshots:
        for path in (tmp_path / "data" / "t-0").glob("*.snapshot"):
            path.unlink()
    logs = LogManager([tmp_path / "data"], clock=clock)
    logs.open()
    new = Broker(node_id=1, partitions=Partitions(logs), clock=clock)
    open_partition(new)
    return new


@pytest.mark.parametrize(
    ("clean", "snapshots"),
    [(True, True), (False, True), (False, False)],
    ids=["clean", "crash-with-snapshots", "crash-log-only"],
)
def test_restart_keeps_ongoing_transactions_lso_and_index(
    broker: Broker, tmp_path: Path, clock: Any, clean: bool, snapshots: bool
) -> None:
    config = LogConfig.from_mapping({"segment.bytes": 300})
    partition = open_partition(broker, config=config)
    append(partition, txn_batch(A, 0))
    append(partition, txn_batch(B, 0))
    partition.append_txn_marker(A, 0, 0, False, 1)
    for seq in range(2, 12, 2):
        append(partition, txn_batch(B, seq))  # rolls segments: snapshots hold B's open txn
    assert len(partition.log.segments) > 2
    expected = (partition.last_stable_offset, index_entries(partition))
    assert expected == (2, [AbortedTxn(A, 0, 4, 2)])
    restarted = restart(broker, tmp_path, clock, clean=clean, snapshots=snapshots)
    try:
        again = restarted.partitions.get("t", 0)
        assert again is not None
        assert (again.last_stable_offset, index_entries(again)) == expected
        assert again.producers.ongoing == {B: 2}
        again.append_txn_marker(B, 0, 0, True, 1)
        assert again.last_stable_offset == again.high_watermark
    finally:
        restarted.partitions.logs.close()


def test_a_lost_index_entry_is_rebuilt_from_the_log_after_a_crash(
    broker: Broker, tmp_path: Path, clock: Any
) -> None:
    partition = open_partition(broker)
    append(partition, txn_batch(A, 0))
    partition.append_txn_marker(A, 0, 0, False, 1)
    (path,) = partition.log.directory.glob("*.txnindex")
    restarted_before = restart(broker, tmp_path, clock, clean=False, snapshots=False)
    restarted_before.partitions.logs.close()
    path.unlink()  # as if the index write never reached the disk
    (tmp_path / "data" / ".clean-shutdown").unlink(missing_ok=True)
    for snapshot in path.parent.glob("*.snapshot"):
        snapshot.unlink()
    logs = LogManager([tmp_path / "data"], clock=clock)
    logs.open()
    try:
        again = Broker(node_id=1, partitions=Partitions(logs), clock=clock)
        reopened = open_partition(again)
        assert index_entries(reopened) == [AbortedTxn(A, 0, 2, 3)]
    finally:
        logs.close()


def test_truncation_drops_the_index_entries_of_removed_markers(broker: Broker) -> None:
    partition = open_partition(broker)
    append(partition, txn_batch(A, 0))  # 0-1
    partition.append_txn_marker(A, 0, 0, False, 1)  # 2
    append(partition, txn_batch(B, 0))  # 3-4
    partition.append_txn_marker(B, 0, 0, False, 1)  # 5
    assert len(index_entries(partition)) == 2
    assert partition.truncate_to(5)
    assert index_entries(partition) == [AbortedTxn(A, 0, 2, 3)]
    assert partition.producers.ongoing == {B: 3}  # its end went with the marker
    assert partition.last_stable_offset == 3
    assert partition.truncate_to(2)
    assert index_entries(partition) == []
    assert partition.last_stable_offset == 0


def test_retention_deletes_index_files_and_keeps_open_transactions(
    broker: Broker, clock: Any
) -> None:
    config = LogConfig.from_mapping({"segment.bytes": 200, "retention.ms": 1000})
    partition = open_partition(broker, config=config)
    append(partition, txn_batch(A, 0))
    partition.append_txn_marker(A, 0, 0, False, 1)
    partition.log.roll()
    first_open = partition.log.log_end_offset
    append(partition, txn_batch(B, 0))  # stays open
    for _ in range(4):
        partition.log.roll()
        append(partition, plain_batch())
    assert len(list(partition.log.directory.glob("*.txnindex"))) == 1
    clock.advance(10_000_000_000)
    partition.log.delete_old_segments(clock())
    assert list(partition.log.directory.glob("*.txnindex")) == []  # went with its segment
    assert partition.log.log_start_offset == first_open  # B's first batch was not deleted
    partition.append_txn_marker(B, 0, 0, True, 1)
    partition.log.delete_old_segments(clock())
    assert partition.log.log_start_offset > first_open


def all_batches(partition: Partition) -> list[Any]:
    log = partition.log
    headers = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read_bytes(offset, 1 << 30)
        headers.extend(header for _, header in iter_batches(data))
        offset = headers[-1].next_offset
    return headers


def test_the_lso_never_points_below_the_log_start(broker: Broker) -> None:
    partition = open_partition(broker)
    append(partition, txn_batch(A, 0))  # 0-1, open
    append(partition, plain_batch())  # 2-4
    assert partition.last_stable_offset == 0
    partition.log.delete_records(3)
    assert partition.last_stable_offset == 3
    assert partition.producers.ongoing == {A: 0}  # still open: its marker will come
    partition.append_txn_marker(A, 0, 0, True, 1)
    assert partition.last_stable_offset == partition.high_watermark == 6


def test_compaction_removes_aborted_data_and_keeps_markers_committed_and_open_data(
    broker: Broker, clock: Any
) -> None:
    from tidelog.storage import Cleaner

    config = LogConfig.from_mapping({"cleanup.policy": "compact", "segment.bytes": 100_000})
    partition = open_partition(broker, config=config)
    append(partition, txn_batch(A, 0, tag=b"aborted"))  # 0-1
    append(partition, txn_batch(B, 0, tag=b"committed"))  # 2-3
    append(partition, txn_batch(A, 2, tag=b"aborted"))  # 4-5, A's last data batch
    partition.append_txn_marker(A, 0, 0, False, 1)  # 6
    partition.append_txn_marker(B, 0, 0, True, 1)  # 7
    for _ in range(3):
        append(partition, plain_batch(2))  # same key "k": superseded by later ones
    partition.log.roll()
    for _ in range(3):
        append(partition, plain_batch(2))
    append(partition, txn_batch(C, 0, tag=b"open"))  # stays open: not cleanable
    partition.log.roll()
    append(partition, plain_batch(1))
    before = index_entries(partition)
    result = Cleaner().clean_log(partition.log, clock(), force=True)
    assert result.end_offset <= partition.last_stable_offset
    assert result.records_removed > 0
    assert result.segments_before == 1 and result.segments_after == 1  # the open one waits
    assert index_entries(partition) == before == [AbortedTxn(A, 0, 6, 2)]
    headers = {h.base_offset: h for h in all_batches(partition)}
    assert 0 not in headers  # aborted data: gone
    assert headers[4].record_count == 0 and headers[4].producer_id == A  # bare: A's sequence
    assert headers[2].record_count == 2  # committed transactional data: kept whole
    assert headers[6].is_control and headers[7].is_control  # every marker stays
    _, values = values_read_committed(broker)
    assert not any(v.startswith(b"aborted") for v in values)
    assert b"committed0" in values and b"open0" not in values
    _, everything = fetch(broker, fetch_request(broker, 12, [Want("t")]))
    assert b"aborted" not in everything  # not even read_uncommitted sees it any more
    partition.append_txn_marker(C, 0, 0, True, 1)
    assert partition.last_stable_offset == partition.high_watermark
    Cleaner().clean_log(partition.log, clock(), force=True)
    assert b"open0" in values_read_committed(broker)[1]


def test_write_txn_markers_settles_transactional_offsets_of_consumer_offsets(
    broker: Broker,
) -> None:
    class Groups:
        def __init__(self) -> None:
            self.completed: list[tuple[int, int, bool]] = []

        def transaction_completed(self, partition: int, producer_id: int, commit: bool) -> None:
            self.completed.append((partition, producer_id, commit))

    groups = Groups()
    broker.groups = groups  # type: ignore[assignment]
    open_partition(broker)
    open_partition(broker, "__consumer_offsets")
    schema = module("write_txn_markers", 1)
    request = schema.WriteTxnMarkersRequest(
        markers=(
            schema.WritableTxnMarker(
                producer_id=A,
                producer_epoch=0,
                transaction_result=True,
                coordinator_epoch=0,
                topics=(
                    schema.WritableTxnMarkerTopic(name="t", partition_indexes=(0,)),
                    schema.WritableTxnMarkerTopic(
                        name="__consumer_offsets", partition_indexes=(0, 1)
                    ),
                ),
            ),
        )
    )
    call(broker, ApiKey.WRITE_TXN_MARKERS, request)
    assert groups.completed == [(0, A, True)]  # partition 1 is not here: nothing to settle


def test_compaction_drops_a_marker_left_without_data_after_delete_retention(
    broker: Broker, clock: Any, tmp_path: Path
) -> None:
    from tidelog.storage import Cleaner

    config = LogConfig.from_mapping({"cleanup.policy": "compact", "delete.retention.ms": 1000})
    partition = open_partition(broker, config=config)
    append(partition, txn_batch(A, 0, tag=b"aborted"))  # 0-1
    partition.append_txn_marker(A, 0, 0, False, 1)  # 2
    append(partition, txn_batch(A, 2, tag=b"later"))  # 3-4: A's last data batch
    partition.append_txn_marker(A, 0, 0, True, 1)  # 5
    partition.log.roll()
    append(partition, plain_batch(1))
    cleaner = Cleaner()
    first = cleaner.clean_log(partition.log, clock(), force=True)
    headers = {h.base_offset: h for h in all_batches(partition)}
    assert 0 not in headers  # the aborted data went
    assert headers[2].is_control and headers[2].has_delete_horizon  # its marker waits
    assert headers[2].base_timestamp == clock() + 1000
    assert first.next_delete_horizon == clock() + 1000
    assert index_entries(partition) == [AbortedTxn(A, 0, 2, 3)]
    assert headers[5].is_control and not headers[5].has_delete_horizon  # data left: kept
    clock.advance(999)
    cleaner.clean_log(partition.log, clock(), force=True)
    assert 2 in {h.base_offset for h in all_batches(partition)}
    clock.advance(1)
    cleaner.clean_log(partition.log, clock(), force=True)
    headers = {h.base_offset: h for h in all_batches(partition)}
    assert sorted(headers) == [3, 5, 6]
    assert index_entries(partition) == []  # no marker, no entry: a consumer would wait for it
    _, values = values_read_committed(broker)  # one fetch: the cleaned segment
    assert values == [b"later2", b"later3"]
    restarted = restart(broker, tmp_path, clock, clean=False, snapshots=False)
    try:
        again = restarted.partitions.get("t", 0)
        assert again is not None
        assert again.producers.ongoing == {}
        assert again.last_stable_offset == again.high_watermark
        assert index_entries(again) == []
    finally:
        restarted.partitions.logs.close()
