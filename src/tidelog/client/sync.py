"""Synchronous facades: each runs its asyncio core on an event loop in a background thread.

A facade method submits the matching coroutine to that loop and blocks for its result.
``Producer.send`` hands the record to the loop and returns a ``concurrent.futures.Future``;
it blocks only while ``buffer.memory`` is used up, for at most ``max.block.ms``. Records sent
from one thread keep their order (the loop runs the hand-offs in the order they were made).
Delivery callbacks run on the loop's thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
import threading
from collections.abc import Coroutine, Iterable, Mapping
from typing import Any, TypeVar

from tidelog.client.aio.admin import AIOAdmin, ClusterDescription
from tidelog.client.aio.consumer import AIOConsumer, listener_in_threads
from tidelog.client.aio.producer import (
    AIOProducer,
    DeliveryCallback,
    DeliveryFuture,
    HeaderList,
)
from tidelog.client.cluster import BrokerInfo, TopicInfo
from tidelog.client.errors import ClientClosedError, ClientError
from tidelog.client.groups import (
    ConsumerGroupMetadata,
    GroupDescription,
    GroupListing,
    OffsetAndMetadata,
)
from tidelog.client.membership import RebalanceListener
from tidelog.client.offsets import OffsetSpec
from tidelog.client.types import (
    AlterConfigOp,
    ConfigEntry,
    ConfigResource,
    ConsumerRecord,
    ListOffsetsResult,
    LogDirDescription,
    NewTopic,
    PartitionReassignment,
    ProducerState,
    QuorumInfo,
    RecordMetadata,
    TopicPartition,
    TransactionDescription,
    TransactionListing,
)
from tidelog.protocol.acls import AclBinding, AclBindingFilter

T = TypeVar("T")


class _LoopThread:
    """An event loop running forever in a daemon thread until :meth:`stop`."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()
        self.loop.close()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if self.loop.is_closed() or not self._thread.is_alive():
            coro.close()
            raise ClientClosedError("the client is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no result within {timeout}s") from None

    def stop(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            if threading.current_thread() is not self._thread:
                self._thread.join()


async def _construct(factory: Any, config: Mapping[str, Any] | None, kwargs: Any) -> Any:
    # The cores create asyncio primitives; build them on the loop that will run them.
    return factory(config, **kwargs)


class _Facade:
    _kind = "client"

    def __init__(self, factory: Any, config: Mapping[str, Any] | None, kwargs: Any) -> None:
        self._thread = _LoopThread(f"tidelog-{self._kind}")
        try:
            self._core = self._thread.run(_construct(factory, config, kwargs))
        except BaseException:
            self._thread.stop()
            raise
        self._closed = False

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if self._closed:
            coro.close()
            raise ClientClosedError(f"the {self._kind} is closed")
        return self._thread.run(coro, timeout)

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._run(self._core.close())
        finally:
            self._closed = True
            self._thread.stop()


class Producer(_Facade):
    """Synchronous producer; see :class:`~tidelog.client.aio.AIOProducer`.

    ``send`` checks and serializes the record in the caller's thread, reserves its bytes in
    ``buffer.memory`` (blocking up to ``max.block.ms`` while the buffer is full, then raising
    :class:`~tidelog.client.aio.producer.BufferExhaustedError`) and hands it to the loop;
    records sent from one thread keep their order.
    """

    _kind = "producer"
    _core: AIOProducer

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(AIOProducer, config, kwargs)
        self._loop = self._thread.loop
        self._sending = True  # until close() begins
        # The core's sender does the whole send of a plain record (a topic, a bytes value,
        # maybe a callback) and passes any other on to _send_general. Unless a subclass
        # overrides send, it *is* this producer's send: a send is then one Python call, not
        # two (a tenth of a plain record's cost).
        self._send = fast = self._core.plain_sender(self._loop, self._send_general)
        if type(self).send is Producer.send:
            fast.__doc__ = Producer.send.__doc__
            self.send = fast  # type: ignore[method-assign,assignment]

    def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        headers: HeaderList | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> concurrent.futures.Future[RecordMetadata]:
        """Queue one record; the future resolves once the broker acknowledged it.

        The future is running from the start: ``cancel()`` returns False (the record is on
        its way and is delivered or fails regardless)."""
        future = self._send(topic, value, key, headers, partition, timestamp, on_delivery)
        assert future is not None  # _send_general always answers
        return future

    def _send_general(
        self,
        topic: str,
        value: Any,
        key: Any,
        headers: HeaderList | None,
        partition: int | None,
        timestamp: int | None,
        on_delivery: DeliveryCallback | None,
    ) -> DeliveryFuture:
        """A record that is not plain: checked and serialized here, handed over as it is."""
        if not self._sending:
            raise ClientClosedError("the producer is closed")
        core = self._core
        key, value, record_headers, size = core.prepare(topic, value, key, headers, partition)
        future = DeliveryFuture()
        item = (topic, key, value, record_headers, partition, timestamp, on_delivery, future, size)
        core.hand_over(self._loop, item, size)
        return future

    def flush(self, timeout: float | None = None) -> int:
        """Wait until every record sent so far is acknowledged; returns how many are not."""
        return self._run(self._core.flush(timeout))

    @property
    def idempotent(self) -> bool:
        return self._core.idempotent

    # -- transactions (transactional.id; docs/transactions.md §10) ---------------------------

    def init_transactions(self, timeout: float | None = None) -> None:
        self._run(self._core.init_transactions(timeout))

    def begin_transaction(self) -> None:
        self._run(_call(self._core.begin_transaction))

    def send_offsets_to_transaction(
        self,
        offsets: Mapping[TopicPartition, OffsetAndMetadata | int],
        group: str | ConsumerGroupMetadata,
        timeout: float | None = None,
    ) -> None:
        self._run(self._core.send_offsets_to_transaction(dict(offsets), group, timeout))

    def commit_transaction(self, timeout: float | None = None) -> None:
        self._run(self._core.commit_transaction(timeout))

    def abort_transaction(self, timeout: float | None = None) -> None:
        self._run(self._core.abort_transaction(timeout))

    def close(self, timeout: float | None = None) -> None:
        if self._closed:
            return
        self._sending = False
        self._core.refuse_sends()
        try:
            self._run(self._core.close(timeout))
        finally:
            self._closed = True
            self._thread.stop()


class Consumer(_Facade):
    """Synchronous consumer; see :class:`~tidelog.client.aio.AIOConsumer`.

    Rebalance listener callbacks run in a worker thread while the poll that triggered them
    waits, so they may call this consumer (commit, seek, position).
    """

    _kind = "consumer"
    _core: AIOConsumer

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(AIOConsumer, config, kwargs)

    def group_metadata(self) -> ConsumerGroupMetadata:
        return self._core.group_metadata()

    def subscribe(
        self,
        topics: Iterable[str] | str | None = None,
        listener: RebalanceListener | None = None,
        *,
        pattern: str | re.Pattern[str] | None = None,
    ) -> None:
        """Join ``group.id`` consuming ``topics`` (or the topics matching ``pattern``)."""
        names = topics if topics is None or isinstance(topics, str) else list(topics)
        threaded = None if listener is None else listener_in_threads(listener)
        self._run(_call_kw(self._core.subscribe, names, pattern=pattern, listener=threaded))

    def unsubscribe(self) -> None:
        self._run(self._core.unsubscribe())

    def subscription(self) -> set[str]:
        return self._run(_call(self._core.subscription))

    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        self._run(_call(self._core.assign, list(partitions)))

    def assignment(self) -> set[TopicPartition]:
        return self._run(_call(self._core.assignment))

    def seek(self, partition: TopicPartition | tuple[str, int], offset: int) -> None:
        self._run(_call(self._core.seek, partition, offset))

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self._run(self._core.seek_to_beginning(*partitions))

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        self._run(self._core.seek_to_end(*partitions))

    def seek_to_timestamp(self, timestamp_ms: int, *partitions: TopicPartition) -> None:
        self._run(self._core.seek_to_timestamp(timestamp_ms, *partitions))

    def position(self, partition: TopicPartition | tuple[str, int]) -> int:
        return self._run(self._core.position(partition))

    def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, ListOffsetsResult | None]:
        return self._run(self._core.offsets_for_times(timestamps))

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self._run(self._core.beginning_offsets(list(partitions)))

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self._run(self._core.end_offsets(list(partitions)))

    def poll(self, timeout: float = 0.0, max_records: int | None = None) -> list[ConsumerRecord]:
        """Records, waiting at most ``timeout`` seconds for some; :meth:`wakeup` from another
        thread makes it raise WakeupError."""
        return self._run(self._core.poll(int(timeout * 1000), max_records))

    def wakeup(self) -> None:
        """Interrupt the poll running in another thread (or else the next one)."""
        if not self._closed:
            self._thread.loop.call_soon_threadsafe(self._core.wakeup)

    def pause(self, *partitions: TopicPartition) -> None:
        self._run(_call(self._core.pause, *partitions))

    def resume(self, *partitions: TopicPartition) -> None:
        self._run(_call(self._core.resume, *partitions))

    def paused(self) -> set[TopicPartition]:
        return self._run(_call(self._core.paused))

    def commit(
        self,
        offsets: Mapping[TopicPartition, OffsetAndMetadata | int] | None = None,
        asynchronous: bool = False,
    ) -> (
        dict[TopicPartition, OffsetAndMetadata]
        | concurrent.futures.Future[dict[TopicPartition, OffsetAndMetadata]]
    ):
        """Commit ``offsets`` (default: the positions of every assigned partition). With
        ``asynchronous`` the commit is sent in the background and a Future is returned."""
        wanted = None if offsets is None else dict(offsets)
        if not asynchronous:
            committed = self._run(self._core.commit(wanted))
            assert isinstance(committed, dict)
            return committed

        async def start() -> asyncio.Task[dict[TopicPartition, OffsetAndMetadata]]:
            task = await self._core.commit(wanted, asynchronous=True)
            assert isinstance(task, asyncio.Task)
            return task

        result: concurrent.futures.Future[dict[TopicPartition, OffsetAndMetadata]]
        result = concurrent.futures.Future()
        task = self._run(start())

        def settle(source: asyncio.Task[dict[TopicPartition, OffsetAndMetadata]]) -> None:
            if not result.set_running_or_notify_cancel():
                return
            if source.cancelled():
                result.set_exception(concurrent.futures.CancelledError())
            elif (error := source.exception()) is not None:
                result.set_exception(error)
            else:
                result.set_result(source.result())

        self._thread.loop.call_soon_threadsafe(task.add_done_callback, settle)
        return result

    def committed(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        return self._run(self._core.committed(list(partitions)))

    def partitions_for(self, topic: str) -> list[int]:
        async def partitions() -> list[int]:
            info = await self._core.cluster.topic(topic)
            return [p.partition for p in info.partitions]

        return self._run(partitions())


async def _call_kw(function: Any, *args: Any, **kwargs: Any) -> Any:
    return function(*args, **kwargs)


class Admin(_Facade):
    """Synchronous admin client; see :class:`~tidelog.client.aio.AIOAdmin`."""

    _kind = "admin"
    _core: AIOAdmin

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(AIOAdmin, config, kwargs)

    def create_topics(
        self,
        topics: Iterable[NewTopic],
        *,
        validate_only: bool = False,
        timeout_ms: int | None = None,
    ) -> None:
        self._run(
            self._core.create_topics(
                list(topics), validate_only=validate_only, timeout_ms=timeout_ms
            )
        )

    def delete_topics(self, names: Iterable[str], *, timeout_ms: int | None = None) -> None:
        self._run(self._core.delete_topics(list(names), timeout_ms=timeout_ms))

    def list_topics(self, *, include_internal: bool = False) -> list[str]:
        return self._run(self._core.list_topics(include_internal=include_internal))

    def describe_topics(self, names: Iterable[str] | None = None) -> dict[str, TopicInfo]:
        return self._run(self._core.describe_topics(None if names is None else list(names)))

    def create_partitions(
        self, new_totals: Mapping[str, int], *, validate_only: bool = False
    ) -> None:
        self._run(self._core.create_partitions(dict(new_totals), validate_only=validate_only))

    def elect_leaders(
        self, election_type: str, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, ClientError | None]:
        wanted = None if partitions is None else list(partitions)
        result: dict[TopicPartition, ClientError | None] = self._run(
            self._core.elect_leaders(election_type, wanted)
        )
        return result

    def alter_partition_reassignments(
        self, targets: Mapping[TopicPartition, Iterable[int] | None]
    ) -> None:
        frozen = {tp: None if r is None else list(r) for tp, r in targets.items()}
        self._run(self._core.alter_partition_reassignments(frozen))

    def list_partition_reassignments(
        self, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, PartitionReassignment]:
        wanted = None if partitions is None else list(partitions)
        result: dict[TopicPartition, PartitionReassignment] = self._run(
            self._core.list_partition_reassignments(wanted)
        )
        return result

    def describe_configs(
        self, resources: Iterable[ConfigResource], *, keys: Iterable[str] | None = None
    ) -> dict[ConfigResource, dict[str, ConfigEntry]]:
        return self._run(self._core.describe_configs(list(resources), keys=keys))

    def alter_configs(
        self,
        changes: Mapping[ConfigResource, Iterable[AlterConfigOp]],
        *,
        validate_only: bool = False,
    ) -> None:
        frozen = {r: list(ops) for r, ops in changes.items()}
        self._run(self._core.alter_configs(frozen, validate_only=validate_only))

    def list_offsets(
        self,
        specs: Mapping[TopicPartition, OffsetSpec],
        *,
        isolation_level: str = "read_uncommitted",
    ) -> dict[TopicPartition, ListOffsetsResult]:
        return self._run(self._core.list_offsets(dict(specs), isolation_level=isolation_level))

    def describe_cluster(self, *, include_fenced_brokers: bool = False) -> ClusterDescription:
        return self._run(self._core.describe_cluster(include_fenced_brokers=include_fenced_brokers))

    def describe_quorum(self) -> QuorumInfo:
        quorum: QuorumInfo = self._run(self._core.describe_quorum())
        return quorum

    def describe_log_dirs(self, node_id: int) -> list[LogDirDescription]:
        return self._run(self._core.describe_log_dirs(node_id))

    def find_coordinator(self, group: str) -> BrokerInfo:
        return self._run(self._core.find_coordinator(group))

    def list_groups(self, states: Iterable[str] | None = None) -> list[GroupListing]:
        return self._run(self._core.list_groups(None if states is None else list(states)))

    def describe_groups(self, group_ids: Iterable[str]) -> dict[str, GroupDescription]:
        return self._run(self._core.describe_groups(list(group_ids)))

    def list_consumer_group_offsets(
        self, group: str, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        wanted = None if partitions is None else list(partitions)
        return self._run(self._core.list_consumer_group_offsets(group, wanted))

    def alter_consumer_group_offsets(
        self, group: str, offsets: Mapping[TopicPartition, OffsetAndMetadata | int]
    ) -> None:
        self._run(self._core.alter_consumer_group_offsets(group, dict(offsets)))

    def delete_consumer_group_offsets(
        self, group: str, partitions: Iterable[TopicPartition]
    ) -> None:
        self._run(self._core.delete_consumer_group_offsets(group, list(partitions)))

    def delete_groups(self, group_ids: Iterable[str]) -> None:
        self._run(self._core.delete_groups(list(group_ids)))

    def list_transactions(
        self,
        *,
        states: Iterable[str] | None = None,
        producer_ids: Iterable[int] | None = None,
        duration_filter_ms: int = -1,
    ) -> list[TransactionListing]:
        result: list[TransactionListing] = self._run(
            self._core.list_transactions(
                states=None if states is None else list(states),
                producer_ids=None if producer_ids is None else list(producer_ids),
                duration_filter_ms=duration_filter_ms,
            )
        )
        return result

    def describe_transactions(
        self, transactional_ids: Iterable[str]
    ) -> dict[str, TransactionDescription]:
        result: dict[str, TransactionDescription] = self._run(
            self._core.describe_transactions(list(transactional_ids))
        )
        return result

    def describe_producers(
        self, partitions: Iterable[TopicPartition], *, broker_id: int | None = None
    ) -> dict[TopicPartition, list[ProducerState]]:
        result: dict[TopicPartition, list[ProducerState]] = self._run(
            self._core.describe_producers(list(partitions), broker_id=broker_id)
        )
        return result

    def abort_transaction(
        self,
        partition: TopicPartition,
        *,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
    ) -> None:
        self._run(
            self._core.abort_transaction(
                partition,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                coordinator_epoch=coordinator_epoch,
            )
        )

    def alter_user_scram_credentials(
        self,
        upsertions: Iterable[tuple[str, str, int, str]] = (),
        deletions: Iterable[tuple[str, str]] = (),
    ) -> None:
        self._run(self._core.alter_user_scram_credentials(list(upsertions), list(deletions)))

    def describe_user_scram_credentials(
        self, users: Iterable[str] | None = None
    ) -> dict[str, list[tuple[str, int]]]:
        wanted = None if users is None else list(users)
        result: dict[str, list[tuple[str, int]]] = self._run(
            self._core.describe_user_scram_credentials(wanted)
        )
        return result

    def alter_client_quotas(
        self,
        alterations: Iterable[tuple[Mapping[str, str | None], Mapping[str, float | None]]],
        *,
        validate_only: bool = False,
    ) -> None:
        self._run(self._core.alter_client_quotas(list(alterations), validate_only=validate_only))

    def describe_client_quotas(
        self, components: Iterable[tuple[str, int, str | None]] = (), *, strict: bool = False
    ) -> list[tuple[dict[str, str | None], dict[str, float]]]:
        result: list[tuple[dict[str, str | None], dict[str, float]]] = self._run(
            self._core.describe_client_quotas(list(components), strict=strict)
        )
        return result

    def create_acls(self, bindings: Iterable[AclBinding]) -> None:
        self._run(self._core.create_acls(list(bindings)))

    def describe_acls(self, acl_filter: AclBindingFilter | None = None) -> list[AclBinding]:
        result: list[AclBinding] = self._run(self._core.describe_acls(acl_filter))
        return result

    def delete_acls(self, filters: Iterable[AclBindingFilter]) -> list[list[AclBinding]]:
        result: list[list[AclBinding]] = self._run(self._core.delete_acls(list(filters)))
        return result


async def _call(function: Any, *args: Any) -> Any:
    return function(*args)
