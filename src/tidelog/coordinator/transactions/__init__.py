"""tidelog.coordinator.transactions: the transaction coordinator (``__transaction_state``).

Modules: ``coordinator`` (the sans-io state machine, :class:`TransactionCoordinator`, and
replay), ``api`` (requests, results, :class:`TxnEffects`, :class:`MarkerSend`), ``state``
(the states and Kafka's legal transitions), ``records`` (Kafka's ``TransactionLog`` key and
value schemas) and ``config``. See ``docs/transactions.md``.
"""

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
    TxnCompletion,
    TxnEffects,
    TxnResponse,
)
from tidelog.coordinator.transactions.config import TransactionConfig
from tidelog.coordinator.transactions.coordinator import (
    TransactionCoordinator,
    map_write_error,
    partition_for_transactional_id,
    replay_transactions,
)
from tidelog.coordinator.transactions.state import (
    VALID_PREVIOUS_STATES,
    IllegalTransition,
    TransactionMetadata,
    TxnState,
)

__all__ = [
    "VALID_PREVIOUS_STATES",
    "AddPartitionsRequest",
    "AddPartitionsResult",
    "DescribedTransaction",
    "EndTxnRequest",
    "EndTxnResult",
    "IllegalTransition",
    "InitProducerIdRequest",
    "InitProducerIdResult",
    "ListedTransaction",
    "MarkerSend",
    "TransactionConfig",
    "TransactionCoordinator",
    "TransactionMetadata",
    "TxnCompletion",
    "TxnEffects",
    "TxnResponse",
    "TxnState",
    "map_write_error",
    "partition_for_transactional_id",
    "replay_transactions",
]
