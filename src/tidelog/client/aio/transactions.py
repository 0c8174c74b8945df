"""The transactional side of :class:`~tidelog.client.aio.producer.AIOProducer`: Kafka's
``TransactionManager`` (see ``docs/transactions.md`` §10).

States: UNINITIALIZED -> (init_transactions) READY -> (begin_transaction) IN_TRANSACTION ->
(commit/abort) READY, with ABORTABLE (a record of the transaction failed: only an abort
ends it) and FATAL (fenced by a newer producer of the id: only close). Requests go to the
transactional id's coordinator (FindCoordinator key type 1), looked up again whenever it
moves; retriable answers are retried with a backoff until the caller's timeout.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tidelog.client.cluster import GROUP_KEY, TRANSACTION_KEY, find_coordinator
from tidelog.client.connection import Connection
from tidelog.client.errors import BrokerConnectionError, ClientError, broker_error
from tidelog.client.groups import ConsumerGroupMetadata, OffsetAndMetadata
from tidelog.client.types import TopicPartition
from tidelog.protocol import ApiKey, ErrorCode

if TYPE_CHECKING:
    from tidelog.client.aio.producer import AIOProducer

# The coordinator moved, is loading, or is still ending the previous transaction: ask again.
_RETRY = frozenset(
    {
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.CONCURRENT_TRANSACTIONS,
    }
)
_MOVED = frozenset({ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NOT_COORDINATOR})
# A newer producer of the id exists, or this one may not use it: nothing but close is left.
FATAL = frozenset(
    {
        ErrorCode.PRODUCER_FENCED,
        ErrorCode.INVALID_PRODUCER_EPOCH,
        ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        ErrorCode.INVALID_PRODUCER_ID_MAPPING,
    }
)
# AddPartitionsToTxn: v4 batches several producers (a broker's call); one producer is v3.
_MAX_ADD_PARTITIONS_VERSION = 3
_MAX_BACKOFF_S = 1.0


class TxnState(enum.Enum):
    UNINITIALIZED = "uninitialized"
    READY = "ready"
    IN_TRANSACTION = "in a transaction"
    ABORTABLE = "failed inside its transaction (abort it)"
    FATAL = "fenced"


class TransactionManager:
    """One producer's transactional state and requests; runs on the producer's loop."""

    def __init__(self, producer: AIOProducer, transactional_id: str, timeout_ms: int) -> None:
        self.producer = producer
        self.transactional_id = transactional_id
        self.timeout_ms = timeout_ms
        self.state = TxnState.UNINITIALIZED
        self.error: ClientError | None = None
        #: partitions in the current transaction, and those waiting to be added
        self.added: set[TopicPartition] = set()
        self.pending: set[TopicPartition] = set()
        self._adding = False  # an AddPartitionsToTxn task runs
        self._offsets_added = False
        self._coordinator: Connection | None = None

    # -- what the producer asks ------------------------------------------------------------

    @property
    def accepts_records(self) -> bool:
        return self.state is TxnState.IN_TRANSACTION

    def refusal(self) -> ClientError:
        """Why a record sent now is refused."""
        if self.error is not None and self.state in (TxnState.FATAL, TxnState.ABORTABLE):
            return self.error
        return ClientError(
            f"transactional producer {self.transactional_id!r} is {self.state.value}: "
            "records go only inside a transaction (begin_transaction)"
        )

    def may_send(self, tp: TopicPartition) -> bool:
        """Whether a batch of ``tp`` may go out now; if its partition is not in the
        transaction yet, it is added (AddPartitionsToTxn) and the batch waits."""
        if tp in self.added:
            return True
        if self.state is TxnState.IN_TRANSACTION:
            self.pending.add(tp)
            if not self._adding:
                self._adding = True
                self.producer.spawn(self._add_partitions())
        return False

    def record_failed(self, error: ClientError) -> None:
        """A record of the transaction failed: only an abort can end it now."""
        if self.state is TxnState.IN_TRANSACTION:
            self._fail(error, fatal=error.code in FATAL)

    # -- the API ---------------------------------------------------------------------------

    async def init(self, timeout: float) -> None:
        if self.state is TxnState.FATAL:
            raise self.refusal()
        if self.state is not TxnState.UNINITIALIZED and self.state is not TxnState.READY:
            raise ClientError(f"init_transactions: the producer is {self.state.value}")
        await self._init_producer_id(time.monotonic() + timeout, bump=False)
        self.state = TxnState.READY
        self._sync_flags()

    def begin(self) -> None:
        if self.state is not TxnState.READY:
            raise (
                self.refusal()
                if self.state is TxnState.FATAL
                else ClientError(f"begin_transaction: the producer is {self.state.value}")
            )
        self.state = TxnState.IN_TRANSACTION
        self.added.clear()
        self.pending.clear()
        self._offsets_added = False
        self._sync_flags()

    async def send_offsets(
        self, offsets: Mapping[TopicPartition, OffsetAndMetadata | int],
        member: ConsumerGroupMetadata, timeout: float,
    ) -> None:  # fmt: skip
        if self.state is not TxnState.IN_TRANSACTION:
            raise self.refusal()
        try:
            await self._send_offsets(offsets, member, timeout)
        except ClientError as exc:
            # The offsets may or may not be in the transaction now: only an abort is safe.
            if self.state is TxnState.IN_TRANSACTION:
                self._fail(exc, fatal=False)
            raise

    async def _send_offsets(
        self, offsets: Mapping[TopicPartition, OffsetAndMetadata | int],
        member: ConsumerGroupMetadata, timeout: float,
    ) -> None:  # fmt: skip
        group_id = member.group_id
        deadline = time.monotonic() + timeout
        p = self.producer
        await self._call(
            ApiKey.ADD_OFFSETS_TO_TXN,
            lambda _v: {
                "transactional_id": self.transactional_id,
                "producer_id": p.producer_id,
                "producer_epoch": p.producer_epoch,
                "group_id": group_id,
            },
            lambda r: ErrorCode.from_wire(int(r.error_code)),
            deadline,
        )
        self._offsets_added = True
        by_topic: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for tp, o in offsets.items():
            offset = o if isinstance(o, OffsetAndMetadata) else OffsetAndMetadata(int(o))
            by_topic[tp[0]].append(
                {
                    "partition_index": tp[1],
                    "committed_offset": offset.offset,
                    "committed_leader_epoch": offset.leader_epoch,
                    "committed_metadata": offset.metadata,
                }
            )

        def commit_error(response: Any) -> ErrorCode:
            for t in response.topics:
                for part in t.partitions:
                    code = ErrorCode.from_wire(int(part.error_code))
                    if code is not ErrorCode.NONE:
                        return code
            return ErrorCode.NONE

        await self._call(
            ApiKey.TXN_OFFSET_COMMIT,
            lambda _v: {
                "transactional_id": self.transactional_id,
                "group_id": group_id,
                "producer_id": p.producer_id,
                "producer_epoch": p.producer_epoch,
                "generation_id": member.generation_id,
                "member_id": member.member_id,
                "group_instance_id": member.group_instance_id,
                "topics": [{"name": t, "partitions": parts} for t, parts in by_topic.items()],
            },
            commit_error,
            deadline,
            key=group_id,
            key_type=GROUP_KEY,
        )

    async def commit(self, timeout: float) -> None:
        if self.state is not TxnState.IN_TRANSACTION:
            raise self.refusal()
        deadline = time.monotonic() + timeout
        left = await self.producer.flush(max(deadline - time.monotonic(), 0))
        if self.state is not TxnState.IN_TRANSACTION:
            raise self.refusal()
        if left:
            raise ClientError(
                f"commit_transaction: {left} records not acknowledged in time",
                code=ErrorCode.REQUEST_TIMED_OUT,
            )
        await self._end(True, deadline)

    async def abort(self, timeout: float) -> None:
        if self.state not in (TxnState.IN_TRANSACTION, TxnState.ABORTABLE):
            raise self.refusal()
        deadline = time.monotonic() + timeout
        was = self.state
        self.state = TxnState.ABORTABLE  # nothing more goes out in this transaction
        self._sync_flags()
        aborted = self.error or ClientError("the transaction was aborted")
        self.producer.fail_unsent(aborted)
        await self.producer.flush(max(deadline - time.monotonic(), 0))
        await self._end(False, deadline)
        if was is TxnState.ABORTABLE or self.producer.needs_new_sequences:
            # Sequences may have gaps: start over under a bumped epoch (KIP-360).
            await self._init_producer_id(deadline, bump=True)
        self.error = None

    # -- requests --------------------------------------------------------------------------

    async def _end(self, commit: bool, deadline: float) -> None:
        p = self.producer
        if self.added or self._offsets_added:
            await self._call(
                ApiKey.END_TXN,
                lambda _v: {
                    "transactional_id": self.transactional_id,
                    "producer_id": p.producer_id,
                    "producer_epoch": p.producer_epoch,
                    "committed": commit,
                },
                lambda r: ErrorCode.from_wire(int(r.error_code)),
                deadline,
            )
        self.state = TxnState.READY
        self.added.clear()
        self.pending.clear()
        self._offsets_added = False
        self._sync_flags()

    async def _init_producer_id(self, deadline: float, *, bump: bool) -> None:
        p = self.producer

        def values(version: int) -> dict[str, Any]:
            keep = bump and version >= 3 and p.producer_id >= 0
            return {
                "transactional_id": self.transactional_id,
                "transaction_timeout": self.timeout_ms,
                "producer_id": p.producer_id if keep else -1,
                "producer_epoch": p.producer_epoch if keep else -1,
            }

        response = await self._call(
            ApiKey.INIT_PRODUCER_ID,
            values,
            lambda r: ErrorCode.from_wire(int(r.error_code)),
            deadline,
        )
        p.set_producer(int(response.producer_id), int(response.producer_epoch))

    async def _add_partitions(self) -> None:
        try:
            await self._add_pending()
        finally:
            self._adding = False

    async def _add_pending(self) -> None:
        p = self.producer
        while self.pending and self.state is TxnState.IN_TRANSACTION:
            adding = set(self.pending)
            by_topic: dict[str, list[int]] = defaultdict(list)
            for tp in sorted(adding):
                by_topic[tp.topic].append(tp.partition)

            def first_error(response: Any) -> ErrorCode:
                for t in response.results_by_topic_v3_and_below:
                    for part in t.results_by_partition:
                        code = ErrorCode.from_wire(int(part.partition_error_code))
                        if code is not ErrorCode.NONE:
                            return code
                return ErrorCode.NONE

            request = {
                "v3_and_below_transactional_id": self.transactional_id,
                "v3_and_below_producer_id": p.producer_id,
                "v3_and_below_producer_epoch": p.producer_epoch,
                "v3_and_below_topics": [
                    {"name": t, "partitions": parts} for t, parts in by_topic.items()
                ],
            }
            try:
                await self._call(
                    ApiKey.ADD_PARTITIONS_TO_TXN,
                    lambda _v, request=request: request,  # type: ignore[misc]
                    first_error,
                    time.monotonic() + p.delivery_timeout,
                    max_version=_MAX_ADD_PARTITIONS_VERSION,
                )
            except ClientError as exc:
                self._fail(exc, fatal=exc.code in FATAL)
                return
            self.added |= adding
            self.pending -= adding
            p.wake()

    async def _call(
        self,
        api: ApiKey,
        values: Callable[[int], Mapping[str, Any]],
        error_of: Callable[[Any], ErrorCode],
        deadline: float,
        *,
        key: str | None = None,
        key_type: int = TRANSACTION_KEY,
        max_version: int | None = None,
    ) -> Any:
        """``api`` to the coordinator of ``key`` (default: the transactional id), retried
        while it moves, loads or is busy, until ``deadline``; a fatal answer fences the
        producer."""
        attempt = 0
        lookup = self.transactional_id if key is None else key
        while True:
            try:
                conn = await self._coordinator_of(lookup, key_type)
                version = conn.version(api)
                if max_version is not None:
                    version = min(version, max_version)
                response = await conn.call(api, values(version), version=version)
                code = error_of(response)
                if code is ErrorCode.NONE:
                    return response
                raise broker_error(code, context=f"{api.name} for {self.transactional_id!r}")
            except ClientError as exc:
                error = exc
                code = exc.code or ErrorCode.UNKNOWN_SERVER_ERROR
                lost = isinstance(exc, BrokerConnectionError)
                if key_type == TRANSACTION_KEY and (lost or code in _MOVED):
                    self._coordinator = None
            if code in FATAL:
                self._fail(error, fatal=True)
                raise error
            retriable = code in _RETRY or lost
            delay = min(self.producer.retry_backoff * 2**attempt, _MAX_BACKOFF_S)
            if not retriable or time.monotonic() + delay > deadline:
                raise error
            await asyncio.sleep(delay)
            attempt += 1

    async def _coordinator_of(self, key: str, key_type: int) -> Connection:
        if key_type == TRANSACTION_KEY and self._coordinator is not None:
            return self._coordinator
        cluster = self.producer.cluster
        if not cluster.metadata.brokers:
            await cluster.refresh([])
        node = (await find_coordinator(cluster, key, key_type)).node_id
        if node not in cluster.metadata.brokers:
            await cluster.refresh([])
        found = await cluster.connection(node)
        if key_type == TRANSACTION_KEY:
            self._coordinator = found
        return found

    def _fail(self, error: ClientError, *, fatal: bool) -> None:
        if self.state is TxnState.FATAL:
            return
        self.state = TxnState.FATAL if fatal else TxnState.ABORTABLE
        self.error = error
        self._sync_flags()
        self.producer.fail_unsent(error)

    def _sync_flags(self) -> None:
        self.producer.refusing_records = not self.accepts_records
