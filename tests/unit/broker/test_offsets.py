"""ListOffsets, OffsetForLeaderEpoch and DeleteRecords through their handlers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tidelog.broker.broker import Broker
from tidelog.broker.partitions import Partition
from tidelog.broker.reply import Deferred, join_parts
from tidelog.protocol import ApiKey, ErrorCode

from .test_fetch_helpers import (
    Want,
    add_partitions,
    append,
    batch,
    call,
    decode_body,
    fetch_request,
    handle,
    make,
    module,
)


def _partition(broker: Broker, topic: str, index: int = 0) -> Partition:
    partition = broker.partitions.get(topic, index)
    assert partition is not None
    return partition


def _results(response: Any) -> list[Any]:
    return [p for t in response.topics for p in t.partitions]


# -- ListOffsets ----------------------------------------------------------------------------


def _list_offsets(
    broker: Broker,
    version: int,
    queries: list[tuple[str, int, int]] | list[tuple[str, int, int, int]],
    *,
    replica_id: int = -1,
    isolation_level: int = 0,
) -> list[Any]:
    import datetime

    from kio.static.primitive import i32Timedelta

    schema = module("list_offsets", version)
    topics: dict[str, list[Any]] = {}
    for query in queries:
        name, index, timestamp = query[:3]
        epoch = query[3] if len(query) > 3 else -1
        topics.setdefault(name, []).append(
            make(
                schema.ListOffsetsPartition,
                partition_index=index,
                timestamp=timestamp,
                current_leader_epoch=epoch,
                max_num_offsets=1,
            )
        )
    request = make(
        schema.ListOffsetsRequest,
        replica_id=replica_id,
        isolation_level=isolation_level,
        topics=tuple(
            make(schema.ListOffsetsTopic, name=n, partitions=tuple(p)) for n, p in topics.items()
        ),
        timeout=i32Timedelta.parse(datetime.timedelta(milliseconds=1000)),
    )
    return _results(call(broker, ApiKey.LIST_OFFSETS, request))


@pytest.fixture
def timed(broker: Broker) -> Partition:
    """Offsets 0-5 with timestamps 100, 200, 300 (x2: offsets 2, 3), 250, 300; epochs 0, 0, 2."""
    add_partitions(broker, "t")
    p = _partition(broker, "t")
    append(p, batch([b"a", b"b"], timestamp=100, step=100))  # 0:100 1:200
    append(p, batch([b"c", b"d"], timestamp=300))  # 2:300 3:300
    p.leader_epoch = 2
    append(p, batch([b"e", b"f"], timestamp=250, step=50))  # 4:250 5:300
    return p


@pytest.mark.parametrize("version", range(1, 12))
def test_list_offsets_modes(broker: Broker, timed: Partition, version: int) -> None:
    queries = [("t", 0, -2), ("t", 0, -1), ("t", 0, 150), ("t", 0, 300), ("t", 0, 301)]
    answers = [_list_offsets(broker, version, [q])[0] for q in queries]
    assert all(a.error_code == ErrorCode.NONE for a in answers)
    pairs = [(a.offset, a.timestamp) for a in answers]
    assert pairs == [(0, -1), (6, -1), (1, 200), (2, 300), (-1, -1)]
    if version >= 4:
        assert [a.leader_epoch for a in answers] == [0, 2, 0, 0, -1]
    if version >= 7:
        (max_ts,) = _list_offsets(broker, version, [("t", 0, -3)])
        assert (max_ts.offset, max_ts.timestamp) == (2, 300)
    if version >= 8:
        (local,) = _list_offsets(broker, version, [("t", 0, -4)])
        assert (local.offset, local.timestamp) == (0, -1)
    if version >= 9:
        (tiered,) = _list_offsets(broker, version, [("t", 0, -5)])
        assert (tiered.error_code, tiered.offset) == (ErrorCode.NONE, -1)


def test_list_offsets_earliest_follows_delete_records(broker: Broker, timed: Partition) -> None:
    timed.log.delete_records(3)
    earliest, by_time = (
        _list_offsets(broker, 7, [("t", 0, -2)]),
        _list_offsets(broker, 7, [("t", 0, 100)]),
    )
    assert earliest[0].offset == 3
    assert (by_time[0].offset, by_time[0].timestamp) == (3, 300)


def test_list_offsets_on_an_empty_log(broker: Broker) -> None:
    add_partitions(broker, "e")
    answers = _list_offsets(broker, 9, [("e", 0, -2)]) + _list_offsets(broker, 9, [("e", 0, -1)])
    answers += _list_offsets(broker, 9, [("e", 0, -3)]) + _list_offsets(broker, 9, [("e", 0, 5)])
    assert [(a.offset, a.timestamp) for a in answers] == [(0, -1), (0, -1), (-1, -1), (-1, -1)]


def test_list_offsets_read_committed_latest_is_the_high_watermark(
    broker: Broker, timed: Partition
) -> None:
    (latest,) = _list_offsets(broker, 5, [("t", 0, -1)], isolation_level=1)
    assert latest.offset == 6


def test_list_offsets_errors(broker: Broker, timed: Partition) -> None:
    unknown = _list_offsets(broker, 6, [("t", 4, -1), ("nope", 0, -1)])
    assert [a.error_code for a in unknown] == [ErrorCode.UNKNOWN_TOPIC_OR_PARTITION] * 2
    fenced = _list_offsets(broker, 6, [("t", 0, -1, 1)])[0]
    future = _list_offsets(broker, 6, [("t", 0, -1, 3)])[0]
    current = _list_offsets(broker, 6, [("t", 0, -1, 2)])[0]
    assert fenced.error_code == ErrorCode.FENCED_LEADER_EPOCH
    assert future.error_code == ErrorCode.UNKNOWN_LEADER_EPOCH
    assert (current.error_code, current.offset) == (ErrorCode.NONE, 6)
    twice = _list_offsets(broker, 6, [("t", 0, -1), ("t", 0, -2)])
    assert [a.error_code for a in twice] == [ErrorCode.INVALID_REQUEST] * 2
    bad = _list_offsets(broker, 6, [("t", 0, -9)])[0]
    assert bad.error_code == ErrorCode.INVALID_REQUEST
    follower = _list_offsets(broker, 6, [("t", 0, -1)], replica_id=3)[0]
    assert follower.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER


def test_list_offsets_hides_offsets_above_the_high_watermark_from_consumers(
    broker: Broker, timed: Partition, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What replication will do: offsets 2-5 are in the log but not committed yet.
    monkeypatch.setattr(Partition, "high_watermark", property(lambda self: 2))
    answers = [_list_offsets(broker, 7, [("t", 0, ts)])[0] for ts in (150, 250, -3, -1)]
    assert [(a.offset, a.timestamp) for a in answers] == [(1, 200), (-1, -1), (-1, -1), (2, -1)]
    (debug,) = _list_offsets(broker, 7, [("t", 0, -1)], replica_id=-2)
    assert debug.offset == 6


# -- OffsetForLeaderEpoch -------------------------------------------------------------------


def _epochs(broker: Broker, version: int, queries: list[tuple[str, int, int, int]]) -> list[Any]:
    schema = module("offset_for_leader_epoch", version)
    topics: dict[str, list[Any]] = {}
    for name, index, epoch, current in queries:
        topics.setdefault(name, []).append(
            make(
                schema.OffsetForLeaderPartition,
                partition=index,
                current_leader_epoch=current,
                leader_epoch=epoch,
            )
        )
    request = make(
        schema.OffsetForLeaderEpochRequest,
        replica_id=-2,
        topics=tuple(
            make(schema.OffsetForLeaderTopic, topic=n, partitions=tuple(p))
            for n, p in topics.items()
        ),
    )
    response = call(broker, ApiKey.OFFSET_FOR_LEADER_EPOCH, request)
    return [p for t in response.topics for p in t.partitions]


@pytest.mark.parametrize("version", [2, 3, 4])
def test_offset_for_leader_epoch(broker: Broker, version: int) -> None:
    add_partitions(broker, "t", leader_epoch=1)
    p = _partition(broker, "t")
    append(p, batch([b"a", b"b"]))  # epoch 1: 0-1
    p.leader_epoch = 3
    append(p, batch([b"c"]))  # epoch 3: 2
    answers = _epochs(broker, version, [("t", 0, e, -1) for e in (0, 1, 2, 3, 4, -1)])
    assert all(a.error_code == ErrorCode.NONE for a in answers)
    assert [(a.leader_epoch, a.end_offset) for a in answers] == [
        (0, 0),  # below every epoch: the first epoch's start
        (1, 2),
        (1, 2),  # never led in 2: the epoch before it, ending where 3 starts
        (3, 3),  # the latest epoch ends at the log end offset
        (-1, -1),  # above every epoch
        (-1, -1),
    ]


def test_offset_for_leader_epoch_of_a_leader_without_data_in_its_epoch(broker: Broker) -> None:
    add_partitions(broker, "t", leader_epoch=1)
    p = _partition(broker, "t")
    append(p, batch([b"a", b"b"]))
    p.leader_epoch = 4  # became leader again; nothing appended since
    answers = _epochs(broker, 4, [("t", 0, e, -1) for e in (1, 2, 4, 5)])
    assert [(a.leader_epoch, a.end_offset) for a in answers] == [(1, 2), (1, 2), (4, 2), (-1, -1)]
    add_partitions(broker, "empty", leader_epoch=2)
    empty = _epochs(broker, 4, [("empty", 0, e, -1) for e in (1, 2)])
    assert [(a.leader_epoch, a.end_offset) for a in empty] == [(1, 0), (2, 0)]


def test_offset_for_leader_epoch_errors(broker: Broker) -> None:
    add_partitions(broker, "t", leader_epoch=3)
    answers = _epochs(broker, 3, [("t", 0, 3, 2), ("t", 0, 3, 4), ("t", 1, 3, -1), ("x", 0, 0, -1)])
    assert [a.error_code for a in answers] == [
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ]
    assert all((a.leader_epoch, a.end_offset) == (-1, -1) for a in answers)


# -- DeleteRecords --------------------------------------------------------------------------


def _delete_request(version: int, queries: list[tuple[str, int, int]]) -> Any:
    import datetime

    from kio.static.primitive import i32Timedelta

    schema = module("delete_records", version)
    topics: dict[str, list[Any]] = {}
    for name, index, offset in queries:
        topics.setdefault(name, []).append(
            make(schema.DeleteRecordsPartition, partition_index=index, offset=offset)
        )
    return make(
        schema.DeleteRecordsRequest,
        topics=tuple(
            make(schema.DeleteRecordsTopic, name=n, partitions=tuple(p)) for n, p in topics.items()
        ),
        timeout=i32Timedelta.parse(datetime.timedelta(milliseconds=1000)),
    )


def _delete(broker: Broker, version: int, queries: list[tuple[str, int, int]]) -> list[Any]:
    return _results(call(broker, ApiKey.DELETE_RECORDS, _delete_request(version, queries)))


@pytest.mark.parametrize("version", [0, 1, 2])
def test_delete_records(broker: Broker, version: int) -> None:
    add_partitions(broker, "t", 2, config={"segment.bytes": 200})
    p0, p1 = _partition(broker, "t", 0), _partition(broker, "t", 1)
    for _ in range(5):
        append(p0, batch([b"x" * 100]))
    append(p1, batch([b"a", b"b", b"c"]))
    segments_before = len(p0.log.segments)
    answers = _delete(broker, version, [("t", 0, 3), ("t", 1, -1)])
    assert [(a.error_code, a.low_watermark) for a in answers] == [
        (ErrorCode.NONE, 3),
        (ErrorCode.NONE, 3),  # -1: up to the high watermark
    ]
    assert p0.log_start_offset == 3
    assert len(p0.log.segments) < segments_before  # whole segments below it are gone
    # Deleting below the current start changes nothing and reports it.
    (again,) = _delete(broker, version, [("t", 0, 1)])
    assert (again.error_code, again.low_watermark) == (ErrorCode.NONE, 3)


def test_delete_records_errors(broker: Broker) -> None:
    add_partitions(broker, "t")
    add_partitions(broker, "compacted", config={"cleanup.policy": "compact"})
    append(_partition(broker, "t"), batch([b"a", b"b"]))
    answers = _delete(
        broker, 2, [("t", 0, 3), ("t", 0, -7), ("t", 5, 0), ("compacted", 0, 0), ("x", 0, 0)]
    )
    assert [(a.error_code, a.low_watermark) for a in answers] == [
        (ErrorCode.OFFSET_OUT_OF_RANGE, -1),
        (ErrorCode.OFFSET_OUT_OF_RANGE, -1),
        (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1),
        (ErrorCode.POLICY_VIOLATION, -1),
        (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1),
    ]
    assert _partition(broker, "t").log_start_offset == 0


def test_delete_records_wakes_long_polls(broker: Broker) -> None:
    add_partitions(broker, "t")
    p = _partition(broker, "t")
    append(p, batch([b"a"]), batch([b"b"]))
    poll = fetch_request(broker, 12, [Want("t", offset=0)], max_wait_ms=30_000, min_bytes=1 << 20)

    async def scenario() -> tuple[bytes, list[Any]]:
        reply = await handle(broker, ApiKey.FETCH, poll)
        assert isinstance(reply, Deferred)
        waiter = asyncio.ensure_future(reply.waiter)
        await asyncio.sleep(0)
        deleted = await handle(broker, ApiKey.DELETE_RECORDS, _delete_request(2, [("t", 0, 2)]))
        encoded = await asyncio.wait_for(waiter, 10)
        try:
            return join_parts(encoded.parts), _results(deleted)
        finally:
            encoded.close()

    body, deleted = asyncio.run(scenario())
    assert deleted[0].low_watermark == 2
    response = decode_body(ApiKey.FETCH, 12, body)
    (partition,) = response.responses[0].partitions
    assert partition.error_code == ErrorCode.OFFSET_OUT_OF_RANGE
