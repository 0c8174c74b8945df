"""A transactional id's state, as the transaction coordinator keeps it.

State machine (Kafka's ``TransactionState``; the number is what ``__transaction_state``
stores, the name what DescribeTransactions and ListTransactions show)::

    Empty --AddPartitions--> Ongoing --EndTxn(commit)--> PrepareCommit --markers--> CompleteCommit
      ^                        |  \\--EndTxn(abort)---> PrepareAbort  --markers--> CompleteAbort
      |                        |                          ^
      |                        +--timeout / re-init--> PrepareEpochFence (memory only)
      +--InitProducerId (epoch bump)-- CompleteCommit, CompleteAbort, Empty
    Dead: the transactional id expired (a tombstone is written); it leaves the cache.

:data:`VALID_PREVIOUS_STATES` is Kafka's table of legal transitions; every change the
coordinator makes is checked against it.

Invariants: ``partitions`` is empty unless the state is Ongoing or Prepare*; a transition is
applied to the metadata only once its record is written (``pending`` holds its target
meanwhile, and any other request for the id gets CONCURRENT_TRANSACTIONS); the producer
epoch never decreases for one producer id.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class TxnState(enum.IntEnum):
    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def kafka_name(self) -> str:
        return _NAMES[self]

    @classmethod
    def from_kafka_name(cls, name: str) -> TxnState | None:
        return _BY_NAME.get(name)


_NAMES = {
    TxnState.EMPTY: "Empty",
    TxnState.ONGOING: "Ongoing",
    TxnState.PREPARE_COMMIT: "PrepareCommit",
    TxnState.PREPARE_ABORT: "PrepareAbort",
    TxnState.COMPLETE_COMMIT: "CompleteCommit",
    TxnState.COMPLETE_ABORT: "CompleteAbort",
    TxnState.DEAD: "Dead",
    TxnState.PREPARE_EPOCH_FENCE: "PrepareEpochFence",
}
_BY_NAME = {name: state for state, name in _NAMES.items()}

_COMPLETE = frozenset({TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT})

VALID_PREVIOUS_STATES: dict[TxnState, frozenset[TxnState]] = {
    TxnState.EMPTY: frozenset({TxnState.EMPTY, *_COMPLETE}),
    TxnState.ONGOING: frozenset({TxnState.ONGOING, TxnState.EMPTY, *_COMPLETE}),
    TxnState.PREPARE_COMMIT: frozenset({TxnState.ONGOING}),
    TxnState.PREPARE_ABORT: frozenset({TxnState.ONGOING, TxnState.PREPARE_EPOCH_FENCE}),
    TxnState.COMPLETE_COMMIT: frozenset({TxnState.PREPARE_COMMIT}),
    TxnState.COMPLETE_ABORT: frozenset({TxnState.PREPARE_ABORT}),
    TxnState.DEAD: frozenset({TxnState.EMPTY, *_COMPLETE}),
    TxnState.PREPARE_EPOCH_FENCE: frozenset({TxnState.ONGOING}),
}

#: Kafka's ``Short.MaxValue - 1``: from this epoch on a producer id is exhausted and the
#: transactional id moves to a new producer id with epoch 0.
MAX_USABLE_EPOCH = 32766


class IllegalTransition(AssertionError):
    """A transition outside :data:`VALID_PREVIOUS_STATES`: a bug in the coordinator."""


def check_transition(current: TxnState, target: TxnState) -> None:
    if current not in VALID_PREVIOUS_STATES[target]:
        raise IllegalTransition(f"{current.kafka_name} -> {target.kafka_name} is not legal")


@dataclass(frozen=True, slots=True)
class Transit:
    """The values a transition leaves (what its record holds)."""

    producer_id: int
    previous_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[tuple[str, int]]
    start_timestamp: int
    last_update_timestamp: int


@dataclass(slots=True)
class TransactionMetadata:
    transactional_id: str
    #: the ``__transaction_state`` partition that holds the id
    partition: int
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    previous_producer_id: int = -1
    #: the epoch before the last bump (-1: none), so a retried InitProducerId is recognised
    last_producer_epoch: int = -1
    partitions: frozenset[tuple[str, int]] = frozenset()
    start_timestamp: int = -1
    last_update_timestamp: int = -1
    #: the state a transition in flight (its record being written) leads to
    pending: TxnState | None = None
    #: markers being written for the current Prepare* state (retries included)
    markers_in_flight: bool = False
    #: the marker partitions still to be written while Prepare*
    markers_left: set[tuple[str, int]] = field(default_factory=set)

    def transit(self, state: TxnState, now_ms: int, **changes: object) -> Transit:
        values: dict[str, object] = {
            "producer_id": self.producer_id,
            "previous_producer_id": self.previous_producer_id,
            "producer_epoch": self.producer_epoch,
            "last_producer_epoch": self.last_producer_epoch,
            "timeout_ms": self.timeout_ms,
            "state": state,
            "partitions": self.partitions,
            "start_timestamp": self.start_timestamp,
            "last_update_timestamp": now_ms,
        }
        values.update(changes)
        current = self.state if self.pending is None else self.pending
        check_transition(current, state)
        return Transit(**values)  # type: ignore[arg-type]

    def apply(self, transit: Transit) -> None:
        check_transition(self.state, transit.state)
        self.producer_id = transit.producer_id
        self.previous_producer_id = transit.previous_producer_id
        self.producer_epoch = transit.producer_epoch
        self.last_producer_epoch = transit.last_producer_epoch
        self.timeout_ms = transit.timeout_ms
        self.state = transit.state
        self.partitions = transit.partitions
        self.start_timestamp = transit.start_timestamp
        self.last_update_timestamp = transit.last_update_timestamp
