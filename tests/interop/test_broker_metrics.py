"""The broker's metrics listener against what real clients did: a real `tidelog serve` with
``metrics.listener`` set, confluent-kafka producing and consuming in a group, then
``/metrics`` scraped over HTTP and parsed with Prometheus' own text parser."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from interop_broker import BrokerProcess, broker_kind
from interop_data import wait_until
from interop_metrics import Metrics, value

pytestmark = pytest.mark.skipif(
    broker_kind() != "tidelog", reason="metrics.listener is a Tidelog setting"
)


@pytest.fixture(scope="module")
def metrics(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Metrics]:
    m = Metrics(tmp_path_factory.mktemp("metrics"))
    m.broker.start()
    try:
        yield m
    finally:
        m.broker.stop()


def test_health_ready_and_unknown_paths(metrics: Metrics) -> None:
    assert metrics.get("/health") == (200, "up\n")
    # A fresh broker has no __consumer_offsets to load: ready once it serves clients.
    wait_until(lambda: metrics.get("/ready")[0] == 200, "/ready to answer 200")
    assert metrics.get("/ready") == (200, "ready\n")
    status, text = metrics.get("/nothing-here")
    assert status == 404 and "/nothing-here" in text
    assert metrics.get("/metrics", method="DELETE")[0] == 405


def test_figures_follow_what_clients_did(metrics: Metrics, topic_name: str) -> None:
    bootstrap = metrics.broker.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic_name, num_partitions=1)])[topic_name].result(timeout=30)
    before = metrics.scrape()
    produce_requests = value(before, "kafka_network_requests_total", api="Produce") or 0.0
    flushes = value(before, "kafka_log_flush_time_seconds_count") or 0.0

    produced = 500
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(produced):
        producer.produce(topic_name, value=f"value-{i}".encode(), key=str(i).encode())
    assert producer.flush(30) == 0

    after = metrics.scrape()
    assert value(after, "kafka_server_messages_in_total", topic=topic_name) == produced
    bytes_in = value(after, "kafka_server_bytes_in_total", topic=topic_name)
    assert bytes_in is not None and bytes_in > produced * len(b"value-0")
    assert (value(after, "kafka_network_requests_total", api="Produce") or 0) > produce_requests
    assert (value(after, "kafka_network_request_total_time_seconds_count", api="Produce") or 0) > 0
    # acks=all: every append was made durable by an fsync round.
    assert (value(after, "kafka_log_flush_time_seconds_count") or 0) > flushes
    tp = {"topic": topic_name, "partition": "0"}
    assert value(after, "kafka_log_size_bytes", **tp) == bytes_in
    assert value(after, "kafka_log_segments", **tp) == 1
    assert value(after, "kafka_topic_partition_current_offset", **tp) == produced
    assert value(after, "kafka_server_under_replicated_partitions") == 0
    assert value(after, "kafka_controller_offline_partitions") == 0
    assert value(after, "kafka_controller_active_controller") == 1
    assert (value(after, "kafka_server_leader_partitions") or 0) >= 1

    group = f"{topic_name}-group"
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic_name])
    seen = 0
    try:

        def consumed_all() -> bool:
            nonlocal seen
            for message in consumer.consume(num_messages=1000, timeout=0.5):
                assert message.error() is None, message.error()
                seen += 1
            return seen >= produced

        wait_until(consumed_all, f"{produced} records consumed", timeout=60)
        consumer.commit(asynchronous=False)
        while_member = metrics.scrape()
        assert value(while_member, "kafka_consumergroup_members", consumergroup=group) == 1
        assert value(while_member, "kafka_consumergroup_state", consumergroup=group, state="Stable")
    finally:
        consumer.close()
    assert seen == produced

    committed = metrics.scrape()
    group_tp = {"consumergroup": group, **tp}
    assert value(committed, "kafka_consumergroup_current_offset", **group_tp) == produced
    assert value(committed, "kafka_consumergroup_lag", **group_tp) == 0
    assert value(committed, "kafka_consumergroup_members", consumergroup=group) == 0
    assert value(committed, "kafka_consumergroup_state", consumergroup=group, state="Empty") == 1
    # Every batch went out at least once.
    assert (value(committed, "kafka_server_bytes_out_total", topic=topic_name) or 0) >= bytes_in
    # librdkafka joins without a member id first; Kafka (and Tidelog) answer that error.
    joins_refused = value(
        committed, "kafka_network_request_errors_total", api="JoinGroup", error="MEMBER_ID_REQUIRED"
    )
    assert joins_refused is not None and joins_refused >= 1

    assert value(committed, "kafka_consumergroup_lag_seconds", **group_tp) == 0
    more = 37
    # Written with a CreateTime an hour old: the group is an hour behind in time.
    hour_ago_ms = int(time.time() * 1000) - 3_600_000
    for i in range(more):
        producer.produce(topic_name, value=f"more-{i}".encode(), timestamp=hour_ago_ms)
    assert producer.flush(30) == 0
    behind = metrics.scrape()
    assert value(behind, "kafka_consumergroup_lag", **group_tp) == more
    lag_seconds = value(behind, "kafka_consumergroup_lag_seconds", **group_tp)
    assert lag_seconds is not None and 3600 <= lag_seconds < 3600 + 600, lag_seconds
    assert value(behind, "kafka_consumergroup_lag_sum", consumergroup=group) == more
    assert value(behind, "kafka_consumergroup_current_offset", **group_tp) == produced
    assert value(behind, "kafka_server_messages_in_total", topic=topic_name) == produced + more


def test_bad_metrics_listener_is_refused_in_one_line(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path, extra_args=["--override", "metrics.listener=9404"])
    result = broker.run_to_exit()
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert "metrics.listener" in line and "http://host:port" in line


def test_metrics_port_in_use_is_refused_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        broker = BrokerProcess(
            tmp_path, extra_args=["--override", f"metrics.listener=http://127.0.0.1:{port}"]
        )
        result = broker.run_to_exit()
    assert result.returncode == 1, result.stderr
    [line] = [text for text in result.stderr.splitlines() if "tidelog serve" in text]
    assert "metrics.listener" in line and "cannot listen" in line, line


def test_request_pipeline_and_transaction_figures(metrics: Metrics, topic_name: str) -> None:
    """A transactional producer commits and aborts through confluent-kafka: the coordinator's
    counts follow; every answered request has its time split; nothing is left in the
    queue once the clients are done."""
    bootstrap = metrics.broker.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic_name, num_partitions=1)])[topic_name].result(timeout=30)
    before = metrics.scrape()
    txn = "kafka_coordinator_transaction"
    commits = value(before, f"{txn}_completed_total", result="commit") or 0
    aborts = value(before, f"{txn}_completed_total", result="abort") or 0

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic_name}-tx"})
    producer.init_transactions(30)
    for commit in (True, True, False):
        producer.begin_transaction()
        producer.produce(topic_name, value=b"v")
        # Sent before the abort: librdkafka drops unsent records and skips EndTxn for a
        # transaction that never reached a partition.
        assert producer.flush(30) == 0
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic_name, value=b"open")
    producer.flush(30)

    def completed(commit: float, abort: float) -> bool:
        # Complete is written once the markers are durable, after EndTxn is answered.
        sample = metrics.scrape()
        return (
            value(sample, f"{txn}_completed_total", result="commit") == commit
            and value(sample, f"{txn}_completed_total", result="abort") == abort
        )

    wait_until(lambda: completed(commits + 2, aborts + 1), "2 commits and an abort completed")
    during = metrics.scrape()
    assert (value(during, f"{txn}_transactions", state="Ongoing") or 0) >= 1
    assert value(during, f"{txn}_partitions_loading") == 0
    assert value(during, "kafka_coordinator_group_partitions_loading") == 0
    producer.abort_transaction(30)
    wait_until(lambda: completed(commits + 2, aborts + 2), "the open transaction aborted")
    after = metrics.scrape()
    assert value(after, f"{txn}_transactions", state="Ongoing") == 0
    for api in ("Produce", "EndTxn", "AddPartitionsToTxn", "InitProducerId"):
        answered = value(after, "kafka_network_requests_total", api=api)
        assert answered, api
        for part in ("queue", "local", "remote", "response_send"):
            name = f"kafka_network_request_{part}_time_seconds_count"
            assert value(after, name, api=api) == answered, (api, part)
    for ratio in (
        "kafka_network_processor_avg_idle_ratio",
        "kafka_server_request_handler_avg_idle_ratio",
    ):
        measured = value(after, ratio)
        assert measured is not None and 0 <= measured <= 1, (ratio, measured)
    del producer  # closes its connections
    wait_until(
        lambda: (
            value(metrics.scrape(), "kafka_network_request_queue_size", listener="PLAINTEXT") == 0
        ),
        "every request answered",
    )
