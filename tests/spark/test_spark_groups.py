"""A stream with groupIdPrefix / kafka.group.id records its progress as a consumer group, seen
by the Admin client and by `tidelog groups describe`; a failed group commit never fails the
query."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import options, produce, run_available_now

from tidelog.client import Admin, Consumer, TopicPartition
from tidelog.spark.options import TidelogOptionError, parse_source_options
from tidelog.spark.source import TidelogStreamReader

TIDELOG = Path(sys.executable).parent / "tidelog"


def committed(bootstrap: str, group: str) -> dict[TopicPartition, int]:
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        found = admin.list_consumer_group_offsets(group)
    return {tp: o.offset for tp, o in found.items() if o is not None}


def log_ends(bootstrap: str, topic: str, partitions: int) -> dict[TopicPartition, int]:
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        answers = admin.list_offsets(
            {TopicPartition(topic, p): "latest" for p in range(partitions)}
        )
    return {tp: a.offset for tp, a in answers.items()}


def cli_describe(bootstrap: str, group: str) -> tuple[str, dict[int, tuple[int, int, int]]]:
    """`tidelog groups describe`: its header line and, per partition, (current offset, log end
    offset, lag) read from the printed table."""
    done = subprocess.run(
        [str(TIDELOG), "groups", "describe", "--bootstrap-server", bootstrap, group],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    table = lines[lines.index(next(x for x in lines if x.startswith("GROUP "))) :]
    header = table[0].split()
    rows: dict[int, tuple[int, int, int]] = {}
    for line in table[1:]:
        cells = dict(zip(header, line.split(), strict=False))
        assert cells["GROUP"] == group
        rows[int(cells["PARTITION"])] = (
            int(cells["CURRENT-OFFSET"]),
            int(cells["LOG-END-OFFSET"]),
            int(cells["LAG"]),
        )
    return lines[0], rows


def test_group_name_is_kafka_group_id_else_group_id_prefix_verbatim() -> None:
    base = {"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "t"}
    assert parse_source_options(base, streaming=True).group_id is None
    prefixed = parse_source_options({**base, "groupIdPrefix": "orders"}, streaming=True)
    assert prefixed.group_id == "orders"
    # The admin that commits gets the connection settings, not consumer-only keys.
    both = parse_source_options(
        {**base, "groupIdPrefix": "orders", "kafka.group.id": "exact", "kafka.client.id": "c"},
        streaming=True,
    )
    assert both.group_id == "exact"
    assert "group.id" not in both.admin_client
    assert both.admin_client["client.id"] == "c"
    with pytest.raises(TidelogOptionError, match="groupIdPrefix"):
        parse_source_options({**base, "groupIdPrefix": " "}, streaming=True)


def test_stream_progress_shows_as_group_lag_and_survives_a_restart(
    spark: Any, broker: Any, make_topic: Any, topic: str, tmp_path: Path
) -> None:
    make_topic(topic, 3)
    produce(broker.bootstrap, topic, [(i % 3, None, b"x", None, []) for i in range(600)])
    group = f"pipeline-{topic}"
    opts = options(
        broker.bootstrap,
        subscribe=topic,
        startingOffsets="earliest",
        maxOffsetsPerTrigger=250,
        groupIdPrefix=group,
    )
    checkpoint = str(tmp_path / "cp")
    batches = run_available_now(spark, opts, checkpoint)
    assert [len(b) for b in batches] == [250, 250, 100]
    ends = log_ends(broker.bootstrap, topic, 3)
    assert ends == {TopicPartition(topic, p): 200 for p in range(3)}
    # The last micro-batch's end is the group's offset: no lag.
    assert committed(broker.bootstrap, group) == ends
    title, rows = cli_describe(broker.bootstrap, group)
    assert "State: Empty" in title
    assert rows == {p: (200, 200, 0) for p in range(3)}

    # New records: the lag is what was added, until a micro-batch reads them.
    added = {0: 7, 1: 0, 2: 30}
    produce(
        broker.bootstrap,
        topic,
        [(p, None, b"y", None, []) for p, k in added.items() for _ in range(k)],
    )
    _, rows = cli_describe(broker.bootstrap, group)
    assert rows == {p: (200, 200 + k, k) for p, k in added.items()}

    # The same query restarted from its checkpoint commits under the same group.
    again = run_available_now(spark, opts, checkpoint)
    assert sorted(x for b in again for x in b) == sorted(
        (p, 200 + i) for p, k in added.items() for i in range(k)
    )
    assert committed(broker.bootstrap, group) == log_ends(broker.bootstrap, topic, 3)
    _, rows = cli_describe(broker.bootstrap, group)
    assert rows == {p: (200 + k, 200 + k, 0) for p, k in added.items()}


def test_running_query_commits_each_micro_batch(
    spark: Any, broker: Any, make_topic: Any, topic: str, tmp_path: Path
) -> None:
    make_topic(topic, 2)
    produce(broker.bootstrap, topic, [(i % 2, None, b"x", None, []) for i in range(100)])
    group = f"exact-{topic}"
    query = (
        spark.readStream.format("tidelog")
        .options(
            **options(
                broker.bootstrap,
                subscribe=topic,
                startingOffsets="earliest",
                **{"kafka.group.id": group},
            )
        )
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:
        query.processAllAvailable()
        assert committed(broker.bootstrap, group) == {TopicPartition(topic, p): 50 for p in (0, 1)}
        produce(broker.bootstrap, topic, [(1, None, b"y", None, []) for _ in range(25)])
        query.processAllAvailable()
        assert committed(broker.bootstrap, group) == {
            TopicPartition(topic, 0): 50,
            TopicPartition(topic, 1): 75,
        }
    finally:
        query.stop()
    assert query.exception() is None


def test_a_failed_group_commit_warns_and_is_tried_again(
    broker: Any, make_topic: Any, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    make_topic(topic, 1)
    produce(broker.bootstrap, topic, [(0, None, b"x", None, []) for _ in range(10)])
    group = f"busy-{topic}"
    reader = TidelogStreamReader(
        parse_source_options(
            options(broker.bootstrap, subscribe=topic, groupIdPrefix=group), streaming=True
        )
    )
    end = {topic: {"0": 10}}
    # A live member owns the group: the coordinator refuses commits from outside it.
    member = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        member.subscribe([topic])
        polled = 0
        for _ in range(100):
            polled += len(member.poll(0.2))
            if polled >= 10:
                break
        assert polled == 10
        with caplog.at_level(logging.WARNING, logger="tidelog.spark.source"):
            reader.commit(end)  # must not raise
            reader.commit(end)
        warnings = [r for r in caplog.records if "consumer group" in r.getMessage()]
        assert len(warnings) == 1  # the same error again is not logged again at once
        assert group in warnings[0].getMessage()
    finally:
        member.close()
    reader.commit(end)
    assert committed(broker.bootstrap, group) == {TopicPartition(topic, 0): 10}
    reader.stop()
