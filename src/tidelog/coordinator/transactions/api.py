"""What goes into and comes out of the transaction coordinator.

As with the group coordinator (:mod:`tidelog.coordinator.api`), operations that Kafka answers
once a record is written take an opaque ``token`` and return :class:`TxnEffects`: completions
ready now, :class:`~tidelog.coordinator.api.Write` values to append to ``__transaction_state``
(reported back with ``write_completed``), and :class:`MarkerSend` values: transaction markers
to write to the partitions of a transaction (reported back with ``markers_completed``). Every
token is completed exactly once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tidelog.coordinator.api import Write
from tidelog.protocol.error_codes import ErrorCode

TopicPartition = tuple[str, int]

# -- requests


@dataclass(frozen=True, slots=True)
class InitProducerIdRequest:
    transactional_id: str
    transaction_timeout_ms: int
    #: v3+ (KIP-360): the producer's current id and epoch, -1 when it has none
    producer_id: int = -1
    producer_epoch: int = -1
    #: a fresh producer id the driver allocated, used when the transactional id needs one
    #: (first use, or an exhausted epoch); None: none at hand
    new_producer_id: int | None = None


@dataclass(frozen=True, slots=True)
class AddPartitionsRequest:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: Sequence[TopicPartition]


@dataclass(frozen=True, slots=True)
class EndTxnRequest:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool


# -- results


@dataclass(frozen=True, slots=True)
class InitProducerIdResult:
    error: ErrorCode
    producer_id: int = -1
    producer_epoch: int = -1


@dataclass(frozen=True, slots=True)
class AddPartitionsResult:
    #: in request order
    partitions: tuple[tuple[TopicPartition, ErrorCode], ...]

    @property
    def error(self) -> ErrorCode:
        """The first error, NONE when every partition was added."""
        for _, e in self.partitions:
            if e is not ErrorCode.NONE:
                return e
        return ErrorCode.NONE


@dataclass(frozen=True, slots=True)
class EndTxnResult:
    error: ErrorCode
    #: the producer id and epoch after the call (EndTxn v5 returns them; -1 otherwise)
    producer_id: int = -1
    producer_epoch: int = -1


@dataclass(frozen=True, slots=True)
class DescribedTransaction:
    transactional_id: str
    error: ErrorCode
    state: str = ""
    producer_id: int = -1
    producer_epoch: int = -1
    timeout_ms: int = 0
    start_timestamp: int = -1
    partitions: tuple[TopicPartition, ...] = ()


@dataclass(frozen=True, slots=True)
class ListedTransaction:
    transactional_id: str
    producer_id: int
    state: str


TxnResponse = InitProducerIdResult | AddPartitionsResult | EndTxnResult

# -- effects


@dataclass(frozen=True, slots=True)
class MarkerSend:
    """Write a COMMIT or ABORT marker for ``producer_id`` to each of ``partitions``."""

    send_id: int
    transactional_id: str
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    commit: bool
    partitions: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class TxnCompletion:
    token: object
    response: TxnResponse


@dataclass(slots=True)
class TxnEffects:
    completions: list[TxnCompletion] = field(default_factory=list)
    writes: list[Write] = field(default_factory=list)
    markers: list[MarkerSend] = field(default_factory=list)

    def complete(self, token: object, response: TxnResponse) -> None:
        self.completions.append(TxnCompletion(token, response))

    def extend(self, other: TxnEffects) -> None:
        self.completions.extend(other.completions)
        self.writes.extend(other.writes)
        self.markers.extend(other.markers)

    def response_for(self, token: object) -> TxnResponse | None:
        """The response completed here for ``token``, if any (a convenience for tests)."""
        for c in self.completions:
            if c.token is token or c.token == token:
                return c.response
        return None
