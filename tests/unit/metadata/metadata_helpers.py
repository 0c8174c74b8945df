"""Helpers of the metadata tests: a fake clock, an fsync counter, a sans-io cluster."""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import Callable
from typing import TypeVar

from tidelog.metadata.configs import BrokerConfig
from tidelog.metadata.controller import Controller, ControllerResult, ControllerView
from tidelog.metadata.image import MetadataImage
from tidelog.metadata.records import (
    BrokerEndpoint,
    BrokerRegistrationChangeRecord,
    MetadataRecord,
    RegisterBrokerRecord,
)

R = TypeVar("R")

#: start_controller(**config) -> a started controller (see conftest).
ControllerFactory = Callable[..., Controller]


class FakeClock:
    def __init__(self, now: int = 1_700_000_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class FsyncCounter:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, fd: int) -> None:
        self.calls += 1
        os.fsync(fd)


class Cluster:
    """A committed image of several brokers and what the controller's operations do to it,
    without disk: each result's records are appended at the next offsets and replayed, as
    the controller's commit path does. For the sans-io partition operations."""

    def __init__(
        self,
        brokers: int | dict[int, str | None] = 3,
        *,
        config: dict[str, str] | None = None,
        max_replication_factor: int | None = None,
        seed: int = 7,
    ) -> None:
        racks = brokers if isinstance(brokers, dict) else dict.fromkeys(range(1, brokers + 1))
        self.config = BrokerConfig({"num.partitions": "1", **(config or {})})
        self.random = random.Random(seed)
        self.max_replication_factor = max_replication_factor
        self.image = MetadataImage.empty("q1w2e3r4t5y6u7i8o9p0aa")
        for broker_id, rack in racks.items():
            self.add_broker(broker_id, rack)

    def add_broker(self, broker_id: int, rack: str | None = None, *, fenced: bool = False) -> None:
        endpoint = BrokerEndpoint("PLAINTEXT", "127.0.0.1", 9000 + broker_id, "PLAINTEXT")
        epoch = self.image.offset + 1
        self.apply(RegisterBrokerRecord(broker_id, uuid.UUID(int=broker_id), (endpoint,), rack))
        if not fenced:
            self.apply(BrokerRegistrationChangeRecord(broker_id, epoch, fenced=False))

    def set_fenced(self, broker_id: int, fenced: bool = True) -> None:
        epoch = self.image.brokers[broker_id].epoch
        self.apply(BrokerRegistrationChangeRecord(broker_id, epoch, fenced=fenced))

    def view(self) -> ControllerView:
        return ControllerView(
            self.image,
            self.config,
            self.config,
            self.random,
            next_offset=self.image.offset + 1,
            max_replication_factor=self.max_replication_factor,
        )

    def apply(self, *records: MetadataRecord) -> None:
        first = self.image.offset + 1
        self.image, _ = self.image.apply([(first + i, r) for i, r in enumerate(records)])

    def commit(self, result: ControllerResult[R]) -> R:
        """Commit ``result``'s records; its reply."""
        if result.records:
            self.apply(*result.records)
        return result.response
