"""The transaction coordinator, sans-io: Kafka's transaction protocol (KIP-98) as a state machine.

Time is injected (every operation takes ``now_ms``; :meth:`TransactionCoordinator.tick` runs
the periodic checks that are due, :meth:`next_deadline` says when), effects are returned
(:class:`~tidelog.coordinator.transactions.api.TxnEffects`), and the state of a
``__transaction_state`` partition is rebuilt by replaying its records
(:meth:`load_partition`). Driver protocol::

    effects = coordinator.end_txn(token, now_ms, request)        # or init_producer_id, ...
    for write in effects.writes:     # append to __transaction_state, in order per partition
        then: coordinator.write_completed(write.write_id, now_ms, error)
    for send in effects.markers:     # write the markers to the transaction's partitions
        then: coordinator.markers_completed(send.send_id, now_ms, {partition: error})
    for completion in effects.completions:
        answer the request that carried completion.token

Who writes what (as in Kafka, transaction protocol version 1):

- InitProducerId: an ``Empty`` record with the id's producer id and a bumped epoch (which
  fences every older producer of the id). An ongoing transaction is aborted first: the epoch
  is bumped in memory (``PrepareEpochFence``), ``PrepareAbort`` is written with it, and the
  request is answered CONCURRENT_TRANSACTIONS; the client retries and gets the next epoch
  once the abort is complete.
- AddPartitionsToTxn / AddOffsetsToTxn: an ``Ongoing`` record with the grown partition set;
  answered once written. A request whose partitions are all in the transaction already is
  answered at once.
- EndTxn: ``PrepareCommit``/``PrepareAbort``, answered once written; then markers to every
  partition of the transaction; once all are written, ``CompleteCommit``/``CompleteAbort``
  with no partitions. Markers that fail are written again after a backoff (a deleted
  partition counts as done). A retried EndTxn of the same outcome is answered NONE once the
  transaction completed, CONCURRENT_TRANSACTIONS while it completes.
- Every ``transaction.abort.timed.out.transaction.cleanup.interval.ms``, an Ongoing
  transaction older than its ``transaction.timeout.ms`` is aborted the way InitProducerId
  aborts one: its epoch bumped, so its producer is fenced.
- Every ``transaction.remove.expired.transaction.cleanup.interval.ms``, an id with no
  transaction (Empty, CompleteCommit, CompleteAbort) idle for
  ``transactional.id.expiration.ms`` gets a tombstone and is forgotten (Dead).

A loaded ``Prepare*`` transaction (the coordinator stopped between the two records) has its
markers written again at load: markers are idempotent for the partition leaders.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence

from tidelog.coordinator.api import GroupRecord, Write
from tidelog.coordinator.errors import TransactionRecordError
from tidelog.coordinator.hashing import partition_for_group
from tidelog.coordinator.replay import KeyValue
from tidelog.coordinator.timers import Timers
from tidelog.coordinator.transactions.api import (
    AddPartitionsRequest,
    AddPartitionsResult,
    DescribedTransaction,
    EndTxnRequest,
    EndTxnResult,
    InitProducerIdRequest,
    InitProducerIdResult,
    ListedTransaction,
    MarkerSend,
    TopicPartition,
    TxnEffects,
)
from tidelog.coordinator.transactions.config import TransactionConfig
from tidelog.coordinator.transactions.records import (
    TransactionLogValue,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)
from tidelog.coordinator.transactions.state import (
    MAX_USABLE_EPOCH,
    TransactionMetadata,
    Transit,
    TxnState,
)
from tidelog.coordinator.writes import PendingWrites
from tidelog.protocol.error_codes import ErrorCode

E = ErrorCode

_ABORT_CHECK = "abort-timed-out"
_EXPIRE_CHECK = "expire-ids"
_MARKER_RETRY = "marker-retry"


_PREPARE = frozenset({TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT})
_NO_TRANSACTION = frozenset({TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT})


def partition_for_transactional_id(transactional_id: str, partitions: int) -> int:
    """The ``__transaction_state`` partition of ``transactional_id``: Kafka's
    ``Utils.abs(transactionalId.hashCode()) % transaction.state.log.num.partitions``, the
    same computation as a group's offsets partition."""
    return partition_for_group(transactional_id, partitions)


def map_write_error(error: ErrorCode) -> ErrorCode:
    """What a client is told when a ``__transaction_state`` append failed (Kafka's
    ``TransactionStateManager`` mapping): retriable coordinator errors, so it asks again."""
    if error in (
        E.UNKNOWN_TOPIC_OR_PARTITION,
        E.NOT_ENOUGH_REPLICAS,
        E.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        E.REQUEST_TIMED_OUT,
    ):
        return E.COORDINATOR_NOT_AVAILABLE
    if error in (E.NOT_LEADER_OR_FOLLOWER, E.KAFKA_STORAGE_ERROR):
        return E.NOT_COORDINATOR
    if error in (E.MESSAGE_TOO_LARGE, E.RECORD_LIST_TOO_LARGE, E.INVALID_FETCH_SIZE):
        return E.UNKNOWN_SERVER_ERROR
    return error


def _record(meta_id: str, t: Transit) -> GroupRecord:
    value = TransactionLogValue(
        producer_id=t.producer_id,
        producer_epoch=t.producer_epoch,
        timeout_ms=t.timeout_ms,
        status=int(t.state),
        partitions=tuple(sorted(t.partitions)),
        last_update_timestamp=t.last_update_timestamp,
        start_timestamp=t.start_timestamp,
        previous_producer_id=t.previous_producer_id,
    )
    return GroupRecord(encode_key(meta_id), encode_value(value))


class TransactionCoordinator:
    """Transactional ids of the ``__transaction_state`` partitions this broker leads.

    ``owned_partitions``: partitions owned from the start with empty state (``None``: all of
    them); others are taken over with :meth:`load_partition`.
    """

    def __init__(
        self,
        config: TransactionConfig | None = None,
        *,
        owned_partitions: Iterable[int] | None = None,
    ) -> None:
        self.config = config or TransactionConfig()
        n = self.config.transaction_state_log_num_partitions
        self._owned: set[int] = set(range(n) if owned_partitions is None else owned_partitions)
        self._loading: set[int] = set()
        #: the leader epoch of each owned partition, stamped on markers
        self._coordinator_epochs: dict[int, int] = dict.fromkeys(self._owned, 0)
        self._txns: dict[str, TransactionMetadata] = {}
        self._timers = Timers()
        self._writes: PendingWrites[TxnEffects] = PendingWrites()
        self._sends: dict[int, str] = {}
        self._next_send_id = 1
        self._started = False
        #: Transactions completed here since start, and the ones aborted for their timeout
        #: (what the broker's metrics report; a reload does not count replayed ones).
        self.committed_count = 0
        self.aborted_count = 0
        self.timed_out_count = 0

    # -- ownership and loading

    def partition_for(self, transactional_id: str) -> int:
        return partition_for_transactional_id(
            transactional_id, self.config.transaction_state_log_num_partitions
        )

    def owned_partitions(self) -> frozenset[int]:
        return frozenset(self._owned)

    def begin_loading(self, partition: int) -> None:
        """Requests for ids of ``partition`` get COORDINATOR_LOAD_IN_PROGRESS until loaded."""
        self._loading.add(partition)

    def load_partition(
        self,
        partition: int,
        records: Iterable[KeyValue],
        now_ms: int,
        coordinator_epoch: int = 0,
    ) -> TxnEffects:
        """Take over ``partition``, rebuilding its ids from its records (oldest first).

        A record that cannot be decoded raises :class:`TransactionRecordError`; the driver
        filters those out before (see :func:`replay_transactions`). Transactions found in a
        Prepare state get their markers written again.
        """
        effects = self.unload_partition(partition)
        for meta in replay_transactions(records, partition).values():
            self._txns[meta.transactional_id] = meta
        self._loading.discard(partition)
        self._owned.add(partition)
        self._coordinator_epochs[partition] = coordinator_epoch
        for meta in list(self._txns.values()):
            if meta.partition == partition and meta.state in _PREPARE:
                self._send_markers(meta, effects)
        return effects

    def unload_partition(self, partition: int) -> TxnEffects:
        """Give ``partition`` up; writes in flight for it are forgotten (their clients are
        answered NOT_COORDINATOR when the driver reports them)."""
        for tid in [t for t, m in self._txns.items() if m.partition == partition]:
            meta = self._txns.pop(tid)
            self._timers.cancel((_MARKER_RETRY, tid))
            meta.pending = None
        self._owned.discard(partition)
        self._loading.discard(partition)
        self._coordinator_epochs.pop(partition, None)
        return TxnEffects()

    def coordinator_error(self, transactional_id: str) -> ErrorCode:
        p = self.partition_for(transactional_id)
        if p in self._loading:
            return E.COORDINATOR_LOAD_IN_PROGRESS
        if p not in self._owned:
            return E.NOT_COORDINATOR
        return E.NONE

    # -- writes and markers

    def write_completed(self, write_id: int, now_ms: int, error: ErrorCode = E.NONE) -> TxnEffects:
        """The driver appended (or failed to append) write ``write_id``."""
        effects = self._writes.complete(write_id, error, now_ms)
        return effects if effects is not None else TxnEffects()

    def pending_write_count(self) -> int:
        return len(self._writes)

    def _write(
        self,
        effects: TxnEffects,
        meta: TransactionMetadata,
        transit: Transit,
        done: Callable[[ErrorCode, int, TxnEffects], None],
    ) -> None:
        """Write ``transit``'s record; once written, apply it to ``meta``. Either way call
        ``done(error, now, out)``, with the client's error (NONE on success) and the effects
        the completion returns, to which ``done`` adds answers, markers and writes."""
        meta.pending = transit.state

        def completed(error: ErrorCode, now: int) -> TxnEffects:
            out = TxnEffects()
            if self._txns.get(meta.transactional_id) is not meta:
                # unloaded meanwhile: the new owner replays the log
                done(E.NOT_COORDINATOR, now, out)
                return out
            meta.pending = None
            if error is not E.NONE:
                done(map_write_error(error), now, out)
                return out
            meta.apply(transit)
            done(E.NONE, now, out)
            return out

        write_id = self._writes.add(completed)
        effects.writes.append(
            Write(write_id, meta.partition, (_record(meta.transactional_id, transit),))
        )

    def markers_completed(
        self, send_id: int, now_ms: int, errors: dict[TopicPartition, ErrorCode]
    ) -> TxnEffects:
        """The markers of ``send_id`` were written; ``errors`` per partition.

        Partitions that took the marker, or no longer exist, are done; the others are tried
        again after ``marker_retry_backoff_ms``. When every partition is done the Complete
        record is written.
        """
        effects = TxnEffects()
        tid = self._sends.pop(send_id, None)
        meta = self._txns.get(tid) if tid is not None else None
        if meta is None or meta.state not in _PREPARE:
            return effects
        for tp, error in errors.items():
            if error in (E.NONE, E.UNKNOWN_TOPIC_OR_PARTITION):
                meta.markers_left.discard(tp)
        meta.markers_in_flight = False
        if meta.markers_left:
            self._timers.schedule(
                (_MARKER_RETRY, tid), now_ms + self.config.marker_retry_backoff_ms
            )
            return effects
        self._complete_transaction(meta, now_ms, effects)
        return effects

    def _send_markers(self, meta: TransactionMetadata, effects: TxnEffects) -> None:
        if not meta.markers_left and not meta.markers_in_flight:
            meta.markers_left = set(meta.partitions)
        send_id = self._next_send_id
        self._next_send_id += 1
        self._sends[send_id] = meta.transactional_id
        meta.markers_in_flight = True
        effects.markers.append(
            MarkerSend(
                send_id,
                meta.transactional_id,
                meta.producer_id,
                meta.producer_epoch,
                self._coordinator_epochs.get(meta.partition, 0),
                meta.state is TxnState.PREPARE_COMMIT,
                tuple(sorted(meta.markers_left)),
            )
        )

    def _complete_transaction(
        self, meta: TransactionMetadata, now_ms: int, effects: TxnEffects
    ) -> None:
        commit = meta.state is TxnState.PREPARE_COMMIT
        target = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        transit = meta.transit(target, now_ms, partitions=frozenset())

        def done(error: ErrorCode, now: int, out: TxnEffects) -> None:
            if error is E.NONE:
                if commit:
                    self.committed_count += 1
                else:
                    self.aborted_count += 1
            elif self._txns.get(meta.transactional_id) is meta:
                # Still Prepare*: the markers are idempotent, so write them again and retry.
                meta.markers_left = set()
                self._timers.schedule(
                    (_MARKER_RETRY, meta.transactional_id),
                    now + self.config.marker_retry_backoff_ms,
                )

        self._write(effects, meta, transit, done)

    # -- timers

    def next_deadline(self) -> int | None:
        return self._timers.next_deadline()

    def tick(self, now_ms: int) -> TxnEffects:
        """Run the checks and retries that are due at ``now_ms``."""
        effects = TxnEffects()
        if not self._started:
            self._started = True
            self._timers.schedule(
                _ABORT_CHECK,
                now_ms + self.config.transaction_abort_timed_out_transaction_cleanup_interval_ms,
            )
            self._timers.schedule(
                _EXPIRE_CHECK,
                now_ms + self.config.transaction_remove_expired_transaction_cleanup_interval_ms,
            )
        while (due := self._timers.pop_due(now_ms)) is not None:
            key, at = due
            if key == _ABORT_CHECK:
                self.abort_timed_out(at, effects)
                self._timers.schedule(
                    _ABORT_CHECK,
                    at + self.config.transaction_abort_timed_out_transaction_cleanup_interval_ms,
                )
            elif key == _EXPIRE_CHECK:
                self.expire_transactional_ids(at, effects)
                self._timers.schedule(
                    _EXPIRE_CHECK,
                    at + self.config.transaction_remove_expired_transaction_cleanup_interval_ms,
                )
            elif isinstance(key, tuple) and key[0] == _MARKER_RETRY:
                meta = self._txns.get(key[1])
                if (
                    meta is not None
                    and meta.pending is None
                    and meta.state in _PREPARE
                    and not meta.markers_in_flight
                ):
                    self._send_markers(meta, effects)
        return effects

    def abort_timed_out(self, now_ms: int, effects: TxnEffects) -> None:
        """Abort every Ongoing transaction older than its timeout, fencing its producer."""
        for meta in list(self._txns.values()):
            if (
                meta.state is TxnState.ONGOING
                and meta.pending is None
                and meta.partition in self._owned
                and meta.start_timestamp + meta.timeout_ms < now_ms
            ):
                self._fence_and_abort(meta, now_ms, effects, timed_out=True)

    def expire_transactional_ids(self, now_ms: int, effects: TxnEffects) -> None:
        """Tombstone every id with no transaction idle for ``transactional.id.expiration.ms``."""
        expiration = self.config.transactional_id_expiration_ms
        for meta in list(self._txns.values()):
            if (
                meta.state in _NO_TRANSACTION
                and meta.pending is None
                and meta.partition in self._owned
                and meta.last_update_timestamp + expiration <= now_ms
            ):
                self._expire(meta, effects)

    def _expire(self, meta: TransactionMetadata, effects: TxnEffects) -> None:
        meta.transit(TxnState.DEAD, meta.last_update_timestamp)  # checks the transition
        meta.pending = TxnState.DEAD

        def completed(error: ErrorCode, now: int) -> TxnEffects:
            if self._txns.get(meta.transactional_id) is meta:
                meta.pending = None
                if error is E.NONE:
                    meta.state = TxnState.DEAD
                    del self._txns[meta.transactional_id]
            return TxnEffects()

        write_id = self._writes.add(completed)
        effects.writes.append(
            Write(write_id, meta.partition, (GroupRecord(encode_key(meta.transactional_id), None),))
        )

    # -- fencing and aborting

    def _fence_and_abort(
        self,
        meta: TransactionMetadata,
        now_ms: int,
        effects: TxnEffects,
        *,
        timed_out: bool = False,
    ) -> None:
        """Bump the epoch of an Ongoing transaction in memory and write its PrepareAbort with
        it (Kafka's ``prepareFenceProducerEpoch``): the producer is fenced from then on."""
        old_epoch = meta.producer_epoch
        fenced_epoch = old_epoch + 1 if old_epoch < MAX_USABLE_EPOCH else old_epoch
        meta.transit(TxnState.PREPARE_EPOCH_FENCE, now_ms)  # checks the transition
        meta.pending = TxnState.PREPARE_EPOCH_FENCE
        meta.producer_epoch = fenced_epoch
        transit = meta.transit(
            TxnState.PREPARE_ABORT, now_ms, producer_epoch=fenced_epoch, last_producer_epoch=-1
        )

        def done(error: ErrorCode, now: int, out: TxnEffects) -> None:
            if error is E.NONE:
                self.timed_out_count += timed_out
                self._send_markers(meta, out)
            elif self._txns.get(meta.transactional_id) is meta:
                # Not written: the log still holds the old epoch, so memory must too; the
                # next timeout check or InitProducerId tries again.
                meta.producer_epoch = old_epoch

        self._write(effects, meta, transit, done)

    # -- requests

    @staticmethod
    def _check_producer(
        meta: TransactionMetadata | None, producer_id: int, producer_epoch: int
    ) -> ErrorCode:
        if meta is None or meta.producer_id != producer_id:
            return E.INVALID_PRODUCER_ID_MAPPING
        if meta.producer_epoch != producer_epoch:
            return E.PRODUCER_FENCED
        return E.NONE

    def needs_producer_id(self, transactional_id: str) -> bool:
        """Whether InitProducerId for ``transactional_id`` would need a fresh producer id
        (the driver allocates one before calling :meth:`init_producer_id`)."""
        meta = self._txns.get(transactional_id)
        return meta is None or meta.producer_epoch >= MAX_USABLE_EPOCH

    def init_producer_id(
        self, token: object, now_ms: int, req: InitProducerIdRequest
    ) -> TxnEffects:
        effects = TxnEffects()

        def fail(error: ErrorCode) -> TxnEffects:
            effects.complete(token, InitProducerIdResult(error))
            return effects

        if (err := self.coordinator_error(req.transactional_id)) is not E.NONE:
            return fail(err)
        timeout = req.transaction_timeout_ms
        if timeout <= 0 or timeout > self.config.transaction_max_timeout_ms:
            return fail(E.INVALID_TRANSACTION_TIMEOUT)
        meta = self._txns.get(req.transactional_id)
        if meta is None:
            if req.new_producer_id is None:
                return fail(E.CONCURRENT_TRANSACTIONS)
            meta = TransactionMetadata(
                req.transactional_id,
                self.partition_for(req.transactional_id),
                producer_id=req.new_producer_id,
                producer_epoch=-1,
                timeout_ms=timeout,
                last_update_timestamp=now_ms,
            )
            self._txns[req.transactional_id] = meta
        if meta.pending is not None:
            return fail(E.CONCURRENT_TRANSACTIONS)
        if req.producer_id != -1 and not self._is_valid_producer_retry(meta, req):
            return fail(E.PRODUCER_FENCED)
        if meta.state in _PREPARE or meta.state in (TxnState.DEAD, TxnState.PREPARE_EPOCH_FENCE):
            return fail(E.CONCURRENT_TRANSACTIONS)
        if meta.state is TxnState.ONGOING:
            # Abort the producer's open transaction first; the client retries meanwhile.
            self._fence_and_abort(meta, now_ms, effects)
            return fail(E.CONCURRENT_TRANSACTIONS)
        if (
            req.producer_id != -1
            and req.producer_id == meta.producer_id
            and req.producer_epoch == meta.last_producer_epoch
            and meta.last_producer_epoch != -1
        ) or _is_retry_of_id_move(meta, req):
            # A retry of the InitProducerId that made the current epoch: answer it again.
            effects.complete(
                token, InitProducerIdResult(E.NONE, meta.producer_id, meta.producer_epoch)
            )
            return effects
        if meta.producer_epoch >= MAX_USABLE_EPOCH:
            if req.new_producer_id is None:
                return fail(E.CONCURRENT_TRANSACTIONS)
            changes: dict[str, object] = {
                "producer_id": req.new_producer_id,
                "previous_producer_id": meta.producer_id,
                "producer_epoch": 0,
                "last_producer_epoch": -1,
            }
        else:
            changes = {
                "producer_epoch": meta.producer_epoch + 1,
                "last_producer_epoch": meta.producer_epoch,
            }
        transit = meta.transit(
            TxnState.EMPTY,
            now_ms,
            timeout_ms=timeout,
            partitions=frozenset(),
            start_timestamp=-1,
            **changes,
        )

        def done(error: ErrorCode, now: int, out: TxnEffects) -> None:
            if error is E.NONE:
                result = InitProducerIdResult(E.NONE, meta.producer_id, meta.producer_epoch)
            else:
                result = InitProducerIdResult(error)
                if meta.producer_epoch < 0 and self._txns.get(meta.transactional_id) is meta:
                    # a new id whose first record was never written: forget it
                    del self._txns[meta.transactional_id]
            out.complete(token, result)

        self._write(effects, meta, transit, done)
        return effects

    @staticmethod
    def _is_valid_producer_retry(meta: TransactionMetadata, req: InitProducerIdRequest) -> bool:
        """KIP-360, Kafka's rules: a producer that names its id and epoch may go on if the
        id was just created for it (it recovers from an expired id), if they are the current
        ones or those the last bump replaced (a retried request), or if it names the
        previous producer id with an exhausted epoch (a retry of the move to a new id)."""
        if meta.producer_epoch == -1:
            return True
        if req.producer_id == meta.producer_id:
            return req.producer_epoch in (meta.producer_epoch, meta.last_producer_epoch)
        return _is_retry_of_id_move(meta, req)

    def add_partitions(self, token: object, now_ms: int, req: AddPartitionsRequest) -> TxnEffects:
        """AddPartitionsToTxn (and AddOffsetsToTxn, with the group's offsets partition)."""
        effects = TxnEffects()
        wanted = tuple(dict.fromkeys(req.partitions))

        def answer(error: ErrorCode) -> AddPartitionsResult:
            return AddPartitionsResult(tuple((tp, error) for tp in req.partitions))

        if (err := self.coordinator_error(req.transactional_id)) is not E.NONE:
            effects.complete(token, answer(err))
            return effects
        meta = self._txns.get(req.transactional_id)
        err = self._check_producer(meta, req.producer_id, req.producer_epoch)
        if err is E.NONE and meta is not None:
            if meta.pending is not None or meta.state in _PREPARE:
                err = E.CONCURRENT_TRANSACTIONS
            elif meta.state in (TxnState.DEAD, TxnState.PREPARE_EPOCH_FENCE):
                err = E.INVALID_TXN_STATE
        if err is not E.NONE or meta is None:
            effects.complete(token, answer(err))
            return effects
        if meta.state is TxnState.ONGOING and set(wanted) <= meta.partitions:
            effects.complete(token, answer(E.NONE))
            return effects
        start = meta.start_timestamp if meta.state is TxnState.ONGOING else now_ms
        transit = meta.transit(
            TxnState.ONGOING,
            now_ms,
            partitions=meta.partitions | frozenset(wanted),
            start_timestamp=start,
        )

        def done(error: ErrorCode, now: int, out: TxnEffects) -> None:
            out.complete(token, answer(error))

        self._write(effects, meta, transit, done)
        return effects

    def verify_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Sequence[TopicPartition],
    ) -> dict[TopicPartition, ErrorCode]:
        """AddPartitionsToTxn v4 ``verifyOnly`` (KIP-890): whether each partition is in the
        producer's ongoing transaction. Nothing is written."""
        return {
            tp: self.verify(transactional_id, producer_id, producer_epoch, tp[0], tp[1])
            for tp in partitions
        }

    def verify(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        topic: str,
        partition: int,
    ) -> ErrorCode:
        """KIP-890 part 1, for a partition leader about to append a transactional batch:
        NONE only if ``(topic, partition)`` was added to the producer's ongoing transaction
        with this very epoch. A late batch of a transaction that has ended (or whose
        producer was fenced) finds no such transaction and is refused: it can never join the
        next transaction of the same id."""
        if (err := self.coordinator_error(transactional_id)) is not E.NONE:
            return err
        meta = self._txns.get(transactional_id)
        if meta is None or meta.producer_id != producer_id:
            return E.INVALID_PRODUCER_ID_MAPPING
        if producer_epoch < meta.producer_epoch:
            return E.INVALID_PRODUCER_EPOCH
        if (
            producer_epoch != meta.producer_epoch
            or meta.state is not TxnState.ONGOING
            or meta.pending
            in (
                TxnState.PREPARE_COMMIT,
                TxnState.PREPARE_ABORT,
                TxnState.PREPARE_EPOCH_FENCE,
            )
            or (topic, partition) not in meta.partitions
        ):
            return E.INVALID_TXN_STATE
        return E.NONE

    def end_txn(self, token: object, now_ms: int, req: EndTxnRequest) -> TxnEffects:
        effects = TxnEffects()

        def fail(error: ErrorCode) -> TxnEffects:
            effects.complete(token, EndTxnResult(error))
            return effects

        if (err := self.coordinator_error(req.transactional_id)) is not E.NONE:
            return fail(err)
        meta = self._txns.get(req.transactional_id)
        if (err := self._check_producer(meta, req.producer_id, req.producer_epoch)) is not E.NONE:
            return fail(err)
        assert meta is not None
        if meta.pending is not None:
            return fail(E.CONCURRENT_TRANSACTIONS)
        state = meta.state
        same = TxnState.PREPARE_COMMIT if req.commit else TxnState.PREPARE_ABORT
        completed = TxnState.COMPLETE_COMMIT if req.commit else TxnState.COMPLETE_ABORT
        if state is same:
            return fail(E.CONCURRENT_TRANSACTIONS)
        if state is completed:
            # A retry of the EndTxn that completed this transaction.
            effects.complete(token, EndTxnResult(E.NONE, meta.producer_id, meta.producer_epoch))
            return effects
        if state is not TxnState.ONGOING:
            return fail(E.INVALID_TXN_STATE)
        transit = meta.transit(same, now_ms)

        def done(error: ErrorCode, now: int, out: TxnEffects) -> None:
            if error is E.NONE:
                out.complete(token, EndTxnResult(E.NONE, meta.producer_id, meta.producer_epoch))
                self._send_markers(meta, out)
            else:
                out.complete(token, EndTxnResult(error))

        self._write(effects, meta, transit, done)
        return effects

    # -- inspection (DescribeTransactions, ListTransactions)

    def describe(self, transactional_id: str) -> DescribedTransaction:
        if (err := self.coordinator_error(transactional_id)) is not E.NONE:
            return DescribedTransaction(transactional_id, err)
        meta = self._txns.get(transactional_id)
        if meta is None:
            return DescribedTransaction(transactional_id, E.TRANSACTIONAL_ID_NOT_FOUND)
        return DescribedTransaction(
            transactional_id,
            E.NONE,
            meta.state.kafka_name,
            meta.producer_id,
            meta.producer_epoch,
            meta.timeout_ms,
            meta.start_timestamp,
            tuple(sorted(meta.partitions)),
        )

    def list_transactions(
        self,
        now_ms: int,
        *,
        states: Sequence[str] = (),
        producer_ids: Sequence[int] = (),
        duration_filter_ms: int = -1,
        transactional_id_pattern: str | None = None,
    ) -> tuple[ErrorCode, list[ListedTransaction], list[str]]:
        """(error, transactions, unknown state filters): ListTransactions (KIP-664, v1's
        duration filter, v2's id pattern). A pattern that is no regular expression:
        INVALID_REGULAR_EXPRESSION."""
        if self._loading:
            return E.COORDINATOR_LOAD_IN_PROGRESS, [], []
        unknown = [s for s in states if TxnState.from_kafka_name(s) is None]
        wanted = {TxnState.from_kafka_name(s) for s in states} - {None}
        pattern = None
        if transactional_id_pattern:
            try:
                pattern = re.compile(transactional_id_pattern)
            except re.error:
                return E.INVALID_REGULAR_EXPRESSION, [], unknown
        out = []
        for tid, meta in sorted(self._txns.items()):
            if meta.partition not in self._owned or meta.state is TxnState.DEAD:
                continue
            if states and meta.state not in wanted:
                continue
            if producer_ids and meta.producer_id not in producer_ids:
                continue
            if duration_filter_ms >= 0 and (
                meta.state is not TxnState.ONGOING
                or now_ms - meta.start_timestamp < duration_filter_ms
            ):
                continue
            if pattern is not None and pattern.fullmatch(tid) is None:
                continue
            out.append(ListedTransaction(tid, meta.producer_id, meta.state.kafka_name))
        return E.NONE, out, unknown

    def transaction(self, transactional_id: str) -> TransactionMetadata | None:
        return self._txns.get(transactional_id)

    def transactional_ids(self) -> list[str]:
        return sorted(self._txns)

    def state_counts(self) -> dict[str, int]:
        """Transactional ids of the owned partitions by state (Kafka's state names)."""
        counts: dict[str, int] = {}
        for meta in self._txns.values():
            if meta.partition in self._owned:
                name = meta.state.kafka_name
                counts[name] = counts.get(name, 0) + 1
        return counts


def _is_retry_of_id_move(meta: TransactionMetadata, req: InitProducerIdRequest) -> bool:
    """The request names the producer id the id left when its epoch ran out."""
    return (
        req.producer_id != -1
        and req.producer_id == meta.previous_producer_id
        and req.producer_epoch >= MAX_USABLE_EPOCH
    )


def replay_transactions(
    records: Iterable[KeyValue], partition: int
) -> dict[str, TransactionMetadata]:
    """The transactional ids that ``records`` (one partition's, oldest first) describe: the
    newest value per id wins, a tombstone forgets the id."""
    latest: dict[str, TransactionLogValue | None] = {}
    for record in records:
        tid = decode_key(record.key)
        latest[tid] = None if record.value is None else decode_value(record.value)
    out: dict[str, TransactionMetadata] = {}
    for tid, value in latest.items():
        if value is None:
            continue
        try:
            state = TxnState(value.status)
        except ValueError as exc:
            raise TransactionRecordError(
                f"transaction state {value.status} of {tid!r} is unknown"
            ) from exc
        if state in (TxnState.DEAD, TxnState.PREPARE_EPOCH_FENCE):
            # never written by a coordinator; treat like a tombstone
            continue
        out[tid] = TransactionMetadata(
            tid,
            partition,
            producer_id=value.producer_id,
            producer_epoch=value.producer_epoch,
            timeout_ms=value.timeout_ms,
            state=state,
            previous_producer_id=value.previous_producer_id,
            partitions=frozenset(value.partitions),
            start_timestamp=value.start_timestamp,
            last_update_timestamp=value.last_update_timestamp,
        )
    return out
