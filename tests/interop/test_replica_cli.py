"""`tidelog topics describe`, `leader-election` and `reassign-partitions` against a real
`tidelog serve` (one node: every partition has the one replica, on broker 1).

What one node can show: the partition filters pick partitions by the topic's effective
min.insync.replicas; a preferred election finds the valid replica already elected and an
election of a partition that does not exist fails with its error code; a reassignment to
the same broker completes at once (confluent-kafka's metadata still shows replica 1 and the
records written before are all still read), one to a broker that is not registered and one
with a broker listed twice are refused in one line before anything is submitted, an
unknown topic is refused, and verify/cancel say what they found.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient
from interop_broker import BrokerProcess

from tidelog.cli.main import main
from tidelog.client import Admin, NewTopic

TIMEOUT = 30.0


def run(
    broker: BrokerProcess, capsys: pytest.CaptureFixture[str], *argv: str
) -> tuple[int, str, str]:
    status = main([*argv, "--bootstrap-server", broker.bootstrap])
    out, err = capsys.readouterr()
    return status, out, err


def create(broker: BrokerProcess, name: str, partitions: int, **configs: str) -> None:
    with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
        admin.create_topics([NewTopic(name, partitions, 1, dict(configs))])


def table(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if line.strip()]


def write_json(path: Path, data: object) -> str:
    path.write_text(json.dumps(data))
    return str(path)


def plan(topic: str, *entries: tuple[int, list[int]]) -> dict[str, object]:
    return {
        "version": 1,
        "partitions": [{"topic": topic, "partition": p, "replicas": r} for p, r in entries],
    }


def confluent_replicas(broker: BrokerProcess, topic: str) -> dict[int, list[int]]:
    metadata = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(
        topic, timeout=TIMEOUT
    )
    return {p.id: list(p.replicas) for p in metadata.topics[topic].partitions.values()}


def test_describe_filters_use_the_topics_min_insync_replicas(
    broker: BrokerProcess, topic_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    at_min = f"{topic_name}-at"
    under_min = f"{topic_name}-under"
    create(broker, at_min, 2)  # min.insync.replicas 1 (the default) = its ISR of 1
    create(broker, under_min, 1, **{"min.insync.replicas": "2"})

    status, out, _ = run(broker, capsys, "topics", "describe", "--topic", at_min)
    assert status == 0
    rows = table(out)
    assert rows[1] == ["PARTITION", "LEADER", "REPLICAS", "ISR"]
    assert rows[2:] == [["0", "1", "1", "1"], ["1", "1", "1", "1"]]

    topics = ("--topic", at_min, "--topic", under_min)
    status, out, _ = run(broker, capsys, "topics", "describe", *topics, "--at-min-isr-partitions")
    assert status == 0
    assert table(out) == [
        ["TOPIC", "PARTITION", "LEADER", "REPLICAS", "ISR"],
        [at_min, "0", "1", "1", "1"],
        [at_min, "1", "1", "1", "1"],
    ]
    flag = "--under-min-isr-partitions"
    status, out, _ = run(broker, capsys, "topics", "describe", *topics, flag)
    assert status == 0
    assert table(out)[1:] == [[under_min, "0", "1", "1", "1"]]
    for healthy in ("--under-replicated-partitions", "--unavailable-partitions"):
        status, out, _ = run(broker, capsys, "topics", "describe", *topics, healthy)
        assert (status, out) == (0, "")


def test_preferred_election_on_one_node_finds_the_leader_already_elected(
    broker: BrokerProcess, topic_name: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    create(broker, topic_name, 2)
    election = ("leader-election", "--election-type", "preferred")
    status, out, _ = run(broker, capsys, *election, "--topic", topic_name, "--partition", "1")
    assert status == 0
    assert out == f"Valid replica already elected for partitions {topic_name}-1\n"

    entries = [{"topic": topic_name, "partition": p} for p in (0, 1)]
    path = write_json(tmp_path / "elect.json", {"partitions": entries})
    status, out, _ = run(broker, capsys, *election, "--path-to-json-file", path)
    assert status == 0
    assert out == f"Valid replica already elected for partitions {topic_name}-0, {topic_name}-1\n"

    # Unclean on a partition that has a leader: nothing to do either.
    unclean = ("leader-election", "--election-type", "unclean")
    status, out, _ = run(broker, capsys, *unclean, "--topic", topic_name, "--partition", "0")
    assert (status, out) == (0, f"Valid replica already elected for partitions {topic_name}-0\n")

    status, out, err = run(broker, capsys, *election, "--topic", topic_name, "--partition", "7")
    assert status == 1
    assert out.startswith(
        f"Error completing leader election (PREFERRED) for partition: {topic_name}-7: "
        "UNKNOWN_TOPIC_OR_PARTITION"
    )
    assert err == "tidelog leader-election: 1 replica(s) could not be elected\n"


def test_reassignment_to_the_same_broker_completes_and_keeps_the_records(
    broker: BrokerProcess, topic_name: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    create(broker, topic_name, 2)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(10):
        producer.produce(topic_name, value=f"v{i}".encode(), partition=i % 2)
    assert producer.flush(TIMEOUT) == 0

    move = write_json(tmp_path / "move.json", {"version": 1, "topics": [{"topic": topic_name}]})
    generate = ("reassign-partitions", "--generate", "--topics-to-move-json-file", move)
    status, out, _ = run(broker, capsys, *generate, "--broker-list", "1")
    assert status == 0
    lines = out.splitlines()
    assert lines[0] == "Current partition replica assignment"
    assert lines[3] == "Proposed partition reassignment configuration"
    current, proposed = json.loads(lines[1]), json.loads(lines[4])
    expected = [
        {"topic": topic_name, "partition": p, "replicas": [1], "log_dirs": ["any"]} for p in (0, 1)
    ]
    assert current == proposed == {"version": 1, "partitions": expected}

    target = write_json(tmp_path / "plan.json", plan(topic_name, (0, [1]), (1, [1])))
    execute = ("reassign-partitions", "--execute", "--reassignment-json-file", target)
    status, out, _ = run(broker, capsys, *execute)
    assert status == 0
    lines = out.splitlines()
    assert lines[0] == "Current partition replica assignment"
    assert json.loads(lines[2]) == {"version": 1, "partitions": expected}
    assert lines[4] == "Save this to use as the --reassignment-json-file option during rollback"
    assert lines[5] == (
        f"Successfully started partition reassignments for {topic_name}-0,{topic_name}-1"
    )

    verify = ("reassign-partitions", "--verify", "--reassignment-json-file", target)
    status, out, _ = run(broker, capsys, *verify)
    assert status == 0
    assert out.splitlines() == [
        "Status of partition reassignment:",
        f"Reassignment of partition {topic_name}-0 is completed.",
        f"Reassignment of partition {topic_name}-1 is completed.",
    ]
    cancel = ("reassign-partitions", "--cancel", "--reassignment-json-file", target)
    status, out, _ = run(broker, capsys, *cancel)
    assert (status, out) == (0, "None of the specified partition reassignments are active.\n")

    assert confluent_replicas(broker, topic_name) == {0: [1], 1: [1]}
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"{topic_name}-reader",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.subscribe([topic_name])
        values: list[str] = []
        polls_left = 60
        while len(values) < 10 and polls_left:
            polls_left -= 1
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                values.append(message.value().decode())
        assert sorted(values) == sorted(f"v{i}" for i in range(10))
    finally:
        consumer.close()


def test_bad_reassignments_are_refused_in_one_line(
    broker: BrokerProcess, topic_name: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    create(broker, topic_name, 1)

    def execute(data: object) -> tuple[int, str, str]:
        path = write_json(tmp_path / "plan.json", data)
        return run(
            broker, capsys, "reassign-partitions", "--execute", "--reassignment-json-file", path
        )

    status, out, err = execute(plan(topic_name, (0, [2])))
    assert (status, out) == (2, "")
    assert err == (
        "tidelog reassign-partitions: the proposed assignment names brokers that are not "
        "registered: 2\n"
    )
    status, out, err = execute(plan(topic_name, (0, [1, 1])))
    assert (status, out) == (2, "")
    assert (
        err
        == f"tidelog reassign-partitions: partition {topic_name}-0: replicas [1, 1] list a broker twice\n"
    )
    status, out, err = execute(plan(f"{topic_name}-missing", (0, [1])))
    assert (status, out) == (1, "")
    assert err.startswith("tidelog reassign-partitions: ") and "UNKNOWN_TOPIC_OR_PARTITION" in err
    assert err.count("\n") == 1
    status, out, err = execute(plan(topic_name, (3, [1])))
    assert (status, out, err) == (
        2,
        "",
        f"tidelog reassign-partitions: partition {topic_name}-3 does not exist\n",
    )
    # Nothing was submitted: the partition is where it was.
    assert confluent_replicas(broker, topic_name) == {0: [1]}

    path = write_json(tmp_path / "other.json", plan(topic_name, (0, [2])))
    verify = ("reassign-partitions", "--verify", "--reassignment-json-file", path)
    status, out, _ = run(broker, capsys, *verify)
    assert status == 1
    assert out.splitlines()[1] == (
        f"Reassignment of partition {topic_name}-0 failed: there is no active reassignment "
        "of it, but its replica set is [1] rather than [2]."
    )


def test_cluster_describe_on_one_node_counts_its_replicas_and_says_there_is_no_quorum(
    broker: BrokerProcess, capsys: pytest.CaptureFixture[str], topic_name: str
) -> None:
    create(broker, topic_name, 3)
    status, out, err = run(broker, capsys, "cluster", "describe")
    assert status == 0, err
    rows = table(out)
    header = rows.index(["ID", "HOST:PORT", "RACK", "STATE", "LEADERS", "REPLICAS"])
    node = rows[header + 1]
    # Broker 1 leads, and holds, the three partitions (and those of any internal topic).
    assert node[0] == "1" and node[3] == "active" and int(node[4]) >= 3
    assert node[4] == node[5]
    assert "Quorum: none" in out and "controller.quorum.voters" in out
    # Asked for the quorum itself, the one-line error says why there is none.
    status = main(
        ["metadata-quorum", "--bootstrap-server", broker.bootstrap, "describe", "--status"]
    )
    out, err = capsys.readouterr()
    assert status == 1 and len(err.strip().splitlines()) == 1
    assert "has no metadata quorum" in err
