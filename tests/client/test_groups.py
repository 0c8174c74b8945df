"""Consumer-group administration against a real broker: a confluent-kafka group commits, then
the admin API and `tidelog groups` list, describe, reset and delete it.

Tansu (TIDELOG_TEST_BROKER=tansu) differs from Kafka where the tests check ``broker.kind``: DescribeGroups
returns members without client id, host or assignment (and no protocol name); ListGroups
reports every state as "Unknown"; it deletes a group that still has members; it has no
OffsetDelete; and ListOffsets "latest" answers the last batch's base offset + 1, so records
here are produced one per batch to keep log end offsets right.
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer as GroupConsumer
from confluent_kafka import KafkaError
from confluent_kafka import TopicPartition as CKTopicPartition

from tidelog.cli.main import main
from tidelog.client import Admin, ClientError, NewTopic, PartialFailureError, Producer
from tidelog.client import TopicPartition as TP
from tidelog.protocol import ErrorCode

pytestmark = pytest.mark.slow

PER_PARTITION = 5


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def _rows(out: str, header_first: str) -> list[list[str]]:
    """The rows of the table whose header starts with ``header_first`` (split on blanks)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == [header_first])
    rows = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        rows.append(line.split())
    return rows


def _group_consumer(bootstrap: str, group: str, client_id: str) -> GroupConsumer:
    return GroupConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "client.id": client_id,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            # Kafka's smallest session timeout: the group forms in seconds.
            "session.timeout.ms": 6000,
        }
    )


def _consume(consumer: GroupConsumer, count: int) -> list[tuple[int, int]]:
    """(partition, offset) of the first ``count`` records, or fewer if none come for 15 s."""
    got: list[tuple[int, int]] = []
    deadline = time.monotonic() + 15
    while len(got) < count and time.monotonic() < deadline:
        for msg in consumer.consume(count - len(got), timeout=0.5):
            if msg.error() is not None:
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                continue
            got.append((msg.partition(), msg.offset()))
            deadline = time.monotonic() + 15
    return got


@pytest.fixture
def topic(broker, topic_name: str) -> str:
    with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
        admin.create_topics([NewTopic(topic_name, 2, 1)])
    with Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0}) as producer:
        for i in range(2 * PER_PARTITION):
            # One record per batch (waiting for each): see the module docstring.
            producer.send(topic_name, f"v{i}".encode(), partition=i % 2).result(30)
    return topic_name


def test_group_lifecycle(broker, topic: str, capsys: pytest.CaptureFixture[str]) -> None:
    tansu = broker.kind == "tansu"
    bs = ("--bootstrap-server", broker.bootstrap)
    group = f"cg-{uuid.uuid4().hex[:10]}"
    t0, t1 = TP(topic, 0), TP(topic, 1)
    consumer = _group_consumer(broker.bootstrap, group, "lifecycle-client")
    try:
        consumer.subscribe([topic])
        seen = _consume(consumer, 2 * PER_PARTITION)
        assert sorted(seen) == [(p, o) for p in (0, 1) for o in range(PER_PARTITION)]
        # Consumed up to offset 2 of partition 0 and all of partition 1.
        consumer.commit(
            offsets=[CKTopicPartition(topic, 0, 3), CKTopicPartition(topic, 1, PER_PARTITION)],
            asynchronous=False,
        )
        member_id = consumer.memberid()

        with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
            committed = admin.list_consumer_group_offsets(group)
            assert {tp: o.offset for tp, o in committed.items() if o is not None} == {
                t0: 3,
                t1: PER_PARTITION,
            }
            description = admin.describe_groups([group])[group]
            assert [m.member_id for m in description.members] == [member_id]
            assert description.protocol_type == "consumer"
            assert not description.is_inactive
            if not tansu:
                assert description.state == "Stable"
                (member,) = description.members
                assert member.client_id == "lifecycle-client"
                assert sorted(member.assignment) == [t0, t1]
                assert member.subscription is not None and member.subscription.topics == (topic,)
            # Committing from outside an active group is refused with a clear error.
            with pytest.raises(PartialFailureError, match="has active members") as refused:
                admin.alter_consumer_group_offsets(group, {t0: 0})
            assert refused.value.code is ErrorCode.UNKNOWN_MEMBER_ID

        status, out, err = _run(capsys, "groups", "list", *bs)
        assert status == 0, err
        listed = {row[0]: row[1:] for row in _rows(out, "GROUP")}
        assert listed[group] == ["Unknown" if tansu else "Stable", "consumer"]

        status, out, err = _run(capsys, "groups", "describe", group, *bs)
        assert status == 0, err
        members = _rows(out, "CONSUMER-ID")
        assert [m[0] for m in members] == [member_id]
        owner = ["-", "-", "-"] if tansu else [member_id, members[0][2], "lifecycle-client"]
        if not tansu:
            assert members[0][3:] == ["lifecycle-client", "2", f"{topic}(0,1)"]
        assert _rows(out, "GROUP") == [
            [group, topic, "0", "3", str(PER_PARTITION), str(PER_PARTITION - 3), *owner],
            [group, topic, "1", str(PER_PARTITION), str(PER_PARTITION), "0", *owner],
        ]

        status, out, err = _run(
            capsys, "groups", "reset-offsets", group, "--topic", topic, "--to-earliest", *bs
        )
        assert status == 1 and out == ""
        assert err.startswith("tidelog groups: ") and "inactive" in err
        assert len(err.splitlines()) == 1
    finally:
        consumer.close()

    with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
        assert admin.describe_groups([group])[group].state == "Empty"

    # Dry run (the default) prints the plan and changes nothing.
    status, out, err = _run(
        capsys, "groups", "reset-offsets", group, "--topic", topic, "--to-earliest", *bs
    )
    assert status == 0, err
    assert _rows(out, "TOPIC") == [[topic, "0", "0"], [topic, "1", "0"]]
    assert "Dry run" in out and "--execute" in out
    with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
        committed = admin.list_consumer_group_offsets(group)
        assert {tp: o.offset for tp, o in committed.items() if o is not None} == {
            t0: 3,
            t1: PER_PARTITION,
        }

    # --execute on the stopped group: partition 0 to offset 1, partition 1 back by 2; an
    # offset past the end is clamped to it.
    status, out, err = _run(
        capsys,
        "groups",
        "reset-offsets",
        group,
        "--topic",
        f"{topic}:0",
        "--to-offset",
        "1",
        "--execute",
        *bs,
    )
    assert status == 0, err
    assert _rows(out, "TOPIC") == [[topic, "0", "1"]] and "reset" in out
    status, out, err = _run(
        capsys,
        "groups",
        "reset-offsets",
        group,
        "--topic",
        f"{topic}:1",
        "--shift-by",
        "-2",
        "--execute",
        *bs,
    )
    assert status == 0, err
    assert _rows(out, "TOPIC") == [[topic, "1", str(PER_PARTITION - 2)]]
    with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
        committed = admin.list_consumer_group_offsets(group, [t0, t1, TP(topic, 9)])
        assert {tp: None if o is None else o.offset for tp, o in committed.items()} == {
            t0: 1,
            t1: PER_PARTITION - 2,
            TP(topic, 9): None,
        }

    # A new member of the group starts where the offsets now point.
    consumer = _group_consumer(broker.bootstrap, group, "second-client")
    try:
        consumer.subscribe([topic])
        seen = _consume(consumer, (PER_PARTITION - 1) + 2)
    finally:
        consumer.close()
    assert sorted(seen) == [(0, o) for o in range(1, PER_PARTITION)] + [
        (1, o) for o in range(PER_PARTITION - 2, PER_PARTITION)
    ]

    status, out, err = _run(capsys, "groups", "delete", group, *bs)
    assert status == 0, err
    assert out == f"Group {group} deleted.\n"
    status, out, err = _run(capsys, "groups", "list", *bs)
    assert status == 0, err
    assert group not in [row[0] for row in _rows(out, "GROUP")]
    with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
        assert admin.list_consumer_group_offsets(group) == {}


def test_to_datetime_and_latest_reset(
    broker, topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Resets of a group that never had members: a time after every record maps to the end
    of the log, the epoch to its start; --to-latest (dry run) to the end."""
    tansu = broker.kind == "tansu"
    bs = ("--bootstrap-server", broker.bootstrap)
    group = f"cg-{uuid.uuid4().hex[:10]}"
    with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
        admin.alter_consumer_group_offsets(group, {TP(topic, 0): 2, TP(topic, 1): 4})
    status, out, err = _run(
        capsys,
        "groups",
        "reset-offsets",
        group,
        "--topic",
        topic,
        "--to-datetime",
        "2999-01-01T00:00:00",
        "--execute",
        *bs,
    )
    assert status == 0, err
    # Tansu answers offset 0 (timestamp -1) where Kafka answers -1 for "no record that late".
    end = "0" if tansu else str(PER_PARTITION)
    assert _rows(out, "TOPIC") == [[topic, "0", end], [topic, "1", end]]
    status, out, err = _run(
        capsys,
        "groups",
        "reset-offsets",
        group,
        "--topic",
        topic,
        "--to-datetime",
        "1970-01-01T00:00:00Z",
        "--execute",
        *bs,
    )
    assert status == 0, err
    assert _rows(out, "TOPIC") == [[topic, "0", "0"], [topic, "1", "0"]]
    status, out, err = _run(
        capsys, "groups", "reset-offsets", group, "--all-topics", "--to-latest", *bs
    )
    assert status == 0, err
    assert _rows(out, "TOPIC") == [
        [topic, "0", str(PER_PARTITION)],
        [topic, "1", str(PER_PARTITION)],
    ]
    with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
        offsets = admin.list_consumer_group_offsets(group)
        assert {tp: o.offset for tp, o in offsets.items() if o is not None} == {
            TP(topic, 0): 0,
            TP(topic, 1): 0,
        }
        if tansu:
            with pytest.raises(ClientError) as unsupported:
                admin.delete_consumer_group_offsets(group, [TP(topic, 0)])
            assert unsupported.value.code is ErrorCode.UNSUPPORTED_VERSION
        else:
            admin.delete_consumer_group_offsets(group, [TP(topic, 0)])
            assert set(admin.list_consumer_group_offsets(group)) == {TP(topic, 1)}
        admin.delete_groups([group])


def test_cli_errors(broker, capsys: pytest.CaptureFixture[str]) -> None:
    tansu = broker.kind == "tansu"
    bs = ("--bootstrap-server", broker.bootstrap)
    missing = f"cg-missing-{uuid.uuid4().hex[:8]}"
    status, out, err = _run(
        capsys, "groups", "reset-offsets", missing, "--topic", "x:a", "--to-earliest", *bs
    )
    assert (status, out) == (2, "")
    assert err == "tidelog groups: --topic 'x:a': partitions are integers\n"
    status, out, err = _run(
        capsys,
        "groups",
        "reset-offsets",
        missing,
        "--topic",
        "x",
        "--to-datetime",
        "soon",
        *bs,
    )
    assert status == 2 and err.startswith("tidelog groups: --to-datetime: ")
    status, _, err = _run(capsys, "groups", "list", "--bootstrap-server", "127.0.0.1:1")
    assert status == 1 and err.startswith("tidelog groups: ") and len(err.splitlines()) == 1
    if not tansu:
        # Tansu describes any unknown group as an Empty one.
        status, out, err = _run(capsys, "groups", "describe", missing, *bs)
        assert (status, out) == (1, "")
        assert err == f"tidelog groups: consumer group {missing!r} does not exist\n"
