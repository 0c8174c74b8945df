"""The transaction APIs through the handlers and the transaction driver, against a real
controller and real partition logs: FindCoordinator (key type 1), InitProducerId with a
transactional id, AddPartitionsToTxn (v0-v4), AddOffsetsToTxn, EndTxn, TxnOffsetCommit,
DescribeTransactions, ListTransactions, markers in the partitions, and a restart.

Each test runs inside one ``asyncio.run``; time is the fake clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from tidelog.broker.broker import Broker
from tidelog.broker.groups import GroupDriver
from tidelog.broker.transactions import TransactionDriver
from tidelog.metadata.controller import OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC, NewTopic
from tidelog.protocol import ApiKey, ErrorCode

from .admin_fixtures import schema
from .conftest import FakeClock, make_batch, produce_request, stored_batches
from .test_groups import call, commit_request, fetch_request, ms32
from .test_groups_restart import open_broker

E = ErrorCode
CONFIG = {"offsets.topic.num.partitions": "3", "transaction.state.log.num.partitions": "3"}


@contextlib.asynccontextmanager
async def running(broker: Broker) -> AsyncIterator[Broker]:
    """The broker with both coordinators started, their topics ready, and a topic "t" of
    2 partitions."""
    broker.groups = GroupDriver(broker)
    broker.transactions = TransactionDriver(broker)
    broker.transaction_verifier = broker.transactions
    await broker.groups.start()
    await broker.transactions.start()
    try:
        for key_type, key in ((0, "g"), (1, "tx")):
            request = schema("find_coordinator", 3).FindCoordinatorRequest(
                key=key, key_type=key_type
            )
            await call(broker, ApiKey.FIND_COORDINATOR, 3, request)
        await broker.groups.wait_loaded()
        await broker.transactions.wait_loaded()
        if broker.image.topic("t") is None:
            assert broker.controller is not None
            (created,) = broker.controller.create_topics([NewTopic("t", 2, 1)])
            assert created.error.ok
        yield broker
    finally:
        await broker.transactions.stop()
        await broker.groups.stop()


async def settle() -> None:
    """Let marker writes and their fsyncs run."""
    for _ in range(50):
        await asyncio.sleep(0.002)


def init_request(version: int, tid: str | None, timeout_ms: int = 60_000, pid: int = -1,
                 epoch: int = -1) -> Any:  # fmt: skip
    values: dict[str, Any] = {"transactional_id": tid, "transaction_timeout": ms32(timeout_ms)}
    if version >= 3:
        values.update(producer_id=pid, producer_epoch=epoch)
    return schema("init_producer_id", version).InitProducerIdRequest(**values)


async def init(broker: Broker, tid: str, version: int = 4, **kw: Any) -> Any:
    # A re-init during an open transaction answers CONCURRENT_TRANSACTIONS until it is aborted.
    for _ in range(50):
        answer = await call(
            broker, ApiKey.INIT_PRODUCER_ID, version, init_request(version, tid, **kw)
        )
        if answer.error_code != E.CONCURRENT_TRANSACTIONS:
            return answer
        await settle()
    raise AssertionError("InitProducerId kept answering CONCURRENT_TRANSACTIONS")


def add_request(version: int, tid: str, pid: int, epoch: int, parts: dict[str, list[int]]) -> Any:
    module = schema("add_partitions_to_txn", version)
    topics = tuple(
        module.AddPartitionsToTxnTopic(name=t, partitions=tuple(ps)) for t, ps in parts.items()
    )
    if version >= 4:
        return module.AddPartitionsToTxnRequest(
            transactions=(
                module.AddPartitionsToTxnTransaction(
                    transactional_id=tid,
                    producer_id=pid,
                    producer_epoch=epoch,
                    verify_only=True,
                    topics=topics,
                ),
            )
        )
    return module.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=tid,
        v3_and_below_producer_id=pid,
        v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=topics,
    )


def add_errors(answer: Any) -> dict[tuple[str, int], ErrorCode]:
    topics = (
        answer.results_by_transaction[0].topic_results
        if hasattr(answer, "results_by_transaction")
        else answer.results_by_topic_v3_and_below
    )
    return {
        (t.name, p.partition_index): ErrorCode(p.partition_error_code)
        for t in topics
        for p in t.results_by_partition
    }


async def add(broker: Broker, version: int, tid: str, pid: int, epoch: int,
              parts: dict[str, list[int]]) -> dict[tuple[str, int], ErrorCode]:  # fmt: skip
    request = add_request(version, tid, pid, epoch, parts)
    return add_errors(await call(broker, ApiKey.ADD_PARTITIONS_TO_TXN, version, request))


async def end(broker: Broker, version: int, tid: str, pid: int, epoch: int, commit: bool) -> Any:
    request = schema("end_txn", version).EndTxnRequest(
        transactional_id=tid, producer_id=pid, producer_epoch=epoch, committed=commit
    )
    return await call(broker, ApiKey.END_TXN, version, request)


def control_batches(broker: Broker, topic: str, index: int) -> list[Any]:
    return [h for h in stored_batches(broker, topic, index) if h.is_control]


def test_find_coordinator_for_transactions_creates_the_topic(
    tmp_path: Path, clock: FakeClock
) -> None:
    broker, close = open_broker(tmp_path, clock)

    async def scenario() -> None:
        async with running(broker):
            topic = broker.image.topic(TRANSACTION_STATE_TOPIC)
            assert topic is not None
            assert broker.image.topic_config(TRANSACTION_STATE_TOPIC)["cleanup.policy"] == (
                "compact"
            )
            request = schema("find_coordinator", 4).FindCoordinatorRequest(
                key_type=1, coordinator_keys=("a", "b")
            )
            answer = await call(broker, ApiKey.FIND_COORDINATOR, 4, request)
            assert [(c.key, c.error_code, c.node_id) for c in answer.coordinators] == [
                ("a", E.NONE, broker.node_id),
                ("b", E.NONE, broker.node_id),
            ]

    try:
        asyncio.run(scenario())
    finally:
        close()


def test_a_committed_and_an_aborted_transaction_write_markers(
    tmp_path: Path, clock: FakeClock
) -> None:
    broker, close = open_broker(tmp_path, clock)

    async def scenario() -> None:
        async with running(broker):
            first = await init(broker, "tx")
            assert (first.error_code, first.producer_epoch) == (E.NONE, 0)
            pid, epoch = int(first.producer_id), int(first.producer_epoch)
            assert await add(broker, 0, "tx", pid, epoch, {"t": [0, 1]}) == {
                ("t", 0): E.NONE,
                ("t", 1): E.NONE,
            }
            # verify-only (KIP-890, v4): the partitions are in the transaction now
            assert await add(broker, 4, "tx", pid, epoch, {"t": [0]}) == {("t", 0): E.NONE}
            assert (await end(broker, 1, "tx", pid, epoch, True)).error_code == E.NONE
            await settle()
            assert [len(control_batches(broker, "t", i)) for i in (0, 1)] == [1, 1]
            # a retried EndTxn of the same outcome is answered NONE and writes nothing
            assert (await end(broker, 1, "tx", pid, epoch, True)).error_code == E.NONE
            assert await add(broker, 4, "tx", pid, epoch, {"t": [0]}) == {
                ("t", 0): E.INVALID_TXN_STATE
            }
            assert await add(broker, 3, "tx", pid, epoch, {"t": [1]}) == {("t", 1): E.NONE}
            state = await call(
                broker,
                ApiKey.DESCRIBE_TRANSACTIONS,
                0,
                schema("describe_transactions", 0).DescribeTransactionsRequest(
                    transactional_ids=("tx", "nope")
                ),
            )
            described = {s.transactional_id: s for s in state.transaction_states}
            assert described["tx"].transaction_state == "Ongoing"
            assert described["tx"].producer_id == pid
            assert [(t.topic, t.partitions) for t in described["tx"].topics] == [("t", (1,))]
            assert described["nope"].error_code == E.TRANSACTIONAL_ID_NOT_FOUND
            assert (await end(broker, 4, "tx", pid, epoch, False)).error_code == E.NONE
            await settle()
            assert [len(control_batches(broker, "t", i)) for i in (0, 1)] == [1, 2]

    try:
        asyncio.run(scenario())
    finally:
        close()


def test_reinit_fences_the_old_producer_in_every_version(tmp_path: Path, clock: FakeClock) -> None:
    broker, close = open_broker(tmp_path, clock)

    async def scenario() -> None:
        async with running(broker):
            old = await init(broker, "tx", version=0)
            pid, epoch = int(old.producer_id), int(old.producer_epoch)
            assert await add(broker, 2, "tx", pid, epoch, {"t": [0]}) == {("t", 0): E.NONE}
            new = await init(broker, "tx", version=5)
            assert (new.producer_id, new.producer_epoch) == (pid, epoch + 2)
            await settle()
            # the open transaction was aborted with the fencing epoch
            assert len(control_batches(broker, "t", 0)) == 1
            # PRODUCER_FENCED from v2 (KIP-588), INVALID_PRODUCER_EPOCH before
            assert await add(broker, 2, "tx", pid, epoch, {"t": [1]}) == {
                ("t", 1): E.PRODUCER_FENCED
            }
            assert await add(broker, 1, "tx", pid, epoch, {"t": [1]}) == {
                ("t", 1): E.INVALID_PRODUCER_EPOCH
            }
            assert (await end(broker, 0, "tx", pid, epoch, True)).error_code == (
                E.INVALID_PRODUCER_EPOCH
            )
            too_long = await call(
                broker,
                ApiKey.INIT_PRODUCER_ID,
                4,
                init_request(4, "other", timeout_ms=900_001),
            )
            assert too_long.error_code == E.INVALID_TRANSACTION_TIMEOUT
            unknown = await add(broker, 0, "tx", pid, epoch + 2, {"t": [0], "missing": [0]})
            assert unknown == {
                ("t", 0): E.OPERATION_NOT_ATTEMPTED,
                ("missing", 0): E.UNKNOWN_TOPIC_OR_PARTITION,
            }

    try:
        asyncio.run(scenario())
    finally:
        close()


def txn_commit_request(version: int, tid: str, pid: int, epoch: int, offset: int,
                       generation: int = -1, member: str = "") -> Any:  # fmt: skip
    module = schema("txn_offset_commit", version)
    part: dict[str, Any] = {"partition_index": 0, "committed_offset": offset,
                            "committed_metadata": "m"}  # fmt: skip
    if version >= 2:
        part["committed_leader_epoch"] = -1
    values: dict[str, Any] = {
        "transactional_id": tid,
        "group_id": "g",
        "producer_id": pid,
        "producer_epoch": epoch,
        "topics": (
            module.TxnOffsetCommitRequestTopic(
                name="t", partitions=(module.TxnOffsetCommitRequestPartition(**part),)
            ),
        ),
    }
    if version >= 3:
        values.update(generation_id=generation, member_id=member, group_instance_id=None)
    return module.TxnOffsetCommitRequest(**values)


async def send_offsets(broker: Broker, version: int, pid: int, epoch: int, offset: int,
                       **kw: Any) -> ErrorCode:  # fmt: skip
    answer = await call(
        broker,
        ApiKey.TXN_OFFSET_COMMIT,
        version,
        txn_commit_request(version, "tx", pid, epoch, offset, **kw),
    )
    return ErrorCode(answer.topics[0].partitions[0].error_code)


async def add_offsets(broker: Broker, pid: int, epoch: int) -> ErrorCode:
    request = schema("add_offsets_to_txn", 0).AddOffsetsToTxnRequest(
        transactional_id="tx", producer_id=pid, producer_epoch=epoch, group_id="g"
    )
    return ErrorCode((await call(broker, ApiKey.ADD_OFFSETS_TO_TXN, 0, request)).error_code)


async def committed_offset(broker: Broker, *, require_stable: bool = False) -> tuple[int, Any]:
    request = fetch_request(7, "g", {"t": [0]})
    request = dataclasses.replace(request, require_stable=require_stable)
    answer = await call(broker, ApiKey.OFFSET_FETCH, 7, request)
    partition = answer.topics[0].partitions[0]
    return int(partition.committed_offset), ErrorCode(partition.error_code)


def test_transactional_offsets_count_only_once_committed(tmp_path: Path, clock: FakeClock) -> None:
    broker, close = open_broker(tmp_path, clock)

    async def scenario() -> None:
        async with running(broker):
            r = await init(broker, "tx")
            pid, epoch = int(r.producer_id), int(r.producer_epoch)
            # without AddOffsetsToTxn the offsets partition is not in the transaction
            assert await send_offsets(broker, 3, pid, epoch, 5) == E.INVALID_TXN_STATE
            assert await add_offsets(broker, pid, epoch) == E.NONE
            # KIP-447: a member the group does not know is refused
            assert await send_offsets(broker, 3, pid, epoch, 5, member="ghost") == (
                E.UNKNOWN_MEMBER_ID
            )
            assert await send_offsets(broker, 3, pid, epoch, 5, generation=7) == (
                E.ILLEGAL_GENERATION
            )
            assert await send_offsets(broker, 0, pid, epoch, 5) == E.NONE
            assert await committed_offset(broker) == (-1, E.NONE)
            assert await committed_offset(broker, require_stable=True) == (
                -1,
                E.UNSTABLE_OFFSET_COMMIT,
            )
            assert (await end(broker, 1, "tx", pid, epoch, True)).error_code == E.NONE
            await settle()
            assert await committed_offset(broker, require_stable=True) == (5, E.NONE)
            # an aborted transaction's offsets are dropped
            assert await add_offsets(broker, pid, epoch) == E.NONE
            assert await send_offsets(broker, 4, pid, epoch, 9) == E.NONE
            assert (await end(broker, 1, "tx", pid, epoch, False)).error_code == E.NONE
            await settle()
            assert await committed_offset(broker, require_stable=True) == (5, E.NONE)
            offsets_partition = broker.groups.coordinator.partition_for("g")  # type: ignore[union-attr]
            assert len(control_batches(broker, OFFSETS_TOPIC, offsets_partition)) == 2

    try:
        asyncio.run(scenario())
    finally:
        close()


def test_state_and_offsets_survive_a_restart(tmp_path: Path, clock: FakeClock) -> None:
    broker, close = open_broker(tmp_path, clock)
    ids: dict[str, int] = {}

    async def before() -> None:
        async with running(broker):
            r = await init(broker, "tx")
            pid, epoch = int(r.producer_id), int(r.producer_epoch)
            ids.update(pid=pid, epoch=epoch)
            assert await add_offsets(broker, pid, epoch) == E.NONE
            assert await send_offsets(broker, 3, pid, epoch, 42) == E.NONE
            assert (await end(broker, 1, "tx", pid, epoch, True)).error_code == E.NONE
            await settle()
            r2 = await init(broker, "open")
            assert await add(broker, 3, "open", int(r2.producer_id), 0, {"t": [0]}) == {
                ("t", 0): E.NONE
            }

    async def after() -> None:
        async with running(broker2):
            assert await committed_offset(broker2) == (42, E.NONE)
            listed = await call(
                broker2,
                ApiKey.LIST_TRANSACTIONS,
                1,
                schema("list_transactions", 1).ListTransactionsRequest(
                    state_filters=(), producer_id_filters=(), duration_filter=-1
                ),
            )
            states = {t.transactional_id: t.transaction_state for t in listed.transaction_states}
            assert states == {"tx": "CompleteCommit", "open": "Ongoing"}
            # the same producer goes on: its next InitProducerId bumps the epoch it had
            again = await init(broker2, "tx")
            assert (again.producer_id, again.producer_epoch) == (ids["pid"], ids["epoch"] + 1)

    try:
        asyncio.run(before())
    finally:
        close()
    broker2, close2 = open_broker(tmp_path, clock)
    try:
        asyncio.run(after())
    finally:
        close2()


def test_the_produce_path_asks_the_coordinator(tmp_path: Path, clock: FakeClock) -> None:
    """KIP-890: the verifier the broker uses is the coordinator's."""
    broker, close = open_broker(tmp_path, clock)

    async def scenario() -> None:
        async with running(broker):
            r = await init(broker, "tx")
            pid, epoch = int(r.producer_id), int(r.producer_epoch)
            verifier = broker.transaction_verifier
            assert verifier.verify("tx", pid, epoch, "t", 0) == E.INVALID_TXN_STATE
            await add(broker, 0, "tx", pid, epoch, {"t": [0]})
            assert verifier.verify("tx", pid, epoch, "t", 0) == E.NONE
            assert verifier.verify(None, pid, epoch, "t", 0) == E.INVALID_TXN_STATE

    try:
        asyncio.run(scenario())
    finally:
        close()


def produce_errors(answer: Any) -> dict[tuple[str, int], ErrorCode]:
    return {
        (t.name, p.index): ErrorCode(p.error_code)
        for t in answer.responses
        for p in t.partition_responses
    }


def test_a_delayed_produce_cannot_join_the_next_transaction(
    tmp_path: Path, clock: FakeClock
) -> None:
    """KAFKA-17754: a batch of a committed transaction that arrives late, once the next
    transaction of the same producer (same epoch) is open, is refused; it never becomes part
    of the next transaction."""
    broker, close = open_broker(tmp_path, clock)

    async def produce(pid: int, epoch: int, index: int, seq: int, value: bytes) -> ErrorCode:
        batch = make_batch([value], producer=(pid, epoch, seq), transactional=True)
        request = produce_request(9, {"t": {index: batch}}, acks=-1, transactional_id="tx")
        return produce_errors(await call(broker, ApiKey.PRODUCE, 9, request))[("t", index)]

    async def scenario() -> None:
        async with running(broker):
            r = await init(broker, "tx")
            pid, epoch = int(r.producer_id), int(r.producer_epoch)
            # a partition not added to any transaction: refused (KIP-890 part 1)
            assert await produce(pid, epoch, 0, 0, b"early") == E.INVALID_TXN_STATE
            assert await add(broker, 0, "tx", pid, epoch, {"t": [0, 1]}) == {
                ("t", 0): E.NONE,
                ("t", 1): E.NONE,
            }
            assert await produce(pid, epoch, 0, 0, b"first") == E.NONE
            # the batch for t-1 is "delayed": the producer commits without it
            assert (await end(broker, 1, "tx", pid, epoch, True)).error_code == E.NONE
            await settle()
            assert await add(broker, 0, "tx", pid, epoch, {"t": [0]}) == {("t", 0): E.NONE}
            assert await produce(pid, epoch, 1, 0, b"late") == E.INVALID_TXN_STATE
            # t-1 holds the first transaction's marker and nothing else
            assert [h.is_control for h in stored_batches(broker, "t", 1)] == [True]

    try:
        asyncio.run(scenario())
    finally:
        close()


async def regular_commit(broker: Broker, offset: int) -> ErrorCode:
    answer = await call(broker, ApiKey.OFFSET_COMMIT, 8, commit_request(8, "g", {("t", 0): offset}))
    return ErrorCode(answer.topics[0].partitions[0].error_code)


def test_a_later_regular_commit_wins_over_a_transactions_offset(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Kafka keeps whichever of a transactional and a regular offset record of a partition
    comes later in __consumer_offsets, live and after a restart."""
    broker, close = open_broker(tmp_path, clock)
    ids: dict[str, int] = {}

    async def before() -> None:
        async with running(broker):
            r = await init(broker, "tx")
            pid, epoch = int(r.producer_id), int(r.producer_epoch)
            ids.update(pid=pid, epoch=epoch)
            # regular then transactional: the transaction's offset is later, it wins
            assert await regular_commit(broker, 3) == E.NONE
            assert await add_offsets(broker, pid, epoch) == E.NONE
            assert await send_offsets(broker, 3, pid, epoch, 5) == E.NONE
            assert (await end(broker, 1, "tx", pid, epoch, True)).error_code == E.NONE
            await settle()
            assert await committed_offset(broker) == (5, E.NONE)
            # transactional then regular: the regular one is later, it wins
            assert await add_offsets(broker, pid, epoch) == E.NONE
            assert await send_offsets(broker, 3, pid, epoch, 6) == E.NONE
            assert await regular_commit(broker, 7) == E.NONE
            assert (await end(broker, 1, "tx", pid, epoch, True)).error_code == E.NONE
            await settle()
            assert await committed_offset(broker) == (7, E.NONE)
            # the same across a restart, the marker written after it
            assert await add_offsets(broker, pid, epoch) == E.NONE
            assert await send_offsets(broker, 3, pid, epoch, 8) == E.NONE
            assert await regular_commit(broker, 9) == E.NONE

    async def after() -> None:
        async with running(broker2):
            pid, epoch = ids["pid"], ids["epoch"]
            assert (await end(broker2, 1, "tx", pid, epoch, True)).error_code == E.NONE
            await settle()
            assert await committed_offset(broker2, require_stable=True) == (9, E.NONE)

    try:
        asyncio.run(before())
    finally:
        close()
    broker2, close2 = open_broker(tmp_path, clock)
    try:
        asyncio.run(after())
    finally:
        close2()


def test_a_transaction_stopped_between_prepare_and_complete_completes_after_restart(
    tmp_path: Path, clock: FakeClock
) -> None:
    """The broker stops right after EndTxn is answered (PrepareCommit written, markers
    maybe not): the next start reloads PrepareCommit, writes the markers and completes it,
    so the data becomes readable for read_committed consumers."""
    broker, close = open_broker(tmp_path, clock)
    ids: dict[str, int] = {}

    async def before() -> None:
        async with running(broker):
            r = await init(broker, "tx")
            pid, epoch = int(r.producer_id), int(r.producer_epoch)
            ids.update(pid=pid, epoch=epoch)
            assert await add(broker, 0, "tx", pid, epoch, {"t": [0, 1]}) == {
                ("t", 0): E.NONE,
                ("t", 1): E.NONE,
            }
            for index in (0, 1):
                batch = make_batch([b"v"], producer=(pid, epoch, 0), transactional=True)
                request = produce_request(9, {"t": {index: batch}}, acks=-1, transactional_id="tx")
                assert produce_errors(await call(broker, ApiKey.PRODUCE, 9, request)) == {
                    ("t", index): E.NONE
                }
            assert (await end(broker, 1, "tx", pid, epoch, True)).error_code == E.NONE
            # the context ends at once: the driver stops with the markers in flight or not

    async def after() -> None:
        async with running(broker2):
            for _ in range(100):
                if broker2.transactions.coordinator.describe("tx").state == "CompleteCommit":  # type: ignore[union-attr]
                    break
                await settle()
            described = broker2.transactions.coordinator.describe("tx")  # type: ignore[union-attr]
            assert (described.state, described.producer_epoch) == ("CompleteCommit", ids["epoch"])
            for index in (0, 1):
                partition = broker2.partitions.get("t", index)
                assert partition is not None
                # the transaction has ended here: nothing holds read_committed back
                assert partition.last_stable_offset == partition.log.log_end_offset
                assert any(h.is_control for h in stored_batches(broker2, "t", index))

    try:
        asyncio.run(before())
    finally:
        close()
    broker2, close2 = open_broker(tmp_path, clock)
    try:
        asyncio.run(after())
    finally:
        close2()
