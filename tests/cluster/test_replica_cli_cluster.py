"""`tidelog reassign-partitions`, `topics describe` and `cluster describe` against a
three-node metadata quorum (tests/cluster/cluster_harness.py): a partition of replication
factor 1 moved from its broker to another one.

Brokers do not copy partitions between them yet (the broker side of replication is not
built), so the new replica never joins the ISR and the move stays under way: these tests
check what the controller and the tools show of it (Metadata, seen by confluent-kafka,
lists the target then the old replica; describe shows the replicas being added and
removed; verify says it is still in progress; a second execute is refused without
--additional), and that cancelling returns the partition to its broker with the records
written before still there. They do not claim that data moves.

A broker killed (SIGKILL) and fenced leaves its partitions without a leader:
`--unavailable-partitions` and `--under-min-isr-partitions` list exactly those, with the
replica shown offline, and `cluster describe` shows the broker fenced, leading nothing.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from cluster_harness import Cluster, wait_until
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from tidelog.cli.main import main
from tidelog.client import Admin, NewTopic

pytestmark = pytest.mark.slow

TIMEOUT = 30.0
TOPIC = "moving"


def run(cluster: Cluster, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main([*argv, "--bootstrap-server", cluster.nodes[1].bootstrap])
    out, err = capsys.readouterr()
    return status, out, err


def all_bootstrap(cluster: Cluster) -> str:
    return ",".join(node.bootstrap for node in cluster.nodes.values())


def confluent_metadata(cluster: Cluster) -> dict[str, dict[int, tuple[int, list[int]]]]:
    """Every topic's partitions as (leader, replicas), as confluent-kafka reads Metadata."""
    metadata = AdminClient({"bootstrap.servers": all_bootstrap(cluster)}).list_topics(
        timeout=TIMEOUT
    )
    return {
        name: {p.id: (p.leader, list(p.replicas)) for p in topic.partitions.values()}
        for name, topic in metadata.topics.items()
    }


def read_partition(cluster: Cluster, partition: int, count: int) -> list[str]:
    consumer = Consumer(
        {
            "bootstrap.servers": all_bootstrap(cluster),
            "group.id": "replica-cli-reader",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(TOPIC, partition, 0)])
        values: list[str] = []

        def read_all() -> bool:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value().decode())
            return len(values) >= count

        wait_until(read_all, f"{count} records of {TOPIC}-{partition}", TIMEOUT)
        return values
    finally:
        consumer.close()


def test_moving_a_partition_to_another_broker_and_cancelling_it(
    cluster: Cluster, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with Admin({"bootstrap.servers": all_bootstrap(cluster)}) as admin:
        admin.create_topics([NewTopic(TOPIC, 3, 1)])
    wait_until(lambda: TOPIC in confluent_metadata(cluster), f"{TOPIC} in Metadata", TIMEOUT)
    source = confluent_metadata(cluster)[TOPIC][0][1][0]
    target = next(n for n in cluster.nodes if n != source)

    producer = Producer({"bootstrap.servers": all_bootstrap(cluster), "acks": "all"})
    written = [f"before-{i}" for i in range(5)]
    for value in written:
        producer.produce(TOPIC, value=value.encode(), partition=0)
    assert producer.flush(TIMEOUT) == 0

    # cluster describe: each broker's leader and replica counts are Metadata's.
    status, out, _ = run(cluster, capsys, "cluster", "describe")
    assert status == 0
    partitions = [p for topic in confluent_metadata(cluster).values() for p in topic.values()]
    leaders = Counter(leader for leader, _ in partitions)
    replicas = Counter(r for _, rs in partitions for r in rs)
    lines = out.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("ID ")))
    assert lines[header].split() == ["ID", "HOST:PORT", "RACK", "STATE", "LEADERS", "REPLICAS"]
    shown = {int(row.split()[0]): row.split()[4:6] for row in lines[header + 1 : header + 4]}
    assert shown == {n: [str(leaders[n]), str(replicas[n])] for n in cluster.nodes}

    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {"version": 1, "partitions": [{"topic": TOPIC, "partition": 0, "replicas": [target]}]}
        )
    )
    reassignment = ("--reassignment-json-file", str(plan))
    status, out, _ = run(cluster, capsys, "reassign-partitions", "--execute", *reassignment)
    assert status == 0, out
    rollback = out.splitlines()[2]
    assert json.loads(rollback)["partitions"] == [
        {"topic": TOPIC, "partition": 0, "replicas": [source], "log_dirs": ["any"]}
    ]
    assert out.splitlines()[-1] == f"Successfully started partition reassignment for {TOPIC}-0"

    # While it runs the replicas are the target then the one being removed.
    wait_until(
        lambda: confluent_metadata(cluster)[TOPIC][0] == (source, [target, source]),
        "Metadata to show the reassignment",
        TIMEOUT,
    )
    status, out, _ = run(cluster, capsys, "topics", "describe", "--topic", TOPIC)
    assert status == 0
    rows = [line.split() for line in out.splitlines()[1:]]
    assert rows[0] == ["PARTITION", "LEADER", "REPLICAS", "ISR", "ADDING", "REMOVING"]
    assert rows[1] == [
        "0",
        str(source),
        f"{target},{source}",
        str(source),
        str(target),
        str(source),
    ]
    # The replication factor is the target's, as kafka-topics counts it.
    assert "ReplicationFactor: 1" in out.splitlines()[0]
    status, out, _ = run(
        cluster, capsys, "topics", "describe", "--topic", TOPIC, "--under-replicated-partitions"
    )
    assert (status, out) == (0, "")

    status, out, _ = run(cluster, capsys, "reassign-partitions", "--verify", *reassignment)
    assert (status, out.splitlines()[1]) == (
        0,
        f"Reassignment of partition {TOPIC}-0 is still in progress.",
    )
    status, _, err = run(cluster, capsys, "reassign-partitions", "--execute", *reassignment)
    assert status == 2 and "--additional" in err and err.count("\n") == 1

    status, out, _ = run(cluster, capsys, "reassign-partitions", "--cancel", *reassignment)
    assert (status, out) == (0, f"Successfully cancelled partition reassignments for: {TOPIC}-0\n")
    wait_until(
        lambda: confluent_metadata(cluster)[TOPIC][0] == (source, [source]),
        "the partition back on its broker",
        TIMEOUT,
    )
    status, out, _ = run(cluster, capsys, "reassign-partitions", "--verify", *reassignment)
    assert status == 1
    assert out.splitlines()[1] == (
        f"Reassignment of partition {TOPIC}-0 failed: there is no active reassignment of it, "
        f"but its replica set is [{source}] rather than [{target}]."
    )
    assert read_partition(cluster, 0, len(written)) == written


def test_partitions_of_a_dead_broker_are_listed_as_unavailable(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    with Admin({"bootstrap.servers": all_bootstrap(cluster)}) as admin:
        admin.create_topics([NewTopic(TOPIC, 6, 1)])
    wait_until(lambda: TOPIC in confluent_metadata(cluster), f"{TOPIC} in Metadata", TIMEOUT)
    quorum = cluster.leader()
    assert quorum is not None
    # Node 1 answers the tools; the quorum keeps its leader, so nothing else changes.
    victim = next(n for n in cluster.nodes if n not in (1, quorum.leader_id))
    stranded = sorted(
        p for p, (_, replicas) in confluent_metadata(cluster)[TOPIC].items() if replicas == [victim]
    )
    assert stranded, "the striped placement puts some of 6 partitions on every broker"
    status, out, _ = run(cluster, capsys, "topics", "describe", "--unavailable-partitions")
    assert (status, out) == (0, "")

    cluster.nodes[victim].kill()
    wait_until(
        lambda: all(confluent_metadata(cluster)[TOPIC][p][0] == -1 for p in stranded),
        f"partitions {stranded} without a leader once broker {victim} is fenced",
        TIMEOUT,
    )
    for flag in ("--unavailable-partitions", "--under-min-isr-partitions"):
        status, out, _ = run(cluster, capsys, "topics", "describe", "--topic", TOPIC, flag)
        assert status == 0
        rows = [line.split() for line in out.splitlines()]
        # Metadata names the fenced broker's replicas offline, as Kafka's does.
        assert rows[0] == ["TOPIC", "PARTITION", "LEADER", "REPLICAS", "ISR", "OFFLINE"]
        # With unclean election off the ISR keeps its last member, the dead broker.
        dead = str(victim)
        assert rows[1:] == [[TOPIC, str(p), "none", dead, dead, dead] for p in stranded]
    status, out, _ = run(cluster, capsys, "topics", "describe", "--under-replicated-partitions")
    assert (status, out) == (0, "")

    status, out, _ = run(cluster, capsys, "cluster", "describe")
    assert status == 0
    victim_row = next(line.split() for line in out.splitlines() if line.startswith(f"{victim} "))
    assert victim_row[3:] == ["fenced", "0", str(len(stranded))]
