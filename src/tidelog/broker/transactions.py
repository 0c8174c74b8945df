"""The asyncio driver of the transaction coordinator.

:class:`TransactionDriver` owns the sans-io
:class:`~tidelog.coordinator.transactions.TransactionCoordinator` and is the only code that
calls it. Requests, timers, durable appends to ``__transaction_state``, creating the topic
(on the first FindCoordinator for a transactional id: ``transaction.state.log.*``
settings, compacted), loading it and shutdown are
:class:`~tidelog.broker.coordinator_driver.CoordinatorDriver`'s, as for groups.

Markers. A :class:`~tidelog.coordinator.transactions.MarkerSend` is written by
:func:`~tidelog.broker.handlers.txn_markers.apply_txn_markers_durably` (the partitions this
broker leads: all of them on a single node) in a task, and reported back to the coordinator
with every partition's error once the markers are fsynced, so the Complete record is never
written before its markers are durable. A marker that reached a ``__consumer_offsets``
partition also settles the transactional offsets the group coordinator holds there, as
Kafka's WriteTxnMarkers handler does.

KIP-890. :meth:`TransactionDriver.verify` is the broker's ``transaction_verifier``: a
partition leader asks it before a transactional batch starts a transaction on a partition.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING

from tidelog.broker.coordinator_driver import CoordinatorDriver, LoadedRecords
from tidelog.broker.handlers.txn_markers import TxnMarker, apply_txn_markers_durably
from tidelog.coordinator.errors import TransactionRecordError
from tidelog.coordinator.transactions import (
    MarkerSend,
    TransactionConfig,
    TransactionCoordinator,
    TxnEffects,
)
from tidelog.coordinator.transactions.records import decode_key, decode_value
from tidelog.metadata.controller import OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC
from tidelog.protocol import ErrorCode

if TYPE_CHECKING:
    from tidelog.broker.broker import Broker

_log = logging.getLogger(__name__)


def _decodable(key: bytes, value: bytes | None) -> bool:
    try:
        decode_key(key)
        if value is not None:
            decode_value(value)
    except TransactionRecordError:
        return False
    return True


class TransactionDriver(CoordinatorDriver[TransactionCoordinator]):
    """Runs the transaction coordinator of one broker (see the module docstring)."""

    topic = TRANSACTION_STATE_TOPIC

    def __init__(self, broker: Broker, config: TransactionConfig | None = None) -> None:
        self._config = (
            config if config is not None else TransactionConfig.from_broker_config(broker.config)
        )
        super().__init__(broker, TransactionCoordinator(self._config, owned_partitions=()))
        self._marker_tasks: set[asyncio.Task[None]] = set()

    def _configured_partitions(self) -> int:
        return self.coordinator.config.transaction_state_log_num_partitions

    def _resize(self, count: int) -> None:
        self._config = dataclasses.replace(self._config, transaction_state_log_num_partitions=count)
        self.coordinator = TransactionCoordinator(self._config, owned_partitions=())

    def _decodable(self, key: bytes, value: bytes | None) -> bool:
        return _decodable(key, value)

    def _load_partition(self, p: int, loaded: LoadedRecords) -> None:
        partition = self._broker.partitions.get(self.topic, p)
        epoch = partition.leader_epoch if partition is not None else 0
        self._dispatch(self.coordinator.load_partition(p, loaded.records, self.now(), epoch))

    async def stop(self) -> None:
        await super().stop()
        for task in list(self._marker_tasks):
            task.cancel()
        await asyncio.gather(*self._marker_tasks, return_exceptions=True)

    # -- KIP-890 verification

    def verify(
        self,
        transactional_id: str | None,
        producer_id: int,
        producer_epoch: int,
        topic: str,
        partition: int,
    ) -> ErrorCode:
        if transactional_id is None:
            # Produce v3+ names the transactional id of a transactional batch.
            return ErrorCode.INVALID_TXN_STATE
        return self.coordinator.verify(
            transactional_id, producer_id, producer_epoch, topic, partition
        )

    # -- effects

    def _dispatch(self, effects: TxnEffects) -> None:
        super()._dispatch(effects)
        for send in effects.markers:
            task = asyncio.create_task(self._write_markers(send), name="transaction markers")
            self._marker_tasks.add(task)
            task.add_done_callback(self._marker_tasks.discard)

    async def _write_markers(self, send: MarkerSend) -> None:
        marker = TxnMarker(
            send.producer_id,
            send.producer_epoch,
            send.coordinator_epoch,
            send.commit,
            send.partitions,
        )
        try:
            [errors] = await apply_txn_markers_durably(self._broker, [marker])
        except Exception:
            _log.exception("writing the markers of %r failed", send.transactional_id)
            errors = dict.fromkeys(send.partitions, ErrorCode.UNKNOWN_SERVER_ERROR)
        groups = self._broker.groups
        if groups is not None:
            for (topic, index), error in errors.items():
                if topic == OFFSETS_TOPIC and error is ErrorCode.NONE:
                    groups.transaction_completed(index, send.producer_id, send.commit)
        if not self._stopped:
            self._dispatch(self.coordinator.markers_completed(send.send_id, self.now(), errors))
