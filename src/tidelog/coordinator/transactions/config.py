"""The transaction coordinator's settings, with Kafka's names and defaults."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tidelog.metadata.configs import BrokerConfig


@dataclass(frozen=True, slots=True)
class TransactionConfig:
    """``transaction.*`` and ``transactional.id.*`` broker settings."""

    transaction_state_log_num_partitions: int = 50
    transaction_max_timeout_ms: int = 900_000
    transactional_id_expiration_ms: int = 604_800_000
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = 10_000
    transaction_remove_expired_transaction_cleanup_interval_ms: int = 3_600_000
    #: how long to wait before writing markers again to partitions that refused them
    #: (Kafka resends through its inter-broker channel with the client retry backoff)
    marker_retry_backoff_ms: int = 100

    @classmethod
    def from_broker_config(cls, config: BrokerConfig) -> TransactionConfig:
        return cls(
            transaction_state_log_num_partitions=config.get_int(
                "transaction.state.log.num.partitions"
            ),
            transaction_max_timeout_ms=config.get_int("transaction.max.timeout.ms"),
            transactional_id_expiration_ms=config.transactional_id_expiration_ms,
            transaction_abort_timed_out_transaction_cleanup_interval_ms=config.get_int(
                "transaction.abort.timed.out.transaction.cleanup.interval.ms"
            ),
            transaction_remove_expired_transaction_cleanup_interval_ms=config.get_int(
                "transaction.remove.expired.transaction.cleanup.interval.ms"
            ),
        )
