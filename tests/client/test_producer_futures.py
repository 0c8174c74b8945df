"""The futures ``Producer.send`` returns: real ``concurrent.futures.Future`` objects.

First :class:`DeliveryFuture` on its own (it starts bare and builds the standard Future only
when something needs it), checked against a standard Future driven the same way; then the
futures of a real producer against the module's broker: ``result``, ``exception``,
callbacks, ``concurrent.futures.wait`` / ``as_completed``, ``cancel`` (refused: a record is on
its way once sent) and ``done`` seen from other threads, and the order of records of both
kinds the synchronous producer hands over (plain topic + value, and the general kind).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.client import ClientError, Consumer, NewTopic, Producer, TopicPartition
from tidelog.client.aio.producer import DeliveryFuture, _Batch, _Delivered
from tidelog.client.errors import ClientClosedError
from tidelog.client.types import RecordMetadata
from tidelog.records import Compression

FIRST_COMPLETED = concurrent.futures.FIRST_COMPLETED
FIRST_EXCEPTION = concurrent.futures.FIRST_EXCEPTION


def _md(offset: int) -> RecordMetadata:
    return RecordMetadata("t", 0, offset, 1000 + offset)


def _reference() -> concurrent.futures.Future[Any]:
    """A standard Future in the state a send future starts in: running."""
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    assert future.set_running_or_notify_cancel()
    return future


def _observe(future: concurrent.futures.Future[Any]) -> tuple[Any, ...]:
    """Everything the public interface says about a future without waiting (and without
    concurrent.futures.wait, which is a step of its own below)."""
    state = (future.done(), future.running(), future.cancelled())
    if future.done():
        error = future.exception(timeout=0)
        outcome: Any = ("error", repr(error)) if error is not None else ("ok", future.result(0))
    else:
        with pytest.raises(concurrent.futures.TimeoutError):
            future.result(timeout=0)
        outcome = ("pending",)
    return (*state, outcome)


def _built(future: DeliveryFuture) -> bool:
    """Whether the standard Future inside was built (white box: the cost this saves)."""
    return bool(future._DeliveryFuture__built)


# -- DeliveryFuture alone ----------------------------------------------------------------------


def test_a_bare_future_answers_like_a_standard_one() -> None:
    ours, reference = DeliveryFuture(), _reference()
    assert isinstance(ours, concurrent.futures.Future)
    assert (ours.done(), ours.running(), ours.cancelled(), ours.cancel()) == (
        False,
        True,
        False,
        False,
    )
    ours.set_result(_md(3))
    reference.set_result(_md(3))
    assert _observe(ours) == _observe(reference) == (True, False, False, _okay(3))
    assert ours.result() is ours.result()  # the same object each time, as a Future's
    assert not ours.cancel()
    assert not _built(ours)  # none of that needed the standard Future

    failed, reference = DeliveryFuture(), _reference()
    error = ClientError("refused")
    failed.set_exception(error)
    reference.set_exception(error)
    assert _observe(failed) == _observe(reference)
    with pytest.raises(ClientError, match="refused"):
        failed.result(timeout=0)
    assert failed.exception() is error
    assert not _built(failed)
    # What needs the Future's own state builds it, with the outcome already in place.
    done, not_done = concurrent.futures.wait([ours, failed], timeout=0)
    assert done == {ours, failed} and not not_done and _built(ours) and _built(failed)
    assert _observe(ours) == (True, False, False, _okay(3))
    assert "state=finished" in repr(failed)


def _okay(offset: int) -> tuple[str, RecordMetadata]:
    return ("ok", _md(offset))


# One step of a scenario: what a use answers, in a form comparable between two futures. All
# but "observe" and "cancel" build the standard Future inside a DeliveryFuture.
_STEPS: dict[str, Callable[[concurrent.futures.Future[Any]], object]] = {
    "observe": _observe,
    "result": lambda f: f.result(timeout=0) if f.done() and f.exception(0) is None else None,
    "callback": lambda f: f.add_done_callback(lambda _: None),
    "repr": lambda f: repr(f).partition(" state=")[2],  # without class and address
    "wait": lambda f: [len(s) for s in concurrent.futures.wait([f], timeout=0)],
    "as_completed": lambda f: (
        len(list(concurrent.futures.as_completed([f], timeout=5))) if f.done() else None
    ),
    "cancel": lambda f: f.cancel(),
}


@settings(max_examples=80, deadline=None)
@given(
    before=st.lists(st.sampled_from(sorted(_STEPS)), max_size=4),
    after=st.lists(st.sampled_from(sorted(_STEPS)), max_size=4),
    outcome=st.sampled_from(["result", "error", "batch"]),
)
def test_any_sequence_of_uses_matches_a_standard_future(
    before: list[str], after: list[str], outcome: str
) -> None:
    """Whatever is asked before and after the outcome arrives (and whether that builds the
    standard Future early, late or never), the answers are a standard Future's."""
    ours, reference = DeliveryFuture(), _reference()
    seen: list[tuple[str, Any]] = []
    ours.add_done_callback(lambda f: seen.append(("ours", f.exception() or f.result())))
    reference.add_done_callback(lambda f: seen.append(("ref", f.exception() or f.result())))
    for step in before:
        assert _STEPS[step](ours) == _STEPS[step](reference)
        assert _observe(ours) == _observe(reference)
    error = ClientError("no")
    if outcome == "result":
        ours.set_result(_md(7))
    elif outcome == "error":
        ours.set_exception(error)
    else:
        batch = _Batch(TopicPartition("t", 0), 0.0)
        for offset in range(8):
            batch.add(None, b"v", 1000 + offset, DeliveryFuture() if offset != 7 else ours, None)
        DeliveryFuture.settle_batch(batch.sinks, _Delivered(batch, 0, -1))
    if outcome == "error":
        reference.set_exception(error)
    else:
        reference.set_result(_md(7))
    for step in after:
        assert _STEPS[step](ours) == _STEPS[step](reference)
        assert _observe(ours) == _observe(reference)
    # Each callback ran once, with the same outcome.
    assert sorted(who for who, _ in seen) == ["ours", "ref"]
    assert seen[0][1] == seen[1][1]


def test_settling_twice_is_refused() -> None:
    for build_first in (False, True):
        future = DeliveryFuture()
        if build_first:
            concurrent.futures.wait([future], timeout=0)
        future.set_result(_md(1))
        with pytest.raises(concurrent.futures.InvalidStateError):
            future.set_result(_md(2))
        with pytest.raises(concurrent.futures.InvalidStateError):
            future.set_exception(ClientError("late"))
        assert future.result() == _md(1)


def test_result_and_wait_block_until_another_thread_settles() -> None:
    futures = [DeliveryFuture() for _ in range(4)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        result = pool.submit(futures[0].result, 10)
        error = pool.submit(futures[1].exception, 10)
        first = pool.submit(concurrent.futures.wait, futures[2:], 10, FIRST_COMPLETED)
        # Settled by the main thread while the workers wait (or before they start waiting:
        # both must work).
        futures[0].set_result(_md(0))
        futures[1].set_exception(ClientError("gone"))
        futures[3].set_result(_md(3))
        assert result.result(10) == _md(0)
        assert isinstance(error.result(10), ClientError)
        done, not_done = first.result(10)
        assert done == {futures[3]} and not_done == {futures[2]}


def test_wait_first_exception_and_as_completed_follow_the_settlements() -> None:
    futures = [DeliveryFuture() for _ in range(5)]
    futures[1].set_result(_md(1))
    done, _ = concurrent.futures.wait(futures, timeout=0, return_when=FIRST_EXCEPTION)
    assert done == {futures[1]}
    futures[3].set_exception(ClientError("x"))
    done, not_done = concurrent.futures.wait(futures, timeout=5, return_when=FIRST_EXCEPTION)
    assert done == {futures[1], futures[3]} and len(not_done) == 3

    # as_completed yields the settled ones first, then each as it is settled; here the next
    # one is settled from inside the loop, in a chosen order.
    order = [futures[4], futures[0], futures[2]]
    yielded = []
    for future in concurrent.futures.as_completed(futures, timeout=10):
        yielded.append(future)
        if len(yielded) >= 2 and order:
            order.pop(0).set_result(_md(9))
    assert set(yielded[:2]) == {futures[1], futures[3]}
    assert yielded[2:] == [futures[4], futures[0], futures[2]]


def test_many_threads_wait_while_batches_settle() -> None:
    """Waiters in several threads (each building its futures at a different moment) while
    the batches are settled in one pass each from another thread."""
    futures = [DeliveryFuture() for _ in range(20 * 50)]
    batches = []
    for b in range(20):
        batch = _Batch(TopicPartition("t", b % 3), 0.0)
        for i in range(50):
            batch.add(None, b"v", 5000 + i // 10, futures[50 * b + i], None)
        batches.append(batch)

    def settle() -> None:
        for n, batch in enumerate(batches):
            DeliveryFuture.settle_batch(batch.sinks, _Delivered(batch, 100 * n, -1))

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        waits = [pool.submit(f.result, 10) for f in futures[::7]]
        settler = threading.Thread(target=settle)
        settler.start()
        callbacks = [pool.submit(f.add_done_callback, lambda _: None) for f in futures[3::11]]
        settler.join(10)
        results = [w.result(10) for w in waits]
        assert all(c.result(10) is None for c in callbacks)
    for n in range(20):
        for i in range(50):
            expected = RecordMetadata("t", n % 3, 100 * n + i, 5000 + i // 10)
            assert futures[50 * n + i].result(0) == expected
    assert results == [f.result(0) for f in futures[::7]]


def test_a_batch_settles_bare_built_and_asyncio_sinks_alike() -> None:
    async def run() -> None:
        batch = _Batch(TopicPartition("t", 2), 0.0)
        bare, built = DeliveryFuture(), DeliveryFuture()
        concurrent.futures.wait([built], timeout=0)  # now a standard Future inside
        loop_future: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        for sink, ts in ((bare, 10), (built, 10), (loop_future, 12)):
            batch.add(None, b"v", ts, sink, None)
        batch.seal(Compression.NONE, None)
        DeliveryFuture.settle_batch(batch.sinks, _Delivered(batch, 40, -1))
        assert bare.result(0) == RecordMetadata("t", 2, 40, 10)
        assert built.result(0) == RecordMetadata("t", 2, 41, 10)
        assert await loop_future == RecordMetadata("t", 2, 42, 12)
        # LogAppendTime: the broker's time for every record; acks=0: offsets unknown.
        again = _Batch(TopicPartition("t", 2), 0.0)
        futures = [DeliveryFuture() for _ in range(3)]
        for i, future in enumerate(futures):
            again.add(None, b"v", i, future, None)
        DeliveryFuture.settle_batch(again.sinks, _Delivered(again, -1, 777))
        assert [f.result() for f in futures] == [RecordMetadata("t", 2, -1, 777)] * 3
        # A DeliveryFuture can be awaited from asyncio like any concurrent future.
        waited = DeliveryFuture()
        asyncio.get_running_loop().call_later(0.01, waited.set_result, _md(5))
        assert await asyncio.wrap_future(waited) == _md(5)

    asyncio.run(run())


def test_a_closed_producer_refuses_records_of_every_kind() -> None:
    producer = Producer({"bootstrap.servers": "127.0.0.1:9"})  # never connected
    producer.close(timeout=0)
    with pytest.raises(ClientClosedError):
        producer.send("t", b"plain")
    with pytest.raises(ClientClosedError):
        producer.send("t", b"keyed", key=b"k")


# -- send futures against the broker -----------------------------------------------------------


def _create(bootstrap: str, topic: str, partitions: int) -> None:
    from tidelog.client import Admin

    with Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(topic, partitions, 1)])


def test_send_futures_through_wait_as_completed_and_callbacks(broker: Any, topic_name: str) -> None:
    _create(broker.bootstrap, topic_name, 3)
    called: list[concurrent.futures.Future[RecordMetadata]] = []
    lock = threading.Lock()

    def record(future: concurrent.futures.Future[RecordMetadata]) -> None:
        with lock:
            called.append(future)

    with Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20}) as producer:
        producer.send(topic_name, b"first", partition=0).result(timeout=10)  # metadata known
        before = int(time.time() * 1000)
        futures = [producer.send(topic_name, b"value-%d" % i) for i in range(400)]
        assert all(isinstance(f, concurrent.futures.Future) for f in futures)
        # A record is on its way once sent: cancelling is refused, now and later.
        assert not futures[0].cancel() and not futures[0].cancelled()
        for future in futures[::3]:
            future.add_done_callback(record)
        done, not_done = concurrent.futures.wait(futures, timeout=30)
        assert not not_done and done == set(futures)
        completed = list(concurrent.futures.as_completed(futures, timeout=30))
        assert len(completed) == 400 and set(completed) == set(futures)
        after = int(time.time() * 1000)
        metadata = [f.result(timeout=10) for f in futures]
        assert not futures[0].cancel() and not futures[0].cancelled()
        # A callback added once settled runs at once, in this thread.
        late: list[int] = []
        futures[-1].add_done_callback(lambda f: late.append(f.result().offset))
        assert late == [metadata[-1].offset]
    assert sorted(called, key=id) == sorted(futures[::3], key=id)
    assert all(f.exception() is None for f in futures)
    assert all(before <= md.timestamp <= after for md in metadata)
    # Keyless records stick to a partition for a batch: per partition, offsets follow the
    # order of sending and leave no gap.
    for partition in range(3):
        offsets = [md.offset for md in metadata if md.partition == partition]
        first = 1 if partition == 0 else 0
        assert offsets == list(range(first, first + len(offsets)))
    assert sum(1 for md in metadata if md.topic == topic_name) == 400


def test_done_is_seen_by_other_threads_after_flush(broker: Any, topic_name: str) -> None:
    _create(broker.bootstrap, topic_name, 1)
    with Producer({"bootstrap.servers": broker.bootstrap}) as producer:
        futures = [producer.send(topic_name, b"x") for _ in range(200)]
        assert producer.flush(30) == 0
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            seen = list(pool.map(lambda f: (f.done(), f.running(), f.exception(0)), futures))
    assert seen == [(True, False, None)] * 200
    assert [f.result(0).offset for f in futures] == list(range(200))


def test_failed_sends_fail_their_futures(broker: Any, topic_name: str) -> None:
    _create(broker.bootstrap, topic_name, 1)
    with Producer({"bootstrap.servers": broker.bootstrap}) as producer:
        good = producer.send(topic_name, b"fine")
        missing = producer.send(topic_name, b"x", partition=3)
        too_large = producer.send(topic_name, b"x" * 2_000_000)  # above max.request.size
        done, _ = concurrent.futures.wait([missing], timeout=30, return_when=FIRST_EXCEPTION)
        assert done == {missing}
        done, not_done = concurrent.futures.wait([good, too_large], timeout=30)
        assert not not_done
    assert good.result(0).offset == 0
    for future, code in ((missing, "UNKNOWN_TOPIC_OR_PARTITION"), (too_large, "MESSAGE_TOO_LARGE")):
        error = future.exception(0)
        assert isinstance(error, ClientError) and error.code is not None
        assert error.code.name == code
        with pytest.raises(ClientError):
            future.result(0)


def test_plain_and_general_records_keep_their_order(broker: Any, topic_name: str) -> None:
    """Plain records (a topic and a bytes value) and the other kinds (headers, callbacks,
    timestamps, str values) sent from one thread to a one-partition topic land in the order
    they were sent, in batches holding both kinds."""
    _create(broker.bootstrap, topic_name, 1)
    delivered: list[int] = []
    sent: list[tuple[bytes, tuple[tuple[str, bytes | None], ...], int | None]] = []
    with Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 50}) as producer:
        # The topic's metadata known first: records then go straight into batches (before,
        # they all wait for it in one list, whatever their kind).
        producer.send(topic_name, b"v-1").result(timeout=10)
        sent.append((b"v-1", (), None))
        futures = []
        for i in range(300):
            kind = i % 7
            value = b"v%d" % i
            if kind == 1:
                headers = (("n", b"%d" % i),)
                futures.append(producer.send(topic_name, value, headers=list(headers)))
                sent.append((value, headers, None))
            elif kind == 3:
                futures.append(
                    producer.send(topic_name, value, on_delivery=lambda e, md: delivered.append(1))
                )
                sent.append((value, (), None))
            elif kind == 5:
                futures.append(producer.send(topic_name, value, timestamp=1_600_000_000_000 + i))
                sent.append((value, (), 1_600_000_000_000 + i))
            elif kind == 6:
                futures.append(producer.send(topic_name, value.decode()))  # a str value
                sent.append((value, (), None))
            else:
                futures.append(producer.send(topic_name, value))
                sent.append((value, (), None))
        metadata = [f.result(timeout=30) for f in futures]
    assert [md.offset for md in metadata] == list(range(1, 301))
    assert len(delivered) == sum(1 for i in range(300) if i % 7 == 3)
    with Consumer({"bootstrap.servers": broker.bootstrap, "auto.offset.reset": "earliest"}) as c:
        c.assign([TopicPartition(topic_name, 0)])
        records: list[Any] = []
        deadline = time.monotonic() + 15
        while len(records) < 301 and time.monotonic() < deadline:
            records += c.poll(0.5)
    assert [(r.value, r.headers) for r in records] == [(v, h) for v, h, _ in sent]
    for record, md, (_, _, timestamp) in zip(records[1:], metadata, sent[1:], strict=True):
        assert record.timestamp == md.timestamp
        if timestamp is not None:
            assert record.timestamp == timestamp
