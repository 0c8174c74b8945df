"""Fetch semantics: offsets and errors, leader epochs, byte limits (KIP-74), long poll."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from tidelog.broker.broker import Broker
from tidelog.broker.partitions import Partition
from tidelog.broker.reply import Deferred, EncodedResponse, join_parts
from tidelog.protocol import ApiKey, ErrorCode
from tidelog.records import iter_batches

from .test_fetch_helpers import (
    Want,
    add_partitions,
    append,
    batch,
    call,
    decode_body,
    fetch,
    fetch_request,
    handle,
    partitions_of,
)


def _partition(broker: Broker, topic: str, index: int = 0) -> Partition:
    partition = broker.partitions.get(topic, index)
    assert partition is not None
    return partition


def _one(response: Any) -> Any:
    (topic,) = response.responses
    (partition,) = topic.partitions
    return partition


def _batch_offsets(records: bytes) -> list[int]:
    return [header.base_offset for _, header in iter_batches(records)]


# -- offsets and errors -------------------------------------------------------------------


@pytest.mark.parametrize("version", [4, 11, 12, 13, 18])
def test_fetch_from_the_middle_of_a_batch_starts_at_that_batch(
    broker: Broker, version: int
) -> None:
    add_partitions(broker, "t")
    p = _partition(broker, "t")
    append(p, batch([b"a", b"b", b"c"]), batch([b"d", b"e"]))
    response, _ = fetch(broker, fetch_request(broker, version, [Want("t", offset=4)]))
    got = _one(response)
    assert _batch_offsets(got.records) == [3]
    assert got.high_watermark == 5


@pytest.mark.parametrize("version", [4, 12, 13])
def test_offsets_outside_the_log_are_out_of_range_and_the_end_is_empty(
    broker: Broker, version: int
) -> None:
    add_partitions(broker, "t")
    p = _partition(broker, "t")
    append(p, batch([b"a", b"b"]), batch([b"c", b"d"]))
    p.log.delete_records(2)
    below, _ = fetch(broker, fetch_request(broker, version, [Want("t", offset=1)]))
    above, _ = fetch(broker, fetch_request(broker, version, [Want("t", offset=5)]))
    at_end, _ = fetch(broker, fetch_request(broker, version, [Want("t", offset=4)]))
    for response in (below, above):
        got = _one(response)
        assert got.error_code == ErrorCode.OFFSET_OUT_OF_RANGE
        assert got.high_watermark == -1
        assert got.records == b""
    end = _one(at_end)
    assert end.error_code == ErrorCode.NONE
    assert end.records == b""
    assert end.high_watermark == 4
    if version >= 5:
        assert end.log_start_offset == 2


def test_unknown_topic_name_and_partition(broker: Broker) -> None:
    add_partitions(broker, "t")
    response, _ = fetch(broker, fetch_request(broker, 12, [Want("t", 3), Want("nope", 0)]))
    errors = {k: p.error_code for k, p in partitions_of(response).items()}
    assert errors == {
        ("t", 3): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ("nope", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    }


@pytest.mark.parametrize("version", [13, 16, 18])
def test_unknown_and_zero_topic_ids(broker: Broker, version: int) -> None:
    add_partitions(broker, "t")
    stranger = uuid.uuid4()
    request = fetch_request(
        broker,
        version,
        [Want("t", 0), Want("ghost", 0), Want("zero", 0)],
        topic_ids={"ghost": stranger, "zero": None},
    )
    response, _ = fetch(broker, request)
    errors = {k: p.error_code for k, p in partitions_of(response).items()}
    assert errors == {
        (broker.topic_id_of("t"), 0): ErrorCode.NONE,
        (stranger, 0): ErrorCode.UNKNOWN_TOPIC_ID,
        (None, 0): ErrorCode.UNKNOWN_TOPIC_ID,
    }


def test_topic_id_of_another_incarnation_is_inconsistent(broker: Broker) -> None:
    add_partitions(broker, "t")
    old = uuid.uuid4()
    broker.topic_name_of = {old: "t"}.get  # type: ignore[method-assign]
    response, _ = fetch(broker, fetch_request(broker, 13, [Want("t")], topic_ids={"t": old}))
    assert _one(response).error_code == ErrorCode.INCONSISTENT_TOPIC_ID


@pytest.mark.parametrize(
    ("requested", "error"),
    [
        (-1, ErrorCode.NONE),
        (5, ErrorCode.NONE),
        (4, ErrorCode.FENCED_LEADER_EPOCH),
        (6, ErrorCode.UNKNOWN_LEADER_EPOCH),
    ],
)
def test_current_leader_epoch_is_fenced(broker: Broker, requested: int, error: ErrorCode) -> None:
    add_partitions(broker, "t", leader_epoch=5)
    append(_partition(broker, "t"), batch([b"a"]))
    response, _ = fetch(
        broker, fetch_request(broker, 12, [Want("t", current_leader_epoch=requested)])
    )
    got = _one(response)
    assert got.error_code == error
    assert (got.records != b"") == (error == ErrorCode.NONE)


def test_leadership_errors_name_the_leader_from_v16(broker: Broker) -> None:
    add_partitions(broker, "t", leader_epoch=5)
    broker.advertised_host, broker.advertised_port = "broker.example", 19092
    old, _ = fetch(broker, fetch_request(broker, 15, [Want("t", current_leader_epoch=4)]))
    new, _ = fetch(broker, fetch_request(broker, 16, [Want("t", current_leader_epoch=4)]))
    assert _one(old).current_leader.leader_id == -1
    assert not hasattr(old, "node_endpoints")
    leader = _one(new).current_leader
    assert (leader.leader_id, leader.leader_epoch) == (broker.node_id, 5)
    (node,) = new.node_endpoints
    assert (node.node_id, node.host, node.port) == (broker.node_id, "broker.example", 19092)


@pytest.mark.parametrize("version", [4, 11, 15, 18])
def test_follower_fetches_are_refused(broker: Broker, version: int) -> None:
    add_partitions(broker, "t")
    append(_partition(broker, "t"), batch([b"a"]))
    response, _ = fetch(broker, fetch_request(broker, version, [Want("t")], replica_id=2))
    got = _one(response)
    assert got.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert got.records == b""


def test_consumer_replica_ids_below_minus_one_read_normally(broker: Broker) -> None:
    add_partitions(broker, "t")
    append(_partition(broker, "t"), batch([b"a"]))
    response, _ = fetch(broker, fetch_request(broker, 11, [Want("t")], replica_id=-2))
    assert _one(response).records != b""


def test_diverging_epoch_is_reported_instead_of_records(broker: Broker) -> None:
    add_partitions(broker, "t", leader_epoch=1)
    p = _partition(broker, "t")
    append(p, batch([b"a", b"b"]))  # epoch 1: offsets 0-1
    p.leader_epoch = 3
    append(p, batch([b"c"]))  # epoch 3: offset 2
    # The fetcher has offset 3 from epoch 2, which this log never had: epoch 1 ends at 2.
    response, _ = fetch(broker, fetch_request(broker, 12, [Want("t", 0, 3, last_fetched_epoch=2)]))
    got = _one(response)
    assert got.error_code == ErrorCode.NONE
    assert (got.diverging_epoch.epoch, got.diverging_epoch.end_offset) == (1, 2)
    assert got.records == b""
    # A consistent position reads normally.
    ok, _ = fetch(broker, fetch_request(broker, 12, [Want("t", 0, 2, last_fetched_epoch=1)]))
    assert _batch_offsets(_one(ok).records) == [2]
    assert _one(ok).diverging_epoch.epoch == -1


def test_reads_stop_at_the_high_watermark(broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    add_partitions(broker, "t")
    p = _partition(broker, "t")
    append(p, batch([b"a"]), batch([b"b"]), batch([b"c"]))
    # What replication will do: offset 2 is in the log but not committed yet.
    monkeypatch.setattr(Partition, "high_watermark", property(lambda self: 2))
    response, _ = fetch(broker, fetch_request(broker, 12, [Want("t")]))
    got = _one(response)
    assert _batch_offsets(got.records) == [0, 1]
    assert got.high_watermark == got.last_stable_offset == 2


# -- byte limits ----------------------------------------------------------------------------


def _three_partitions(broker: Broker, sizes: list[list[int]]) -> list[Partition]:
    add_partitions(broker, "t", len(sizes))
    partitions = [_partition(broker, "t", i) for i in range(len(sizes))]
    for p, batch_sizes in zip(partitions, sizes, strict=True):
        if batch_sizes:
            append(p, *(batch([b"v" * size]) for size in batch_sizes))
    return partitions


def test_partition_max_bytes_returns_whole_batches_only(broker: Broker) -> None:
    (p,) = _three_partitions(broker, [[100, 100, 100]])
    one = len(p.log.read_bytes(0, 1, whole_batches=True))  # one batch, whole
    response, _ = fetch(broker, fetch_request(broker, 12, [Want("t", max_bytes=2 * one + 10)]))
    assert _batch_offsets(_one(response).records) == [0, 1]


def test_first_batch_is_returned_whole_above_every_limit(broker: Broker) -> None:
    _three_partitions(broker, [[5000, 10], [10]])
    response, _ = fetch(
        broker, fetch_request(broker, 12, [Want("t", 0, max_bytes=100), Want("t", 1)], max_bytes=50)
    )
    got = partitions_of(response)
    assert _batch_offsets(got[("t", 0)].records) == [0]  # larger than both limits
    assert got[("t", 1)].records == b""  # the response budget is spent
    assert got[("t", 1)].high_watermark == 1


def test_kip74_applies_to_the_first_partition_with_data_only(broker: Broker) -> None:
    partitions = _three_partitions(broker, [[], [5000], [5000]])
    response, _ = fetch(
        broker,
        fetch_request(broker, 12, [Want("t", 0), Want("t", 1), Want("t", 2)], max_bytes=6000),
    )
    got = partitions_of(response)
    assert got[("t", 0)].records == b""
    assert got[("t", 1)].records == partitions[1].log.read_bytes(0, 1 << 20)
    assert got[("t", 2)].records == b""  # would not fit whole into what is left


def test_response_budget_is_shared_in_request_order(broker: Broker) -> None:
    partitions = _three_partitions(broker, [[100, 100], [100, 100], [100]])
    one = len(partitions[0].log.read_bytes(0, 1, whole_batches=True))
    response, _ = fetch(
        broker,
        fetch_request(
            broker, 12, [Want("t", 2), Want("t", 0), Want("t", 1)], max_bytes=3 * one + 5
        ),
    )
    got = partitions_of(response)
    assert [len(_batch_offsets(got[("t", i)].records)) for i in (2, 0, 1)] == [1, 2, 0]
    assert [t.partitions[0].partition_index for t in response.responses] == [2]
    assert [p.partition_index for p in response.responses[0].partitions] == [2, 0, 1]


# -- long poll ------------------------------------------------------------------------------


def _body(reply: Any) -> bytes:
    assert isinstance(reply, EncodedResponse)
    try:
        return join_parts(reply.parts)
    finally:
        reply.close()


async def _handler(broker: Broker, request: Any) -> Any:
    return await handle(broker, ApiKey.FETCH, request)


def test_long_poll_is_woken_by_an_append(broker: Broker) -> None:
    add_partitions(broker, "t", 2)
    p1 = _partition(broker, "t", 1)
    request = fetch_request(
        broker, 12, [Want("t", 0), Want("t", 1)], max_wait_ms=30_000, min_bytes=1
    )

    async def scenario() -> tuple[bytes, bool]:
        reply = await _handler(broker, request)
        assert isinstance(reply, Deferred)
        waiter = asyncio.ensure_future(reply.waiter)
        await asyncio.sleep(0.01)
        still_waiting = not waiter.done()
        append(p1, batch([b"hello"]))
        return _body(await asyncio.wait_for(waiter, 10)), still_waiting

    body, still_waiting = asyncio.run(scenario())
    assert still_waiting
    got = partitions_of(decode_body(ApiKey.FETCH, 12, body))
    assert got[("t", 1)].records == p1.log.read_bytes(0, 1 << 20)
    assert got[("t", 1)].high_watermark == 1
    assert got[("t", 0)].records == b""


def test_an_append_before_the_long_poll_starts_waiting_is_not_missed(broker: Broker) -> None:
    """The Deferred runs only when the connection reaches it; an append made between the
    handler's read and that moment must answer the poll at once, not at its deadline."""
    add_partitions(broker, "t")
    p = _partition(broker, "t")
    request = fetch_request(broker, 12, [Want("t")], max_wait_ms=60_000, min_bytes=1)

    async def scenario() -> bytes:
        reply = await _handler(broker, request)
        assert isinstance(reply, Deferred)
        append(p, batch([b"early"]))  # before the waiter has run at all
        return _body(await asyncio.wait_for(reply.waiter, 10))

    got = _one(decode_body(ApiKey.FETCH, 12, asyncio.run(scenario())))
    assert _batch_offsets(got.records) == [0]


def test_shutdown_ends_long_polls_at_once(broker: Broker) -> None:
    add_partitions(broker, "t")
    request = fetch_request(broker, 12, [Want("t")], max_wait_ms=60_000, min_bytes=1)

    async def scenario() -> bytes:
        reply = await _handler(broker, request)
        assert isinstance(reply, Deferred)
        waiter = asyncio.ensure_future(reply.waiter)
        await asyncio.sleep(0.01)
        assert not waiter.done()
        broker.begin_stopping()
        return _body(await asyncio.wait_for(waiter, 10))

    got = _one(decode_body(ApiKey.FETCH, 12, asyncio.run(scenario())))
    assert got.error_code == ErrorCode.NONE and got.records == b""


def test_long_poll_waits_for_min_bytes(broker: Broker) -> None:
    add_partitions(broker, "t")
    p = _partition(broker, "t")
    request = fetch_request(broker, 12, [Want("t")], max_wait_ms=30_000, min_bytes=2000)

    async def scenario() -> tuple[bytes, bool]:
        reply = await _handler(broker, request)
        assert isinstance(reply, Deferred)
        waiter = asyncio.ensure_future(reply.waiter)
        append(p, batch([b"small"]))
        await asyncio.sleep(0.02)
        waiting_after_small = not waiter.done()
        append(p, batch([b"x" * 3000]))
        return _body(await asyncio.wait_for(waiter, 10)), waiting_after_small

    body, waiting_after_small = asyncio.run(scenario())
    assert waiting_after_small
    got = _one(decode_body(ApiKey.FETCH, 12, body))
    assert _batch_offsets(got.records) == [0, 1]


def test_long_poll_times_out_with_what_there_is(broker: Broker) -> None:
    add_partitions(broker, "t")
    p = _partition(broker, "t")
    append(p, batch([b"a"]))
    request = fetch_request(broker, 12, [Want("t")], max_wait_ms=20, min_bytes=1 << 20)

    async def scenario() -> bytes:
        reply = await _handler(broker, request)
        assert isinstance(reply, Deferred)
        return _body(await asyncio.wait_for(reply.waiter, 10))

    got = _one(decode_body(ApiKey.FETCH, 12, asyncio.run(scenario())))
    assert got.error_code == ErrorCode.NONE
    assert _batch_offsets(got.records) == [0]  # below min_bytes, sent at the deadline


def test_long_poll_times_out_empty(broker: Broker) -> None:
    add_partitions(broker, "t")
    request = fetch_request(broker, 13, [Want("t")], max_wait_ms=10, min_bytes=1)
    response, _ = fetch(broker, request)
    got = _one(response)
    assert (got.error_code, got.records, got.high_watermark) == (ErrorCode.NONE, b"", 0)


def test_no_wait_when_an_error_is_in_the_answer(broker: Broker) -> None:
    add_partitions(broker, "t")
    request = fetch_request(
        broker, 12, [Want("t", 0), Want("t", 9)], max_wait_ms=30_000, min_bytes=1
    )
    reply = call(broker, ApiKey.FETCH, request)
    assert isinstance(reply, EncodedResponse)
    got = partitions_of(decode_body(ApiKey.FETCH, 12, _body(reply)))
    assert got[("t", 9)].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_no_wait_when_max_wait_is_zero_or_min_bytes_are_there(broker: Broker) -> None:
    add_partitions(broker, "t")
    append(_partition(broker, "t"), batch([b"a"]))
    immediate = call(broker, ApiKey.FETCH, fetch_request(broker, 12, [Want("t", offset=1)]))
    assert isinstance(immediate, EncodedResponse)
    immediate.close()
    enough = call(
        broker,
        ApiKey.FETCH,
        fetch_request(broker, 12, [Want("t")], max_wait_ms=30_000, min_bytes=10),
    )
    assert isinstance(enough, EncodedResponse)
    enough.close()


def test_long_poll_answers_an_error_that_appears_while_waiting(broker: Broker) -> None:
    add_partitions(broker, "t")
    p = _partition(broker, "t")
    append(p, batch([b"a"]), batch([b"b"]))
    request = fetch_request(
        broker, 12, [Want("t", offset=0)], max_wait_ms=30_000, min_bytes=1 << 20
    )

    async def scenario() -> bytes:
        reply = await _handler(broker, request)
        assert isinstance(reply, Deferred)
        waiter = asyncio.ensure_future(reply.waiter)
        await asyncio.sleep(0)
        p.log.delete_records(2)
        p.wake_waiters()
        return _body(await asyncio.wait_for(waiter, 10))

    got = _one(decode_body(ApiKey.FETCH, 12, asyncio.run(scenario())))
    assert got.error_code == ErrorCode.OFFSET_OUT_OF_RANGE


# -- over a real socket: sendfile and ordering ----------------------------------------------


def test_fetch_over_a_socket_uses_sendfile_and_keeps_response_order(broker: Broker) -> None:
    from tidelog.broker.handlers import HANDLERS
    from tidelog.broker.server import BrokerServer
    from tidelog.protocol import SUPPORTED_VERSIONS, FrameDecoder, encode_request, restrict

    add_partitions(broker, "t", 2)
    p0, p1 = _partition(broker, "t", 0), _partition(broker, "t", 1)
    append(p0, *(batch([bytes([i]) * 40_000]) for i in range(8)))
    poll = fetch_request(broker, 13, [Want("t", 1)], max_wait_ms=30_000, min_bytes=1)
    now = fetch_request(broker, 13, [Want("t", 0)], max_bytes=10 << 20)

    async def scenario() -> list[Any]:
        server = BrokerServer(
            broker,
            "127.0.0.1",
            0,
            HANDLERS,
            restrict(HANDLERS.keys(), SUPPORTED_VERSIONS),
            max_frame_size=1 << 20,
            max_in_flight=8,
        )
        await server.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            # A long poll, then an immediate fetch pipelined behind it on one connection.
            writer.write(encode_request(poll, correlation_id=1, client_id="t"))
            writer.write(encode_request(now, correlation_id=2, client_id="t"))
            await writer.drain()
            await asyncio.sleep(0.02)
            append(p1, batch([b"late"]))
            decoder, frames = FrameDecoder(), []
            while len(frames) < 2:
                data = await asyncio.wait_for(reader.read(1 << 16), 10)
                assert data
                frames.extend(bytes(f) for f in decoder.feed(data))
            writer.close()
            return frames
        finally:
            await server.shutdown()

    frames = asyncio.run(scenario())
    from tidelog.protocol import decode_response

    first = decode_response(frames[0], api_key=ApiKey.FETCH, api_version=13, correlation_id=1)[1]
    second = decode_response(frames[1], api_key=ApiKey.FETCH, api_version=13, correlation_id=2)[1]
    assert _one(first).records == p1.log.read_bytes(0, 1 << 20)
    assert _one(second).records == p0.log.read_bytes(0, 10 << 20)
    assert len(_one(second).records) > 8 * 40_000
