"""Incremental fetch sessions (KIP-227) through the Fetch handler, and the session cache."""

from __future__ import annotations

import random
from collections import OrderedDict
from typing import Any

import pytest

from tidelog.broker.broker import Broker
from tidelog.broker.fetch_sessions import (
    CachedPartition,
    FetchSessionCache,
    next_epoch,
    sessions_of,
)
from tidelog.broker.partitions import Partition
from tidelog.protocol import ErrorCode

from .test_fetch_helpers import (
    Want,
    add_partitions,
    append,
    batch,
    fetch,
    fetch_request,
    partitions_of,
)


def _partition(broker: Broker, topic: str, index: int = 0) -> Partition:
    partition = broker.partitions.get(topic, index)
    assert partition is not None
    return partition


def _indexes(response: Any) -> list[int]:
    return [p.partition_index for t in response.responses for p in t.partitions]


def _topic(broker: Broker, version: int, name: str) -> Any:
    return broker.topic_id_of(name) if version >= 13 else name


@pytest.mark.parametrize("version", [7, 12, 13, 18])
def test_full_then_incremental_fetches(broker: Broker, version: int) -> None:
    add_partitions(broker, "t", 3)
    p0, p1, p2 = (_partition(broker, "t", i) for i in range(3))
    append(p0, batch([b"a"]), batch([b"b"]))
    wants = [Want("t", 0), Want("t", 1), Want("t", 2)]

    full, _ = fetch(broker, fetch_request(broker, version, wants, session_epoch=0))
    session_id = full.session_id
    assert session_id != 0
    assert _indexes(full) == [0, 1, 2]  # a full response has every partition
    session = sessions_of(broker).get(session_id)
    assert session is not None and len(session) == 3

    # Nothing changed: the incremental response is empty.
    quiet, _ = fetch(
        broker,
        fetch_request(
            broker, version, [Want("t", 0, offset=2)], session_id=session_id, session_epoch=1
        ),
    )
    assert (quiet.error_code, quiet.session_id) == (ErrorCode.NONE, session_id)
    assert quiet.responses == ()
    assert session.partitions[(_topic(broker, version, "t"), 0)].fetch_offset == 2

    # New data in partition 1 only: only it is sent, from the remembered offset 0.
    append(p1, batch([b"c"]))
    news, _ = fetch(
        broker, fetch_request(broker, version, [], session_id=session_id, session_epoch=2)
    )
    assert _indexes(news) == [1]
    got = partitions_of(news)[(_topic(broker, version, "t"), 1)]
    assert got.records == p1.log.read_bytes(0, 1 << 20)
    assert got.high_watermark == 1

    # Partition 1 answered goes to the back of the line.
    assert [key[1] for key in session.partitions] == [0, 2, 1]

    # Forgotten partitions leave the session and are no longer answered.
    append(p2, batch([b"d"]))
    forgot, _ = fetch(
        broker,
        fetch_request(
            broker, version, [], session_id=session_id, session_epoch=3, forgotten=[("t", 2)]
        ),
    )
    assert _indexes(forgot) == [1]  # still at offset 0: data again
    assert [key[1] for key in session.partitions] == [0, 1]


def test_log_start_offset_and_errors_are_sent_when_they_change(broker: Broker) -> None:
    add_partitions(broker, "t", 2)
    p0 = _partition(broker, "t", 0)
    append(p0, batch([b"a"]), batch([b"b"]), batch([b"c"]))
    full, _ = fetch(
        broker, fetch_request(broker, 12, [Want("t", 0, 3), Want("t", 1)], session_epoch=0)
    )
    sid = full.session_id
    p0.log.delete_records(1)
    moved, _ = fetch(broker, fetch_request(broker, 12, [], session_id=sid, session_epoch=1))
    (only,) = [p for t in moved.responses for p in t.partitions]
    assert (only.partition_index, only.log_start_offset, only.records) == (0, 1, b"")
    # An error is always sent, and the partition is sent again once the error is gone.
    bad, _ = fetch(
        broker, fetch_request(broker, 12, [Want("t", 1, 5)], session_id=sid, session_epoch=2)
    )
    assert [(p.partition_index, p.error_code) for t in bad.responses for p in t.partitions] == [
        (1, ErrorCode.OFFSET_OUT_OF_RANGE)
    ]
    fixed, _ = fetch(
        broker, fetch_request(broker, 12, [Want("t", 1, 0)], session_id=sid, session_epoch=3)
    )
    assert [
        (p.partition_index, p.error_code, p.high_watermark)
        for t in fixed.responses
        for p in t.partitions
    ] == [(1, ErrorCode.NONE, 0)]


def test_session_errors(broker: Broker) -> None:
    add_partitions(broker, "t")
    full, _ = fetch(broker, fetch_request(broker, 12, [Want("t")], session_epoch=0))
    sid = full.session_id
    unknown, _ = fetch(broker, fetch_request(broker, 12, [], session_id=sid + 1, session_epoch=1))
    assert (unknown.error_code, unknown.session_id, unknown.responses) == (
        ErrorCode.FETCH_SESSION_ID_NOT_FOUND,
        0,
        (),
    )
    wrong_epoch, _ = fetch(broker, fetch_request(broker, 12, [], session_id=sid, session_epoch=5))
    assert wrong_epoch.error_code == ErrorCode.INVALID_FETCH_SESSION_EPOCH
    # Switching between names and topic ids within a session is refused.
    switched, _ = fetch(broker, fetch_request(broker, 13, [], session_id=sid, session_epoch=1))
    assert switched.error_code == ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR
    # The session survived the errors: the right epoch works.
    ok, _ = fetch(broker, fetch_request(broker, 12, [], session_id=sid, session_epoch=1))
    assert (ok.error_code, ok.session_id) == (ErrorCode.NONE, sid)
    no_session, _ = fetch(broker, fetch_request(broker, 12, [], session_id=0, session_epoch=3))
    assert no_session.error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND


def test_close_and_sessionless_fetches(broker: Broker) -> None:
    add_partitions(broker, "t")
    append(_partition(broker, "t"), batch([b"a"]))
    full, _ = fetch(broker, fetch_request(broker, 12, [Want("t")], session_epoch=0))
    sid = full.session_id
    closed, _ = fetch(
        broker, fetch_request(broker, 12, [Want("t")], session_id=sid, session_epoch=-1)
    )
    assert closed.session_id == 0
    assert _indexes(closed) == [0]  # answered like a sessionless fetch
    assert sid not in sessions_of(broker)
    sessionless, _ = fetch(broker, fetch_request(broker, 12, [Want("t")]))
    assert sessionless.session_id == 0
    assert len(sessions_of(broker)) == 0
    # A full fetch naming an old session replaces it.
    first, _ = fetch(broker, fetch_request(broker, 12, [Want("t")], session_epoch=0))
    second, _ = fetch(
        broker,
        fetch_request(broker, 12, [Want("t")], session_id=first.session_id, session_epoch=0),
    )
    assert first.session_id not in sessions_of(broker)
    assert second.session_id in sessions_of(broker)


def test_forgetting_every_partition_ends_the_session(broker: Broker) -> None:
    add_partitions(broker, "t")
    full, _ = fetch(broker, fetch_request(broker, 12, [Want("t")], session_epoch=0))
    gone, _ = fetch(
        broker,
        fetch_request(
            broker, 12, [], session_id=full.session_id, session_epoch=1, forgotten=[("t", 0)]
        ),
    )
    assert (gone.error_code, gone.session_id, gone.responses) == (ErrorCode.NONE, 0, ())
    assert full.session_id not in sessions_of(broker)


def test_full_cache_gives_no_session_to_smaller_fetchers(broker: Broker) -> None:
    add_partitions(broker, "t", 3)
    broker.fetch_sessions = FetchSessionCache(max_slots=1)  # type: ignore[attr-defined]
    big, _ = fetch(
        broker,
        fetch_request(broker, 12, [Want("t", 0), Want("t", 1)], session_epoch=0),
    )
    small, _ = fetch(broker, fetch_request(broker, 12, [Want("t", 2)], session_epoch=0))
    assert big.session_id != 0
    assert small.session_id == 0  # not worth evicting a larger session for
    assert _indexes(small) == [2]
    bigger, _ = fetch(
        broker,
        fetch_request(broker, 12, [Want("t", 0), Want("t", 1), Want("t", 2)], session_epoch=0),
    )
    assert bigger.session_id != 0
    assert big.session_id not in sessions_of(broker)


# -- the cache on its own -------------------------------------------------------------------


def _parts(count: int) -> OrderedDict[Any, CachedPartition]:
    return OrderedDict(
        (("t", i), CachedPartition("t", None, i, fetch_offset=0, max_bytes=1)) for i in range(count)
    )


def test_cache_evicts_idle_sessions_first_least_recently_used() -> None:
    cache = FetchSessionCache(max_slots=2, eviction_ms=1000, rng=random.Random(1))
    a = cache.create(_parts(5), uses_topic_ids=True, now_ms=0)
    b = cache.create(_parts(5), uses_topic_ids=True, now_ms=100)
    assert a is not None and b is not None
    cache.touch(a, 500)  # b is now the least recently used
    c = cache.create(_parts(1), uses_topic_ids=True, now_ms=1200)  # b idle 1100 ms > 1000
    assert c is not None
    assert a.id in cache and b.id not in cache and c.id in cache
    assert cache.evictions == 1


def test_cache_evicts_the_smallest_session_when_none_is_idle() -> None:
    cache = FetchSessionCache(max_slots=3, eviction_ms=10_000)
    sizes = [4, 2, 2]
    made = [cache.create(_parts(n), uses_topic_ids=False, now_ms=i) for i, n in enumerate(sizes)]
    assert all(s is not None for s in made)
    assert cache.create(_parts(1), uses_topic_ids=False, now_ms=5) is None
    d = cache.create(_parts(2), uses_topic_ids=False, now_ms=6)
    assert d is not None
    ids = [s.id for s in made if s is not None]
    # The older of the two smallest went.
    assert [i in cache for i in ids] == [True, False, True]
    assert len(cache) == 3


def test_cache_bound_holds_under_many_sessions() -> None:
    cache = FetchSessionCache()
    for i in range(1500):
        cache.create(_parts(1 + i % 3), uses_topic_ids=True, now_ms=i)
    assert len(cache) == 1000


def test_epochs_wrap_to_one() -> None:
    assert next_epoch(0) == 1
    assert next_epoch(41) == 42
    assert next_epoch(2**31 - 1) == 1


def test_incremental_long_poll_waits_on_every_session_partition(broker: Broker) -> None:
    import asyncio

    from tidelog.broker.reply import Deferred, join_parts
    from tidelog.protocol import ApiKey

    from .test_fetch_helpers import decode_body, handle

    add_partitions(broker, "t", 2)
    p1 = _partition(broker, "t", 1)
    full, _ = fetch(
        broker, fetch_request(broker, 13, [Want("t", 0), Want("t", 1)], session_epoch=0)
    )
    sid = full.session_id
    # The incremental request lists no partition; partition 1 is waited on all the same.
    poll = fetch_request(broker, 13, [], session_id=sid, session_epoch=1, max_wait_ms=30_000)

    async def scenario() -> bytes:
        reply = await handle(broker, ApiKey.FETCH, poll)
        assert isinstance(reply, Deferred)
        waiter = asyncio.ensure_future(reply.waiter)
        await asyncio.sleep(0)
        append(p1, batch([b"x"]))
        encoded = await asyncio.wait_for(waiter, 10)
        try:
            return join_parts(encoded.parts)
        finally:
            encoded.close()

    response = decode_body(ApiKey.FETCH, 13, asyncio.run(scenario()))
    assert response.session_id == sid
    assert _indexes(response) == [1]
    assert partitions_of(response)[(broker.topic_id_of("t"), 1)].records == p1.log.read_bytes(
        0, 1 << 20
    )
