"""``log.format=json`` and the slow-request log of a real `tidelog serve`.

With ``slow.request.threshold.ms=0`` every request counts as slow (a Fetch long poll's and a
rebalance's wait aside), so the log must name a real client's Produce with its client id.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from interop_broker import BrokerProcess
from interop_data import wait_until


def _lines(broker: BrokerProcess) -> list[dict[str, Any]]:
    text = broker.log_path.read_text(errors="replace")
    # Every line the broker wrote is one JSON object: a shipper never meets a stray line.
    # ("=== ..." lines are the test kit's own markers between starts.)
    return [json.loads(line) for line in text.splitlines() if line and not line.startswith("=== ")]


def test_json_log_names_a_slow_produce_with_its_client_and_times(tmp_path: Path) -> None:
    broker = BrokerProcess(
        tmp_path,
        kind="tidelog",
        extra_args=[
            "--override",
            "log.format=json",
            "--override",
            "slow.request.threshold.ms=0",
        ],
    )
    broker.start()
    try:
        producer = Producer(
            {"bootstrap.servers": broker.bootstrap, "client.id": "orders-app", "acks": "all"}
        )
        producer.produce("logged-topic", b"v")
        assert producer.flush(30) == 0

        def produce_logged() -> list[dict[str, Any]]:
            return [
                line
                for line in _lines(broker)
                if line.get("api") == "PRODUCE" and line.get("client_id") == "orders-app"
            ]

        wait_until(produce_logged, "the Produce in the slow-request log", timeout=30)
        [line] = produce_logged()
        assert line["logger"] == "tidelog.request"
        assert line["level"] == "WARNING"
        assert line["message"].startswith("slow request: PRODUCE v")
        assert line["peer"].startswith("127.0.0.1:")
        assert line["errors"] == []
        for key in ("total_ms", "local_ms", "remote_ms", "send_ms"):
            assert line[key] >= 0
        assert line["total_ms"] >= line["local_ms"]
        # The broker's own lines (start-up) are JSON too, with their logger named.
        assert any(entry["logger"].startswith("tidelog.") for entry in _lines(broker))
    finally:
        broker.stop()
