"""Three combined broker+controller nodes in quorum mode, as clients see them: a change
made through any node reaches the active controller (forwarded when that node is not it)
and every node then serves it; topics are spread over the three brokers; the cluster
outlives the SIGKILL of its leader and the killed node catches up when it comes back.

Real `tidelog serve` processes on loopback (tests/cluster/cluster_harness.py), real clients
(confluent-kafka) and raw requests through the protocol codec.
"""

from __future__ import annotations

import re
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from cluster_harness import Cluster, ClusterNode, send_request, wait_until
from confluent_kafka import (
    Consumer,
    ElectionType,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from tidelog.client.messages import build
from tidelog.coordinator.hashing import partition_for_group
from tidelog.protocol import ApiKey, ErrorCode, request_class

pytestmark = pytest.mark.slow

NOT_REPLICATED = "not supported yet"


def _admin(cluster: Cluster, node: int) -> AdminClient:
    # Bootstrapped on one node only: that node takes the request (and forwards it).
    return AdminClient({"bootstrap.servers": cluster.nodes[node].bootstrap, "log_level": 0})


def _create(cluster: Cluster, node: int, topic: NewTopic) -> None:
    admin = _admin(cluster, node)  # kept until the answer: a destroyed handle fails it
    futures = admin.create_topics([topic], request_timeout=30)
    futures[topic.topic].result(timeout=40)


def _leaders(cluster: Cluster, node: int, topic: str) -> dict[int, int] | None:
    response = cluster.metadata(node)
    if response is None:
        return None
    for entry in response.topics:
        if entry.name == topic and int(entry.error_code) == 0:
            return {int(p.partition_index): int(p.leader_id) for p in entry.partitions}
    return None


def _describe_cluster_brokers(cluster: Cluster, node: int) -> list[tuple[int, int]]:
    request = build(
        request_class(ApiKey.DESCRIBE_CLUSTER, 1),
        {"include_cluster_authorized_operations": False, "endpoint_type": 1},
    )
    response = send_request("127.0.0.1", cluster.nodes[node].port, request)
    assert int(response.error_code) == 0
    return sorted((int(b.broker_id), int(b.port)) for b in response.brokers)


def test_a_change_through_a_follower_is_forwarded_and_every_node_serves_it(
    cluster: Cluster,
) -> None:
    leader = cluster.wait_leader()
    follower = next(n for n in cluster.nodes if n != leader)
    _create(cluster, follower, NewTopic("forwarded", 3, 1))
    # Only the leader commits; the follower answered once it had loaded the topic too.
    assert cluster.leader() is not None and cluster.leader().leader_id == leader  # type: ignore[union-attr]
    for n in cluster.nodes:
        wait_until(lambda n=n: _leaders(cluster, n, "forwarded"), f"node {n} to list it")
        assert cluster.brokers_seen_by(n) == [1, 2, 3]
        # Every unfenced broker with the address of its client listener.
        assert _describe_cluster_brokers(cluster, n) == sorted(
            (m, node.port) for m, node in cluster.nodes.items()
        )
    ids = {n: (cluster.topics(n) or {}).get("forwarded") for n in cluster.nodes}
    assert len(set(ids.values())) == 1 and None not in ids.values()

    # More partitions and a config change, also through the follower.
    admin = _admin(cluster, follower)
    admin.create_partitions([NewPartitions("forwarded", 5)])["forwarded"].result(timeout=40)
    for n in cluster.nodes:
        wait_until(
            lambda n=n: len(_leaders(cluster, n, "forwarded") or {}) == 5,
            f"node {n} to list 5 partitions",
        )


def test_elections_and_reassignments_through_a_follower_reach_the_active_controller(
    cluster: Cluster,
) -> None:
    """ElectLeaders, AlterPartitionReassignments and ListPartitionReassignments sent to a
    node that is not the active controller are forwarded to it, like every other change."""
    from kafka import KafkaAdminClient
    from kafka.errors import InvalidReplicationAssignmentError
    from kafka.structs import TopicPartition as KpTopicPartition

    leader = cluster.wait_leader()
    follower = next(n for n in cluster.nodes if n != leader)
    _create(cluster, follower, NewTopic("elected", 2, 1))
    leaders = wait_until(
        lambda: (found := _leaders(cluster, follower, "elected")) and len(found) == 2 and found,
        "the follower to list the topic",
    )
    admin = _admin(cluster, follower)
    wanted = [TopicPartition("elected", 0), TopicPartition("elected", 1)]
    results = admin.elect_leaders(ElectionType.PREFERRED, wanted).result(40)
    # One replica each: its leader is already the preferred one.
    assert {tp.partition: error.code() for tp, error in results.items()} == {
        0: KafkaError.ELECTION_NOT_NEEDED,
        1: KafkaError.ELECTION_NOT_NEEDED,
    }
    reassigning = KafkaAdminClient(
        bootstrap_servers=cluster.nodes[follower].bootstrap, request_timeout_ms=40_000
    )
    try:
        p0, p1 = KpTopicPartition("elected", 0), KpTopicPartition("elected", 1)
        # To the broker that holds it already: done at once; to a broker that does not
        # exist: refused by the controller.
        assert reassigning.alter_partition_reassignments({p0: [leaders[0]], p1: [99]}) == {
            p0: None,
            p1: InvalidReplicationAssignmentError,
        }
        assert reassigning.list_partition_reassignments() == {}
    finally:
        reassigning.close()
    assert _leaders(cluster, follower, "elected") == leaders


def test_a_replication_factor_above_one_is_refused_until_replication_exists(
    cluster: Cluster,
) -> None:
    leader = cluster.wait_leader()
    follower = next(n for n in cluster.nodes if n != leader)
    for node in (leader, follower):
        with pytest.raises(KafkaException) as info:
            _create(cluster, node, NewTopic(f"replicated-{node}", 3, 3))
        error = info.value.args[0]
        assert error.code() == ErrorCode.INVALID_REPLICATION_FACTOR.value
        assert NOT_REPLICATED in error.str()
    # A replica assignment with two replicas per partition (a raw CreateTopics v7, as the
    # follower receives it before forwarding it): the same refusal.
    request = build(
        request_class(ApiKey.CREATE_TOPICS, 7),
        {
            "topics": [
                {
                    "name": "replicated-by-hand",
                    "num_partitions": -1,
                    "replication_factor": -1,
                    "assignments": [
                        {"partition_index": 0, "broker_ids": [1, 2]},
                        {"partition_index": 1, "broker_ids": [2, 3]},
                    ],
                    "configs": [],
                }
            ],
            "timeout": 30000,
            "validate_only": False,
        },
    )
    response = send_request("127.0.0.1", cluster.nodes[follower].port, request, timeout=40)
    (result,) = response.topics
    assert int(result.error_code) == ErrorCode.INVALID_REPLICATION_FACTOR.value
    assert NOT_REPLICATED in (result.error_message or "")
    for n in cluster.nodes:
        assert not any(t.startswith("replicated-") for t in cluster.topics(n) or {})


def test_a_topic_spread_over_the_three_brokers_is_produced_and_consumed(
    cluster: Cluster,
) -> None:
    cluster.wait_leader()
    _create(cluster, 1, NewTopic("spread", 6, 1))
    leaders = wait_until(lambda: _leaders(cluster, 3, "spread"), "node 3 to list the topic")
    assert set(leaders.values()) == {1, 2, 3}
    bootstrap = ",".join(node.bootstrap for node in cluster.nodes.values())
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "log_level": 0})
    failures: list[object] = []
    for i in range(60):
        producer.produce(
            "spread",
            key=str(i).encode(),
            value=f"value-{i}".encode(),
            partition=i % 6,
            on_delivery=lambda err, _msg: failures.append(err) if err else None,
        )
    assert producer.flush(30) == 0
    assert failures == []

    # Consumed through another node's listener: each partition is read from its leader.
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.nodes[2].bootstrap,
            "group.id": "spread-reader",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    try:
        consumer.assign([TopicPartition("spread", p, 0) for p in range(6)])
        received: dict[int, list[bytes]] = {p: [] for p in range(6)}

        def all_read() -> bool:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                received[message.partition()].append(message.value())
            return sum(len(v) for v in received.values()) == 60

        wait_until(all_read, "all 60 records to be consumed", 60)
    finally:
        consumer.close()
    for p in range(6):
        assert received[p] == [f"value-{i}".encode() for i in range(p, 60, 6)]


def test_after_sigkill_of_the_leader_the_others_go_on_and_it_catches_up(
    cluster: Cluster,
) -> None:
    before = cluster.leader()
    assert before is not None
    victim = before.leader_id
    survivors = [n for n in cluster.nodes if n != victim]
    cluster.nodes[victim].kill()
    new_leader = cluster.wait_leader(survivors, after_epoch=before.epoch)
    assert new_leader in survivors
    # Through the survivor that does not lead: forwarded to the new leader.
    other = next(n for n in survivors if n != new_leader)
    _create(cluster, other, NewTopic("while-down", 2, 1))
    for n in survivors:
        wait_until(lambda n=n: _leaders(cluster, n, "while-down"), f"node {n} to list it")

    cluster.nodes[victim].spawn()
    cluster.wait_ready()
    wait_until(
        lambda: _leaders(cluster, victim, "while-down"),
        f"the restarted node {victim} to list the topic created while it was down",
    )
    assert cluster.brokers_seen_by(victim) == [1, 2, 3]
    seen = cluster.wait_converged()
    assert "while-down" in seen[victim]


def test_consumer_groups_are_coordinated_by_the_leaders_of_their_offsets_partitions(
    cluster: Cluster,
) -> None:
    cluster.wait_leader()
    _create(cluster, 1, NewTopic("grouped", 3, 1))
    bootstrap = ",".join(node.bootstrap for node in cluster.nodes.values())
    producer = Producer({"bootstrap.servers": bootstrap, "log_level": 0})
    for i in range(30):
        producer.produce("grouped", value=f"g-{i}".encode(), partition=i % 3)
    assert producer.flush(30) == 0

    groups = [f"group-{i}" for i in range(4)]
    coordinators = {}
    for group in groups:
        # FindCoordinator through node 1 (the first one creates __consumer_offsets, through
        # the active controller) names the leader of the group's partition.
        request = build(request_class(ApiKey.FIND_COORDINATOR, 2), {"key": group, "key_type": 0})

        def found(group: str = group, request: object = request) -> int | None:
            response = send_request("127.0.0.1", cluster.nodes[1].port, request)
            return int(response.node_id) if int(response.error_code) == 0 else None

        coordinators[group] = wait_until(found, f"a coordinator for {group}", 60)
    offsets = _leaders(cluster, 1, "__consumer_offsets")
    assert offsets is not None and set(offsets.values()) == {1, 2, 3}
    partitions = len(offsets)
    for group, node in coordinators.items():
        assert offsets[partition_for_group(group, partitions)] == node
    assert len(set(coordinators.values())) > 1, coordinators

    for group in groups:
        consumer = Consumer(
            {
                "bootstrap.servers": cluster.nodes[1].bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "log_level": 0,
            }
        )
        try:
            consumer.subscribe(["grouped"])
            seen: list[bytes] = []

            def read_all(consumer: Consumer = consumer, seen: list[bytes] = seen) -> bool:
                message = consumer.poll(0.5)
                if message is not None and message.error() is None:
                    seen.append(message.value())
                return len(seen) == 30

            wait_until(read_all, f"{group} to read the 30 records", 60)
            consumer.commit(asynchronous=False)
            committed = consumer.committed([TopicPartition("grouped", p) for p in range(3)])
            assert sorted(tp.offset for tp in committed) == [10, 10, 10]
        finally:
            consumer.close()


def test_describe_quorum_through_any_broker_names_the_leader(cluster: Cluster) -> None:
    from java_harness import JavaClient

    leader = cluster.wait_leader()
    quorum = cluster.leader()
    assert quorum is not None
    java = JavaClient.build()
    for n, node in cluster.nodes.items():
        # The Java admin client sends DescribeQuorum to a broker; a broker that does not
        # lead the quorum passes it on to the leader's controller listener.
        answer = java.bound(node.bootstrap).one("describe-quorum", {})
        assert answer["leader"] == leader, f"through node {n}: {answer}"
        assert answer["epoch"] >= quorum.epoch
        assert sorted(answer["voters"]) == [1, 2, 3]
        assert answer["high_watermark"] >= quorum.high_watermark


def test_producer_ids_come_from_the_active_controller_on_every_node(cluster: Cluster) -> None:
    leader = cluster.wait_leader()
    request = build(
        request_class(ApiKey.INIT_PRODUCER_ID, 4),
        {"transactional_id": None, "transaction_timeout_ms": -1},
    )
    ids = {}
    for n in cluster.nodes:
        # A node that is not the active controller gets its block of ids from it
        # (AllocateProducerIds on its controller listener).
        response = send_request("127.0.0.1", cluster.nodes[n].port, request)
        assert int(response.error_code) == 0, (n, response)
        ids[n] = int(response.producer_id)
    assert len(set(ids.values())) == 3, ids
    assert cluster.leader() is not None and cluster.leader().leader_id == leader  # type: ignore[union-attr]

    # An idempotent producer through a follower's listener.
    follower = next(n for n in cluster.nodes if n != leader)
    _create(cluster, follower, NewTopic("idempotent", 3, 1))
    producer = Producer(
        {
            "bootstrap.servers": cluster.nodes[follower].bootstrap,
            "enable.idempotence": True,
            "log_level": 0,
        }
    )
    failures: list[object] = []
    for i in range(30):
        producer.produce(
            "idempotent",
            value=str(i).encode(),
            partition=i % 3,
            on_delivery=lambda err, _msg: failures.append(err) if err else None,
        )
    assert producer.flush(30) == 0
    assert failures == []


def _metrics_port(cluster: Cluster, node: int) -> int | None:
    found = re.search(
        r"metrics on http://127\.0\.0\.1:(\d+)/metrics", cluster.nodes[node].log_tail()
    )
    return int(found.group(1)) if found else None


def _ready(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


def _ready_once_loaded(port: int) -> tuple[int, str] | None:
    """``/ready``'s answer, or None while the node is still loading its logs (the metrics
    listener answers from the start)."""
    status, reason = _ready(port)
    return None if "starting" in reason else (status, reason)


def test_a_node_is_not_ready_until_the_quorum_has_a_leader_and_it_serves(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, overrides={"metrics.listener": "http://127.0.0.1:0"})
    try:
        cluster.nodes[1].spawn()
        port = wait_until(lambda: _metrics_port(cluster, 1), "node 1's metrics listener")
        # Alone it cannot elect anyone: once it has loaded what it has on disk, it says
        # so, and serves no client.
        status, reason = wait_until(
            lambda: _ready_once_loaded(port), "node 1 to finish loading its logs"
        )
        assert status == 503 and "no leader" in reason, (status, reason)
        assert cluster.metadata(1) is None
        for n in (2, 3):
            cluster.nodes[n].spawn()
        wait_until(lambda: _ready(port)[0] == 200, "node 1 to be ready", 60)
        # Ready means serving clients: node 1 lists the three brokers.
        wait_until(lambda: cluster.brokers_seen_by(1) == [1, 2, 3], "node 1 to list all three")
    finally:
        cluster.close()


def test_a_node_waiting_for_the_quorum_stops_on_sigterm(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    try:
        node = cluster.nodes[1]
        node.spawn()
        wait_until(lambda: _controller_port_open(node), "its controller listener")
        # Alone it waits for a leader that cannot be elected; SIGTERM still stops it,
        # cleanly (status 0), without the SIGKILL stop() falls back to.
        assert node.stop() == 0
        assert "stopped before the metadata quorum let this broker in" in node.log_tail()
    finally:
        cluster.close()


def _controller_port_open(node: ClusterNode) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", node.controller_port), timeout=1):
            return True
    except OSError:
        return False
