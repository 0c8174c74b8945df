"""What every controller operation shares: the view it checks against, and its result.

An operation is a function of a :class:`ControllerView` (the committed image, the
configuration, a random source) and a request. It changes nothing: it returns a
:class:`ControllerResult` holding the records to commit and the reply to give once they
are committed (Kafka's ``ControllerResult``). The :class:`~tidelog.metadata.controller.core.Controller`
commits the records and hands the reply back; state changes only when the committed
records are replayed into the image.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from tidelog.metadata.configs import BrokerConfig
from tidelog.metadata.errors import ApiError
from tidelog.metadata.image import MetadataImage
from tidelog.metadata.records import MetadataRecord

__all__ = [
    "MAX_RECORDS_PER_BATCH",
    "ControllerResult",
    "ControllerView",
    "group_batches",
    "per_item",
]

#: Most records in one metadata batch, and so in one topic or partition increase.
MAX_RECORDS_PER_BATCH = 10_000

R = TypeVar("R")
T = TypeVar("T")


@dataclass(frozen=True)
class ControllerView:
    """What an operation may look at: nothing else, so that it can be replayed."""

    #: The latest committed image.
    image: MetadataImage
    #: The broker config with the image's dynamic broker configs applied.
    config: BrokerConfig
    #: The broker config as given (files and overrides), without dynamic configs.
    static_config: BrokerConfig
    #: Where topic ids and incarnation ids come from (injected: seeded in a simulation).
    random: random.Random
    #: The offset the first record of this operation will get (a broker epoch is the
    #: offset of its registration); None: the one after the image's.
    next_offset: int | None = None
    #: The largest replication factor a topic may have here (None: as many as there are
    #: unfenced brokers).
    max_replication_factor: int | None = None

    @property
    def node_id(self) -> int:
        return self.static_config.node_id

    @property
    def first_record_offset(self) -> int:
        return self.image.offset + 1 if self.next_offset is None else self.next_offset

    def registered_brokers(self) -> list[int]:
        return sorted(self.image.brokers)

    def live_brokers(self) -> list[int]:
        """The brokers that may be given leaderships: registered, unfenced and not in
        controlled shutdown (Kafka's active brokers)."""
        return [b for b, registration in sorted(self.image.brokers.items()) if registration.active]


@dataclass(frozen=True)
class ControllerResult(Generic[R]):
    """The records an operation wants committed, and its reply.

    ``items`` are the records of each request item that passed its checks, by the item's
    index in the request. They are committed in as few batches as
    :data:`MAX_RECORDS_PER_BATCH` allows, an item never split between two, so each item
    is applied whole or not at all. ``response`` is the reply once every item committed;
    ``failed`` gives the reply when some did not (their indexes and errors).
    """

    response: R
    items: tuple[tuple[int, tuple[MetadataRecord, ...]], ...] = ()
    failed: Callable[[Mapping[int, ApiError]], R] | None = None

    @property
    def records(self) -> list[MetadataRecord]:
        return [record for _, records in self.items for record in records]


def per_item(
    results: Sequence[T],
    planned: Sequence[tuple[int, Sequence[MetadataRecord]]],
    fail: Callable[[T, ApiError], T],
) -> ControllerResult[list[T]]:
    """The result of an operation answering one entry per request item: ``results`` once
    ``planned`` (item index, records) commit; an item whose batch fails gets
    ``fail(entry, error)`` instead of its entry."""

    def failed(errors: Mapping[int, ApiError]) -> list[T]:
        replies = list(results)
        for index, error in errors.items():
            replies[index] = fail(replies[index], error)
        return replies

    items = tuple((index, tuple(records)) for index, records in planned)
    return ControllerResult(list(results), items, failed)


def group_batches(
    items: Sequence[tuple[int, Sequence[MetadataRecord]]],
) -> list[tuple[list[int], list[MetadataRecord]]]:
    """Items into batches of at most MAX_RECORDS_PER_BATCH records, an item never split:
    (the item indexes of a batch, its records)."""
    batches: list[tuple[list[int], list[MetadataRecord]]] = []
    batch: list[MetadataRecord] = []
    members: list[int] = []
    for index, records in items:
        if batch and len(batch) + len(records) > MAX_RECORDS_PER_BATCH:
            batches.append((members, batch))
            batch, members = [], []
        batch.extend(records)
        members.append(index)
    if batch:
        batches.append((members, batch))
    return batches
