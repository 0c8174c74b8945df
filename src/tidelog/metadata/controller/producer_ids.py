"""Producer ids: AllocateProducerIds hands out blocks of ids, each block recorded first.

The ProducerIds record moves the next block's start forward; once it is committed the
block is handed out, so after any restart the next block starts above every id ever
given (Kafka's ProducerIdControlManager).
"""

from __future__ import annotations

from dataclasses import dataclass

from tidelog.metadata.controller.base import ControllerResult, ControllerView
from tidelog.metadata.errors import OK, ApiError
from tidelog.metadata.records import ProducerIdsRecord
from tidelog.protocol.error_codes import ErrorCode

__all__ = ["PRODUCER_ID_BLOCK_SIZE", "ProducerIdBlock", "allocate_producer_ids"]

#: Ids per AllocateProducerIds block (Kafka's block size).
PRODUCER_ID_BLOCK_SIZE = 1000
_MAX_PRODUCER_ID = 2**63 - 1


@dataclass(frozen=True)
class ProducerIdBlock:
    error: ApiError
    first_producer_id: int = -1
    length: int = 0


def allocate_producer_ids(
    view: ControllerView, broker_id: int, broker_epoch: int | None = None
) -> ControllerResult[ProducerIdBlock]:
    """AllocateProducerIds: the next block of PRODUCER_ID_BLOCK_SIZE ids.

    ``broker_epoch`` None skips the epoch check (the co-located broker asking)."""
    registration = view.image.brokers.get(broker_id)
    if registration is None:
        return ControllerResult(
            ProducerIdBlock(
                ApiError(ErrorCode.STALE_BROKER_EPOCH, f"broker {broker_id} is not registered")
            )
        )
    if broker_epoch is not None and broker_epoch != registration.epoch:
        return ControllerResult(
            ProducerIdBlock(
                ApiError(
                    ErrorCode.STALE_BROKER_EPOCH,
                    f"broker epoch {broker_epoch} is not the current {registration.epoch}",
                )
            )
        )
    start = view.image.next_producer_id
    if start > _MAX_PRODUCER_ID - PRODUCER_ID_BLOCK_SIZE:
        return ControllerResult(
            ProducerIdBlock(ApiError(ErrorCode.UNKNOWN_SERVER_ERROR, "producer ids are exhausted"))
        )
    record = ProducerIdsRecord(broker_id, registration.epoch, start + PRODUCER_ID_BLOCK_SIZE)
    return ControllerResult(
        ProducerIdBlock(OK, start, PRODUCER_ID_BLOCK_SIZE),
        ((0, (record,)),),
        lambda errors: ProducerIdBlock(errors[0]),
    )
