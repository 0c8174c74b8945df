"""The monitoring examples (examples/monitoring) against the real tools and a real broker.

``promtool`` checks the alert rules and the scrape config; every metric name the rules and
the Grafana dashboard query must be one a real ``tidelog serve`` exports, so the examples
cannot drift from the broker; and a real Prometheus server (Debian's ``prometheus``
package, which ``make deps`` installs) scrapes a real broker while confluent-kafka produces,
loads the alert rules and answers queries over its HTTP API."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from interop_broker import BrokerProcess, broker_kind
from interop_data import wait_until
from interop_metrics import (
    JOB,
    PROMETHEUS_TIMEOUT_S,
    Metrics,
    PrometheusServer,
    metric_names,
    tool,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "monitoring"
ALERTS = EXAMPLES / "tidelog-alerts.yml"
#: The rules on the figures of a metadata quorum (tests/cluster/test_cluster_metrics.py
#: has a real Prometheus evaluate them against a cluster).
QUORUM_ALERTS = EXAMPLES / "tidelog-quorum-alerts.yml"
SCRAPE_CONFIG = EXAMPLES / "prometheus.yml"
DASHBOARD = EXAMPLES / "tidelog-dashboard.json"

needs_tidelog = pytest.mark.skipif(
    broker_kind() != "tidelog", reason="metrics.listener is a Tidelog setting"
)


# -- metric names out of PromQL --------------------------------------------------------------


_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*[A-Za-z_]\w*\s*\)\s*$", re.DOTALL)


def dashboard_expressions(dashboard: dict[str, Any]) -> Iterator[str]:
    """Every PromQL expression of the dashboard: panel targets (rows nest panels too) and the
    series selectors of its ``label_values(...)`` variables."""

    def panels(items: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for item in items:
            yield item
            yield from panels(item.get("panels", ()))

    for panel in panels(dashboard["panels"]):
        for target in panel.get("targets", ()):
            yield target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            match = _LABEL_VALUES.match(variable["definition"])
            assert match, f"variable {variable['name']}: {variable['definition']}"
            yield match[1]


def test_metric_names_finds_only_the_series() -> None:
    expression = (
        'histogram_quantile(0.99, sum by (api, le) (rate(kafka_x_bucket{api="Produce",'
        ' instance=~"$instance"}[$__rate_interval]))) / on (api) group_left (le)'
        " kafka_y offset 5m > bool 1e3 and up unless sum without (topic) (kafka_z)"
    )
    assert metric_names(expression) == {"kafka_x_bucket", "kafka_y", "up", "kafka_z"}


# -- promtool -----------------------------------------------------------------------------------


@pytest.mark.parametrize("rules", [ALERTS, QUORUM_ALERTS], ids=lambda path: path.name)
def test_promtool_accepts_the_alert_rules(rules: Path) -> None:
    result = subprocess.run(
        [tool("promtool"), "check", "rules", str(rules)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_accepts_the_scrape_config(tmp_path: Path) -> None:
    # Run from elsewhere: the config names its rule file relative to itself.
    result = subprocess.run(
        [tool("promtool"), "check", "config", str(SCRAPE_CONFIG)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 rule files found" in result.stdout + result.stderr


# -- a real Prometheus against a real broker ------------------------------------------------


class Monitored:
    def __init__(self, metrics: Metrics, prometheus: PrometheusServer) -> None:
        self.metrics = metrics
        self.prometheus = prometheus

    @property
    def broker(self) -> BrokerProcess:
        return self.metrics.broker


@pytest.fixture(scope="module")
def monitored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Monitored]:
    metrics = Metrics(tmp_path_factory.mktemp("monitored-broker"))
    prometheus = PrometheusServer(
        tmp_path_factory.mktemp("prometheus"), [f"127.0.0.1:{metrics.port}"], [ALERTS]
    )
    metrics.broker.start()
    try:
        prometheus.start()
        try:
            yield Monitored(metrics, prometheus)
        finally:
            prometheus.stop()
    finally:
        metrics.broker.stop()


def produce(bootstrap: str, topic: str, count: int, start: int = 0) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(start, start + count):
        producer.produce(topic, key=str(i).encode(), value=f"record-{i}".encode())
    assert producer.flush(30) == 0


def create_topic(bootstrap: str, topic: str, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions)])[topic].result(timeout=30)


@needs_tidelog
def test_prometheus_counts_the_records_produced(monitored: Monitored, topic_name: str) -> None:
    prometheus = monitored.prometheus
    bootstrap = monitored.broker.bootstrap
    wait_until(
        lambda: prometheus.scalar(f'up{{job="{JOB}"}}') == 1,
        "Prometheus to scrape the broker",
        timeout=PROMETHEUS_TIMEOUT_S,
    )
    create_topic(bootstrap, topic_name, partitions=3)
    records_in = f'sum(kafka_server_messages_in_total{{job="{JOB}", topic="{topic_name}"}})'
    retained = f'sum(kafka_topic_partition_current_offset{{job="{JOB}", topic="{topic_name}"}})'
    produced = 0
    # Produced in rounds while Prometheus scrapes: each round's total shows up in a query.
    for batch in (120, 80, 300):
        produce(bootstrap, topic_name, batch, start=produced)
        produced += batch
        wait_until(
            lambda n=produced: prometheus.scalar(records_in) == n,
            f"Prometheus to answer {produced} records in for {topic_name}",
            timeout=PROMETHEUS_TIMEOUT_S,
        )
    assert prometheus.scalar(retained) == produced
    assert prometheus.scalar(f'count(kafka_log_size_bytes{{topic="{topic_name}"}})') == 3


@needs_tidelog
def test_prometheus_evaluates_every_alert_rule_and_none_fires(monitored: Monitored) -> None:
    prometheus = monitored.prometheus

    def all_evaluated() -> bool:
        rules = prometheus.rules()
        return bool(rules) and all(rule["health"] == "ok" for rule in rules)

    wait_until(all_evaluated, "every alert rule evaluated", timeout=PROMETHEUS_TIMEOUT_S)
    rules = {rule["name"]: rule for rule in prometheus.rules()}
    promtool = subprocess.run(
        [tool("promtool"), "check", "rules", str(ALERTS)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert f"{len(rules)} rules found" in promtool.stdout
    # A healthy single broker: up, one active controller, every partition online and in sync.
    for name in (
        "TidelogBrokerDown",
        "TidelogNoActiveController",
        "TidelogOfflinePartitions",
        "TidelogUnderMinIsrPartitions",
        "TidelogUnderReplicatedPartitions",
    ):
        assert rules[name]["state"] == "inactive", rules[name]


@needs_tidelog
def test_examples_use_only_names_the_broker_exports(monitored: Monitored, topic_name: str) -> None:
    bootstrap = monitored.broker.bootstrap
    # Traffic that gives every family samples: produce (and fsync), a group member that
    # fetches records (bytes out) and commits (its first JoinGroup is answered
    # MEMBER_ID_REQUIRED, an error sample).
    create_topic(bootstrap, topic_name)
    produce(bootstrap, topic_name, 50)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{topic_name}-group",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic_name])
    try:
        wait_until(
            lambda: (message := consumer.poll(0.5)) is not None and message.error() is None,
            "the consumer to join its group and fetch a record",
            timeout=60,
        )
        consumer.commit(offsets=[TopicPartition(topic_name, 0, 50)], asynchronous=False)
    finally:
        consumer.close()

    exported = {name for name, _labels in monitored.metrics.scrape()} | {"up"}

    dashboard = json.loads(DASHBOARD.read_text())
    dashboard_names = set().union(*map(metric_names, dashboard_expressions(dashboard)))
    # The rules as Prometheus itself parsed them from the example file.
    rule_names = set().union(*(metric_names(r["query"]) for r in monitored.prometheus.rules()))

    assert dashboard_names - exported == set()
    assert rule_names - exported == set()
    # The extraction found the figures the examples are about (it is not vacuous).
    for name in (
        "up",
        "kafka_consumergroup_lag_sum",
        "kafka_network_request_errors_total",
        "kafka_log_flush_time_seconds_bucket",
        "kafka_network_processor_avg_idle_ratio",
    ):
        assert name in rule_names
    for name in (
        "kafka_network_requests_total",
        "kafka_network_request_total_time_seconds_bucket",
        "kafka_server_bytes_in_total",
        "kafka_server_bytes_out_total",
        "kafka_log_size_bytes",
        "kafka_consumergroup_lag",
        "kafka_consumergroup_lag_seconds",
        "kafka_network_request_queue_size",
        "kafka_network_request_queue_time_seconds_bucket",
        "kafka_coordinator_transaction_completed_total",
        "kafka_coordinator_transaction_transactions",
    ):
        assert name in dashboard_names
