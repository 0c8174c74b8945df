"""`tidelog reassign-partitions`, `leader-election`, the partition filters of `topics
describe` and the counts of `cluster describe`: plans parsed and refused, proposals, the
lines printed, and flags that make no sense refused with status 2 before any broker is
asked (the bootstrap address below has no listener: a command that tried to connect would
fail with status 1)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tidelog.cli.cluster import replica_counts
from tidelog.cli.leader_election import outcome_lines, parse_partitions_json
from tidelog.cli.main import main
from tidelog.cli.output import UsageError
from tidelog.cli.reassign_partitions import (
    format_assignment,
    parse_broker_list,
    parse_reassignment,
    parse_topics_to_move,
    propose,
    verify_lines,
)
from tidelog.cli.topics import PartitionState, print_partitions
from tidelog.client import ClientError, PartitionInfo, TopicInfo, TopicPartition
from tidelog.protocol import ErrorCode

NOWHERE = ("--bootstrap-server", "127.0.0.1:9")
A0 = TopicPartition("a", 0)
A1 = TopicPartition("a", 1)
B0 = TopicPartition("b", 0)


def _plan(*entries: dict[str, object]) -> dict[str, object]:
    return {"version": 1, "partitions": list(entries)}


# ---------------------------------------------------------------------------- plans


def test_a_plan_round_trips_through_kafkas_json() -> None:
    plan = {A1: [3, 1], A0: [1, 2], B0: [2]}
    text = format_assignment(plan)
    data = json.loads(text)
    assert data["version"] == 1
    assert data["partitions"][0] == {
        "topic": "a",
        "partition": 0,
        "replicas": [1, 2],
        "log_dirs": ["any", "any"],
    }
    assert [(p["topic"], p["partition"]) for p in data["partitions"]] == [
        ("a", 0),
        ("a", 1),
        ("b", 0),
    ]
    assert parse_reassignment(data) == {A0: [1, 2], A1: [3, 1], B0: [2]}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], '"partitions" list'),
        ({"version": 1}, '"partitions" list'),
        (
            {"version": 2, "partitions": [{"topic": "a", "partition": 0, "replicas": [1]}]},
            "version",
        ),
        (_plan(), "empty"),
        (_plan({"partition": 0, "replicas": [1]}), "no topic name"),
        (_plan({"topic": "a", "partition": -1, "replicas": [1]}), "partition number"),
        (_plan({"topic": "a", "partition": True, "replicas": [1]}), "partition number"),
        (_plan({"topic": "a", "partition": 0, "replicas": []}), "non-empty list"),
        (_plan({"topic": "a", "partition": 0}), "non-empty list"),
        (_plan({"topic": "a", "partition": 0, "replicas": [1, "2"]}), "not all broker ids"),
        (_plan({"topic": "a", "partition": 0, "replicas": [1, 2, 1]}), "list a broker twice"),
        (
            _plan(
                {"topic": "a", "partition": 0, "replicas": [1]},
                {"topic": "a", "partition": 0, "replicas": [2]},
            ),
            "partition a-0 is listed twice",
        ),
        (
            _plan({"topic": "a", "partition": 0, "replicas": [1, 2], "log_dirs": ["any"]}),
            "one entry per replica",
        ),
        (
            _plan({"topic": "a", "partition": 0, "replicas": [1], "log_dirs": ["/data"]}),
            "not supported",
        ),
    ],
)
def test_a_bad_plan_is_refused_with_the_reason(data: object, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_reassignment(data)


def test_topics_to_move_and_broker_list() -> None:
    data = {"version": 1, "topics": [{"topic": "a"}, {"topic": "b"}]}
    assert parse_topics_to_move(data) == ["a", "b"]
    with pytest.raises(UsageError, match="listed twice"):
        parse_topics_to_move({"topics": [{"topic": "a"}, {"topic": "a"}]})
    with pytest.raises(UsageError, match="no topic"):
        parse_topics_to_move({"topics": []})
    assert parse_broker_list("3,1, 2") == [3, 1, 2]
    for bad in ("", "1,x", "1,1"):
        with pytest.raises(UsageError):
            parse_broker_list(bad)


def _topic(name: str, *replica_sets: tuple[int, ...], leader: int | None = None) -> TopicInfo:
    return TopicInfo(
        name,
        None,
        False,
        tuple(
            PartitionInfo(name, p, replicas[0] if leader is None else leader, 0, replicas, replicas)
            for p, replicas in enumerate(replica_sets)
        ),
    )


def test_a_proposal_keeps_each_topics_replication_factor_on_the_listed_brokers() -> None:
    topics = {"a": _topic("a", (1, 2), (2, 3), (3, 1)), "b": _topic("b", (1,), (2,))}
    proposed = propose(topics, [4, 5, 6], {}, random.Random(7))
    assert sorted(proposed) == [A0, A1, TopicPartition("a", 2), B0, TopicPartition("b", 1)]
    for tp, replicas in proposed.items():
        assert len(replicas) == (2 if tp.topic == "a" else 1)
        assert len(set(replicas)) == len(replicas)
        assert set(replicas) <= {4, 5, 6}
    # Leaders are striped: three partitions of "a" on three brokers lead on three brokers.
    assert {proposed[TopicPartition("a", p)][0] for p in range(3)} == {4, 5, 6}


def test_a_proposal_refuses_a_replication_factor_above_the_broker_list() -> None:
    with pytest.raises(UsageError, match="replication factor 2, more than the 1 brokers"):
        propose({"a": _topic("a", (1, 2))}, [1], {}, random.Random(1))


def test_verify_says_complete_in_progress_or_failed_per_partition() -> None:
    plan = {A0: [2], A1: [2], B0: [3], TopicPartition("gone", 0): [1]}
    current = {A0: (2,), A1: (2, 1), B0: (1,)}
    lines, ok = verify_lines(plan, current, {A1: object()})
    assert lines == [
        "Reassignment of partition a-0 is completed.",
        "Reassignment of partition a-1 is still in progress.",
        "Reassignment of partition b-0 failed: there is no active reassignment of it, but "
        "its replica set is [1] rather than [3].",
        "Reassignment of partition gone-0 failed: the partition does not exist.",
    ]
    assert not ok
    assert verify_lines({A0: [2]}, current, {}) == (
        ["Reassignment of partition a-0 is completed."],
        True,
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--execute"], "--execute needs --reassignment-json-file"),
        (["--verify"], "--verify needs --reassignment-json-file"),
        (["--generate"], "--generate needs --topics-to-move-json-file"),
    ],
)
def test_reassign_modes_without_their_file_are_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["reassign-partitions", *NOWHERE, *argv]) == 2
    err = capsys.readouterr().err
    assert err == f"tidelog reassign-partitions: {message}\n"


def test_reassign_refuses_bad_files_before_connecting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "plan.json"
    broken.write_text('{"version":1,"partitions":[')
    assert (
        main(
            ["reassign-partitions", *NOWHERE, "--execute", "--reassignment-json-file", str(broken)]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("tidelog reassign-partitions: --reassignment-json-file ")
    assert "not valid JSON" in err and err.count("\n") == 1
    missing = tmp_path / "absent.json"
    assert (
        main(
            ["reassign-partitions", *NOWHERE, "--cancel", "--reassignment-json-file", str(missing)]
        )
        == 2
    )
    assert "No such file" in capsys.readouterr().err
    topics = tmp_path / "topics.json"
    topics.write_text('{"version":1,"topics":[{"topic":"a"}]}')
    generate = ["--generate", "--topics-to-move-json-file", str(topics)]
    assert main(["reassign-partitions", *NOWHERE, *generate]) == 2
    assert "--generate needs --broker-list" in capsys.readouterr().err
    assert main(["reassign-partitions", *NOWHERE, *generate, "--broker-list", "1,1"]) == 2
    assert "lists a broker twice" in capsys.readouterr().err


def test_reassign_takes_exactly_one_mode(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["reassign-partitions", *NOWHERE, "--execute", "--verify"])
    assert exited.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


# ---------------------------------------------------------------------------- elections


def test_election_lines_follow_kafka_leader_election() -> None:
    outcomes = {
        A1: None,
        A0: None,
        B0: ClientError("ELECTION_NOT_NEEDED: b-0", code=ErrorCode.ELECTION_NOT_NEEDED),
        TopicPartition("c", 0): ClientError(
            "PREFERRED_LEADER_NOT_AVAILABLE: c-0", code=ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE
        ),
    }
    lines, errors = outcome_lines("preferred", outcomes)
    assert lines == [
        "Successfully completed leader election (PREFERRED) for partitions a-0, a-1",
        "Valid replica already elected for partitions b-0",
    ]
    assert errors == [
        "Error completing leader election (PREFERRED) for partition: c-0: "
        "PREFERRED_LEADER_NOT_AVAILABLE: c-0"
    ]


def test_election_partitions_file() -> None:
    data = {"partitions": [{"topic": "a", "partition": 1}, {"topic": "b", "partition": 0}]}
    assert parse_partitions_json(data) == [A1, B0]
    with pytest.raises(UsageError, match="listed twice"):
        parse_partitions_json({"partitions": [{"topic": "a", "partition": 1}] * 2})
    with pytest.raises(UsageError, match="expected a topic and a partition"):
        parse_partitions_json({"partitions": [{"topic": "a"}]})
    with pytest.raises(UsageError, match="no partition"):
        parse_partitions_json({"partitions": []})


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--topic", "a"],
        ["--partition", "0"],
        ["--topic", "a", "--partition", "0", "--all-topic-partitions"],
        ["--all-topic-partitions", "--path-to-json-file", "x.json"],
        ["--topic", "a", "--partition", "-1"],
    ],
)
def test_election_needs_exactly_one_way_to_name_partitions(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["leader-election", *NOWHERE, "--election-type", "preferred", *argv])
    assert status == 2
    err = capsys.readouterr().err
    assert err.startswith("tidelog leader-election: ") and err.count("\n") == 1


def test_election_type_is_checked_and_case_insensitive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["leader-election", *NOWHERE, "--election-type", "random", "--all-topic-partitions"])
    assert exited.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
    # UNCLEAN is accepted (Kafka's spelling); with no broker listening it fails to connect.
    status = main(
        ["leader-election", *NOWHERE, "--election-type", "UNCLEAN", "--all-topic-partitions"]
    )
    assert status == 1


# ---------------------------------------------------------------------------- topics describe


def _state(
    replicas: tuple[int, ...],
    isr: tuple[int, ...],
    leader: int = 1,
    adding: tuple[int, ...] = (),
    removing: tuple[int, ...] = (),
) -> PartitionState:
    return PartitionState("t", 0, leader, replicas, isr, (), adding, removing)


def test_partition_filters_follow_kafka_topics() -> None:
    live = {1, 2, 3}
    healthy = _state((1, 2, 3), (1, 2, 3))
    behind = _state((1, 2, 3), (1, 2))
    leaderless = _state((1, 2, 3), (3,), leader=-1)
    dead_leader = _state((4, 1), (4, 1), leader=4)
    assert not healthy.matches("under-replicated-partitions", live, 2)
    assert behind.matches("under-replicated-partitions", live, 2)
    assert leaderless.matches("unavailable-partitions", live, 2)
    assert dead_leader.matches("unavailable-partitions", live, 2)
    assert not healthy.matches("unavailable-partitions", live, 2)
    assert leaderless.matches("under-min-isr-partitions", live, 1)
    assert _state((1, 2, 3), (1,)).matches("under-min-isr-partitions", live, 2)
    assert not behind.matches("under-min-isr-partitions", live, 2)
    assert behind.matches("at-min-isr-partitions", live, 2)
    assert not healthy.matches("at-min-isr-partitions", live, 2)
    # Without a known min.insync.replicas only a missing leader counts.
    assert not behind.matches("under-min-isr-partitions", live, None)
    assert not behind.matches("at-min-isr-partitions", live, None)


def test_a_partition_gaining_replicas_is_measured_against_its_target() -> None:
    # Moving from [1] to [2,3]: replicas are the target then the removing one.
    moving = _state((2, 3, 1), (1,), adding=(2, 3), removing=(1,))
    assert moving.replication_factor == 1
    assert not moving.matches("under-replicated-partitions", {1, 2, 3}, 1)


def test_reassignment_and_offline_columns_appear_only_when_used(
    capsys: pytest.CaptureFixture[str],
) -> None:
    print_partitions([_state((1,), (1,))], with_topic=False)
    assert capsys.readouterr().out.split("\n")[0].split() == [
        "PARTITION",
        "LEADER",
        "REPLICAS",
        "ISR",
    ]
    moving = _state((2, 1), (1,), adding=(2,), removing=(1,))
    offline = PartitionState("u", 3, -1, (5,), (5,), (5,))
    print_partitions([moving, offline], with_topic=True)
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert rows == [
        ["TOPIC", "PARTITION", "LEADER", "REPLICAS", "ISR", "ADDING", "REMOVING", "OFFLINE"],
        ["t", "0", "1", "2,1", "1", "2", "1"],
        ["u", "3", "none", "5", "5", "5"],
    ]


# ---------------------------------------------------------------------------- cluster describe


def test_leader_and_replica_counts_per_broker() -> None:
    topics = [
        _topic("a", (1, 2), (2, 3), (3, 1)),
        _topic("b", (2,), (2,), leader=-1),
    ]
    leaders, replicas = replica_counts(topics)
    assert dict(leaders) == {1: 1, 2: 1, 3: 1}
    assert dict(replicas) == {1: 2, 2: 4, 3: 2}
