"""`/ready` while the coordinators load their partitions: a broker restarted over existing
`__consumer_offsets` and `__transaction_state` partitions answers 503 naming the
partitions still loading, and 200 once they are loaded.

The loads are held (the real reader waits for the test before reading each partition)
rather than made slow with a big log: how long a real load takes is not something a test
can rely on observing, a held one is."""

from __future__ import annotations

import asyncio
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tidelog.broker import coordinator_driver
from tidelog.broker.app import BrokerApp
from tidelog.broker.readiness import coordinators_not_ready, ranges
from tidelog.metadata.configs import BrokerConfig

PARTITIONS = 4


async def _ready(port: int) -> tuple[int, str]:
    def get() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=10) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as refused:
            return refused.code, refused.read().decode()

    return await asyncio.to_thread(get)


class _Driver:
    def __init__(self, topic: str, loading: list[int], stopped: bool = False) -> None:
        self.topic = topic
        self.loading = loading
        self.stopped = stopped


def test_ranges_keep_a_topics_partitions_on_one_short_line() -> None:
    assert ranges(range(50)) == "0-49"
    assert ranges([7, 0, 1, 2, 5, 8]) == "0-2, 5, 7-8"
    assert ranges([3]) == "3"


def test_the_reason_names_every_partition_still_loading() -> None:
    groups = _Driver("__consumer_offsets", [])
    txns = _Driver("__transaction_state", [0, 1, 2, 9])
    assert coordinators_not_ready([("group", groups), ("transaction", txns)]) == (
        "the coordinators are loading __transaction_state partitions 0-2, 9"
    )
    groups.loading = [4]
    assert coordinators_not_ready([("group", groups), ("transaction", txns)]) == (
        "the coordinators are loading __consumer_offsets partitions 4 and "
        "__transaction_state partitions 0-2, 9"
    )
    txns.loading = groups.loading = []
    assert coordinators_not_ready([("group", groups), ("transaction", txns)]) is None


def test_a_coordinator_not_running_is_the_reason() -> None:
    groups = _Driver("__consumer_offsets", [1])
    assert coordinators_not_ready([("group", groups), ("transaction", None)]) == (
        "the transaction coordinator is not running"
    )
    groups.stopped = True
    assert coordinators_not_ready([("group", groups), ("transaction", None)]) == (
        "the group coordinator is not running"
    )


def test_ready_waits_for_the_coordinators_to_load_after_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = BrokerConfig(
        {
            "log.dirs": str(tmp_path / "data"),
            "listeners": "PLAINTEXT://127.0.0.1:0",
            "metrics.listener": "http://127.0.0.1:0",
            "offsets.topic.num.partitions": str(PARTITIONS),
            "transaction.state.log.num.partitions": str(PARTITIONS),
        }
    )

    async def first_start() -> None:
        app = BrokerApp(config)
        await app.start()
        try:
            broker = app.broker
            assert broker is not None and broker.groups and broker.transactions
            # The first FindCoordinator of each kind creates the internal topic.
            for driver, key in ((broker.groups, "a-group"), (broker.transactions, "a-txn")):
                await driver.coordinator_error(key)
                await driver.wait_loaded()
                assert driver.loading == [] and driver.is_ready(key)
        finally:
            await app.stop()

    asyncio.run(first_start())

    release = threading.Event()
    real_read = coordinator_driver.read_latest_records

    def held_read(*args: Any) -> Any:
        assert release.wait(30), "the test never released the loads"
        return real_read(*args)

    monkeypatch.setattr(coordinator_driver, "read_latest_records", held_read)

    async def restart() -> list[tuple[int, str]]:
        app = BrokerApp(config)
        await app.start()
        try:
            assert app.metrics_server is not None and app.broker is not None
            port = app.metrics_server.port
            answers = [await _ready(port)]
            release.set()
            for driver in (app.broker.groups, app.broker.transactions):
                assert driver is not None
                await driver.wait_loaded()
            answers.append(await _ready(port))
            return answers
        finally:
            release.set()
            await app.stop()

    last = PARTITIONS - 1
    assert asyncio.run(restart()) == [
        (
            503,
            f"not ready: the coordinators are loading __consumer_offsets partitions 0-{last} "
            f"and __transaction_state partitions 0-{last}\n",
        ),
        (200, "ready\n"),
    ]
