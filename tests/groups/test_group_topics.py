"""Several groups on one topic, and `tidelog groups describe` reporting a group's lag."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from group_harness import (
    TIMEOUT_S,
    GroupBroker,
    Members,
    Names,
    assert_exactly_once,
    create_topic,
    ends_of,
    produce,
    python_member,
    values,
    wait_assigned,
    wait_consumed,
    wait_until,
)

PARTITIONS = 4
COUNT = 200


def test_two_groups_each_get_every_record(
    broker: GroupBroker, names: Names, members: Members
) -> None:
    create_topic(broker.bootstrap, names.topic, PARTITIONS)
    groups = {
        f"{names.group}-a": ("confluent", "confluent"),
        f"{names.group}-b": ("kafka-python", "aiokafka"),
    }
    started = {
        group: [
            members.add(
                python_member(client, broker.bootstrap, names.topic, group, name=f"{group}-{i}")
            )
            for i, client in enumerate(clients)
        ]
        for group, clients in groups.items()
    }
    for group, of_group in started.items():
        wait_assigned(of_group, PARTITIONS, f"{group} to share the topic")
    expected = values("g", COUNT)
    produce(broker.bootstrap, names.topic, expected, PARTITIONS)
    for of_group in started.values():
        wait_consumed(of_group, ends_of(COUNT, PARTITIONS))
    for of_group in started.values():
        for m in of_group:
            m.stop()
        assert_exactly_once(of_group, expected, PARTITIONS)


def describe_lag(bootstrap: str, group: str) -> dict[int, tuple[str, str, str, str]]:
    """`tidelog groups describe`: partition -> (CURRENT-OFFSET, LOG-END-OFFSET, LAG,
    CONSUMER-ID) from its table."""
    tidelog = Path(sys.executable).parent / "tidelog"
    result = subprocess.run(
        [str(tidelog), "groups", "describe", group, "--bootstrap-server", bootstrap],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header_at = next(i for i, line in enumerate(lines) if line.split()[:2] == ["GROUP", "TOPIC"])
    header = lines[header_at].split()
    rows: dict[int, tuple[str, str, str, str]] = {}
    for line in lines[header_at + 1 :]:
        cells = line.split()
        if not cells:
            continue
        row = dict(zip(header, cells, strict=False))
        rows[int(row["PARTITION"])] = (
            row["CURRENT-OFFSET"],
            row["LOG-END-OFFSET"],
            row["LAG"],
            row["CONSUMER-ID"],
        )
    return rows


def test_describe_shows_lag_of_a_consumer_behind(broker: GroupBroker, names: Names) -> None:
    create_topic(broker.bootstrap, names.topic, PARTITIONS)
    produce(broker.bootstrap, names.topic, values("l", COUNT), PARTITIONS)
    ends = ends_of(COUNT, PARTITIONS)
    done = {0: 0, 1: 7, 2: 31, 3: ends[3]}

    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": names.group,
            "session.timeout.ms": 6000,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        assigned: list[int] = []
        consumer.subscribe(
            [names.topic], on_assign=lambda _c, tps: assigned.extend(tp.partition for tp in tps)
        )
        wait_until(lambda: (consumer.poll(0.1), len(assigned) == PARTITIONS)[1], "the assignment")
        consumer.commit(
            offsets=[TopicPartition(names.topic, p, n) for p, n in done.items() if n],
            asynchronous=False,
        )
        member_id = consumer.memberid()
        rows = describe_lag(broker.bootstrap, names.group)
        assert rows == {
            p: (str(n) if n else "-", str(ends[p]), str(ends[p] - n) if n else "-", member_id)
            for p, n in done.items()
        }
    finally:
        consumer.close()

    # With nobody left in the group the committed offsets and their lag stay.
    wait_until(
        lambda: all(r[3] == "-" for r in describe_lag(broker.bootstrap, names.group).values()),
        "the group to be empty",
        TIMEOUT_S,
    )
    rows = describe_lag(broker.bootstrap, names.group)
    assert {p: r[2] for p, r in rows.items() if done[p]} == {
        p: str(ends[p] - n) for p, n in done.items() if n
    }
