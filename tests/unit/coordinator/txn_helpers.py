"""A fake driver for the transaction coordinator: fake time, an in-memory __transaction_state
and partition leaders that take markers (or refuse them) as a test says."""

from __future__ import annotations

import itertools
from collections import defaultdict

from tidelog.coordinator.api import GroupRecord
from tidelog.coordinator.transactions import (
    AddPartitionsRequest,
    AddPartitionsResult,
    EndTxnRequest,
    EndTxnResult,
    InitProducerIdRequest,
    InitProducerIdResult,
    MarkerSend,
    TransactionConfig,
    TransactionCoordinator,
    TxnEffects,
    TxnResponse,
)
from tidelog.protocol.error_codes import ErrorCode

E = ErrorCode


class TxnHarness:
    """Runs the coordinator like the broker's driver does; writes succeed at once unless
    ``fail_writes`` is set; markers are written at once unless ``hold_markers`` is set, and
    every marker written is kept in ``markers``."""

    def __init__(self, config: TransactionConfig | None = None, now: int = 1_000_000) -> None:
        self.config = config or TransactionConfig(transaction_state_log_num_partitions=4)
        self.coordinator = TransactionCoordinator(self.config)
        self.now = now
        self.log: dict[int, list[GroupRecord]] = defaultdict(list)
        self.markers: list[MarkerSend] = []
        self.held: list[MarkerSend] = []
        self.hold_markers = False
        self.fail_writes: ErrorCode | None = None
        #: per partition: the error the leader gives markers (absent: NONE)
        self.marker_errors: dict[tuple[str, int], ErrorCode] = {}
        self.responses: dict[object, TxnResponse] = {}
        self._tokens = itertools.count(1)
        self._ids = itertools.count(1000)

    def dispatch(self, effects: TxnEffects) -> None:
        for c in effects.completions:
            assert c.token not in self.responses, f"token {c.token} completed twice"
            self.responses[c.token] = c.response
        for write in effects.writes:
            error = self.fail_writes or E.NONE
            if error is E.NONE:
                self.log[write.partition].extend(write.records)
            self.dispatch(self.coordinator.write_completed(write.write_id, self.now, error))
        for send in effects.markers:
            if self.hold_markers:
                self.held.append(send)
            else:
                self.deliver(send)

    def deliver(self, send: MarkerSend) -> None:
        errors = {tp: self.marker_errors.get(tp, E.NONE) for tp in send.partitions}
        if all(e is E.NONE for e in errors.values()):
            self.markers.append(send)
        self.dispatch(self.coordinator.markers_completed(send.send_id, self.now, errors))

    def release_markers(self) -> None:
        held, self.held = self.held, []
        for send in held:
            self.deliver(send)

    def advance(self, ms: int) -> None:
        """Move time on, firing each deadline at its own time."""
        end = self.now + ms
        while (d := self.coordinator.next_deadline()) is not None and d <= end:
            self.now = max(self.now, d)
            self.dispatch(self.coordinator.tick(self.now))
        self.now = end
        self.dispatch(self.coordinator.tick(self.now))

    def _run(self, op, req) -> tuple[object, TxnResponse | None]:  # type: ignore[no-untyped-def]
        token = next(self._tokens)
        self.dispatch(op(token, self.now, req))
        return token, self.responses.get(token)

    def init(
        self, tid: str, timeout_ms: int = 60_000, producer_id: int = -1, epoch: int = -1
    ) -> InitProducerIdResult:
        new_id = next(self._ids) if self.coordinator.needs_producer_id(tid) else None
        _, r = self._run(
            self.coordinator.init_producer_id,
            InitProducerIdRequest(tid, timeout_ms, producer_id, epoch, new_id),
        )
        assert isinstance(r, InitProducerIdResult)
        return r

    def add(self, tid: str, pid: int, epoch: int, *tps: tuple[str, int]) -> AddPartitionsResult:
        _, r = self._run(
            self.coordinator.add_partitions, AddPartitionsRequest(tid, pid, epoch, tps)
        )
        assert isinstance(r, AddPartitionsResult)
        return r

    def end(self, tid: str, pid: int, epoch: int, commit: bool) -> EndTxnResult:
        _, r = self._run(self.coordinator.end_txn, EndTxnRequest(tid, pid, epoch, commit))
        assert isinstance(r, EndTxnResult)
        return r

    def state(self, tid: str) -> str:
        return self.coordinator.describe(tid).state

    def reload(self) -> TransactionCoordinator:
        """A new coordinator that loads every partition from the log (a restart)."""
        self.coordinator = TransactionCoordinator(self.config, owned_partitions=())
        for p in range(self.config.transaction_state_log_num_partitions):
            self.coordinator.begin_loading(p)
        for p in range(self.config.transaction_state_log_num_partitions):
            self.dispatch(self.coordinator.load_partition(p, list(self.log[p]), self.now, 1))
        return self.coordinator
