"""The quorum's metrics on a real three-node cluster of `tidelog serve` processes, each with
its ``metrics.listener``: every node names the leader DescribeQuorum names, one node is the
active controller, the leader sees every voter caught up while confluent-kafka creates a
topic and produces; after the leader is killed the survivors agree on a new leader in a
higher epoch, have timed the election, and the dead node's broker is counted fenced. A real
Prometheus scrapes the three nodes and evaluates the example quorum alert rules: healthy, none
fires; once a node is killed, the fenced-broker rule's condition holds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_harness import Cluster
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from interop_broker import free_port
from interop_data import wait_until
from interop_metrics import (
    PROMETHEUS_TIMEOUT_S,
    PrometheusServer,
    Sample,
    metric_names,
    scrape,
    value,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "monitoring"
QUORUM_ALERTS = EXAMPLES / "tidelog-quorum-alerts.yml"


class MeteredCluster:
    def __init__(self, root: Path) -> None:
        self.cluster = Cluster(root)
        self.ports: dict[int, int] = {}
        for n, node in self.cluster.nodes.items():
            self.ports[n] = free_port()
            with node.config_path.open("a") as config:
                config.write(f"metrics.listener=http://127.0.0.1:{self.ports[n]}\n")

    def scrape(self, nodes: list[int]) -> dict[int, Sample]:
        return {n: scrape(self.ports[n]) for n in nodes}

    def bootstrap(self, nodes: list[int]) -> str:
        return ",".join(f"127.0.0.1:{self.cluster.nodes[n].port}" for n in nodes)


@pytest.fixture
def metered(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[MeteredCluster]:
    metered = MeteredCluster(tmp_path)
    try:
        metered.cluster.start()
        yield metered
    finally:
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            print(metered.cluster.log_tails(40))
        metered.cluster.close()


def _gauge(samples: dict[int, Sample], name: str, **labels: str) -> dict[int, float | None]:
    return {n: value(sample, name, **labels) for n, sample in samples.items()}


def test_quorum_figures_agree_and_follow_a_failover(metered: MeteredCluster) -> None:
    cluster = metered.cluster
    nodes = sorted(cluster.nodes)
    topic_name = "metered"
    leader = cluster.wait_leader()
    described = cluster.describe_quorum(leader)
    assert described is not None

    def agree_on(leader_id: int, among: list[int]) -> dict[int, Sample] | None:
        samples = metered.scrape(among)
        leaders = _gauge(samples, "kafka_raft_current_leader")
        active = _gauge(samples, "kafka_controller_active_controller")
        if set(leaders.values()) != {leader_id} or active[leader_id] != 1:
            return None
        if sum(v or 0 for v in active.values()) != 1:
            return None
        return samples

    samples = wait_until(lambda: agree_on(leader, nodes), f"every node to name leader {leader}")
    epochs = _gauge(samples, "kafka_raft_current_epoch")
    assert set(epochs.values()) == {described.epoch}
    assert value(samples[leader], "kafka_raft_current_state", state="leader") == 1
    for n in nodes:
        if n != leader:
            assert value(samples[n], "kafka_raft_current_state", state="follower") == 1
        # Each node timed the election that gave it its first leader.
        assert (value(samples[n], "kafka_raft_election_latency_seconds_count") or 0) >= 1
    assert set(_gauge(samples, "kafka_controller_fenced_broker_count").values()) == {0}
    assert set(_gauge(samples, "kafka_controller_active_broker_count").values()) == {3}
    commits_before = value(samples[leader], "kafka_raft_commit_latency_seconds_count") or 0

    # Real clients work: a topic created (a metadata commit) and records produced.
    bootstrap = metered.bootstrap(nodes)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic_name, num_partitions=3)])[topic_name].result(timeout=30)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(300):
        producer.produce(topic_name, value=f"v{i}".encode(), partition=i % 3)
    assert producer.flush(30) == 0

    def settled() -> dict[int, Sample] | None:
        samples = metered.scrape(nodes)
        lead = samples[leader]
        hw = value(lead, "kafka_raft_high_watermark")
        end = value(lead, "kafka_raft_log_end_offset")
        if hw is None or hw != end:
            return None
        # Every voter holds the leader's whole log, and every node applied all of it.
        if any(value(lead, "kafka_raft_voter_lag", voter=str(n)) != 0 for n in nodes):
            return None
        if any(value(s, "kafka_server_metadata_apply_lag") != 0 for s in samples.values()):
            return None
        if any(value(s, "kafka_raft_high_watermark") != hw for s in samples.values()):
            return None
        return samples

    samples = wait_until(settled, "every voter caught up and every node applied the log")
    lead = samples[leader]
    assert (value(lead, "kafka_raft_commit_latency_seconds_count") or 0) > commits_before
    for n, sample in samples.items():
        hw = value(sample, "kafka_raft_high_watermark")
        assert hw is not None
        assert value(sample, "kafka_server_metadata_last_applied_offset") == hw - 1, n
        # Followers report no view of the other voters: only the leader has one.
        if n != leader:
            assert value(sample, "kafka_raft_voter_lag", voter=str(leader)) is None
    # Records reached the partitions' leaders, wherever they are.
    messages = sum(
        value(sample, "kafka_server_messages_in_total", topic=topic_name) or 0
        for sample in samples.values()
    )
    assert messages == 300
    elections = _gauge(samples, "kafka_raft_election_latency_seconds_count")

    cluster.nodes[leader].kill()
    survivors = [n for n in nodes if n != leader]
    new_leader = cluster.wait_leader(survivors, not_in={leader}, after_epoch=described.epoch)
    samples = wait_until(
        lambda: agree_on(new_leader, survivors), f"the survivors to name leader {new_leader}"
    )
    for n, sample in samples.items():
        assert (value(sample, "kafka_raft_current_epoch") or 0) > described.epoch, n
        assert (value(sample, "kafka_raft_election_latency_seconds_count") or 0) > (
            elections[n] or 0
        ), n

    def fenced_everywhere() -> bool:
        counts = _gauge(metered.scrape(survivors), "kafka_controller_fenced_broker_count")
        return set(counts.values()) == {1}

    wait_until(fenced_everywhere, f"the broker of node {leader} to be fenced", timeout=30)
    after = metered.scrape(survivors)
    assert set(_gauge(after, "kafka_controller_active_broker_count").values()) == {2}


def test_prometheus_evaluates_the_quorum_alert_rules(tmp_path: Path) -> None:
    metered = MeteredCluster(tmp_path / "cluster")
    cluster = metered.cluster
    (tmp_path / "prometheus").mkdir()
    prometheus = PrometheusServer(
        tmp_path / "prometheus",
        [f"127.0.0.1:{port}" for port in metered.ports.values()],
        [QUORUM_ALERTS],
    )
    try:
        cluster.start()
        nodes = sorted(cluster.nodes)
        leader = cluster.wait_leader()
        prometheus.start()

        # Every name the rules use is one a quorum node exports.
        exported = {name for name, _ in scrape(metered.ports[leader])}
        wait_until(
            lambda: all(rule["health"] == "ok" for rule in prometheus.rules()),
            "every quorum rule evaluated",
            timeout=PROMETHEUS_TIMEOUT_S,
        )
        rules = {rule["name"]: rule for rule in prometheus.rules()}
        used = set().union(*(metric_names(rule["query"]) for rule in rules.values()))
        assert used - exported == set()
        assert "kafka_controller_fenced_broker_count" in used
        # A healthy quorum: a leader everywhere, nobody fenced, nobody behind.
        assert all(rule["state"] == "inactive" for rule in rules.values()), rules

        victim = next(n for n in nodes if n != leader)
        cluster.nodes[victim].kill()

        def fenced_rule_holds() -> bool:
            rule = {r["name"]: r for r in prometheus.rules()}["TidelogFencedBrokers"]
            # pending: the condition holds; it fires after its `for` of five minutes.
            return rule["state"] in ("pending", "firing")

        wait_until(fenced_rule_holds, f"TidelogFencedBrokers to hold once node {victim} died", 60)
        survivors = [n for n in nodes if n != victim]
        assert prometheus.scalar('max(kafka_controller_fenced_broker_count{job="tidelog"})') == 1
        # The quorum kept its leader (a follower died): no node is without one.
        leaders = {
            int(v)
            for v in _gauge(metered.scrape(survivors), "kafka_raft_current_leader").values()
            if v is not None
        }
        assert leaders == {leader}
    finally:
        prometheus.stop()
        cluster.close()
