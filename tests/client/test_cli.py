"""The networked `tidelog` commands end to end, in-process, against a real broker."""

from __future__ import annotations

import io
import json
import sys

import pytest

from tidelog.cli.main import main

pytestmark = pytest.mark.slow


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_topics_produce_consume_configs(
    broker, topic_name: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bs = ("--bootstrap-server", broker.bootstrap)
    status, out, _ = _run(
        capsys,
        "topics",
        "create",
        *bs,
        "--topic",
        topic_name,
        "--partitions",
        "2",
        "--replication-factor",
        "1",
        "--config",
        "retention.ms=60000",
    )
    assert status == 0 and f"Topic {topic_name} created." in out
    status, out, _ = _run(capsys, "topics", "list", *bs)
    assert status == 0 and topic_name in out.split()
    status, out, _ = _run(capsys, "topics", "describe", *bs, "--topic", topic_name)
    assert status == 0
    lines = out.splitlines()
    assert lines[0].startswith(f"Topic: {topic_name}") and "PartitionCount: 2" in lines[0]
    header = next(i for i, line in enumerate(lines) if line.startswith("PARTITION"))
    assert lines[header].split() == ["PARTITION", "LEADER", "REPLICAS", "ISR"]
    assert [line.split()[0] for line in lines[header + 1 :]] == ["0", "1"]

    stdin = io.TextIOWrapper(io.BytesIO(b"k1:hello\nk2:world\nk1:again\n"))
    monkeypatch.setattr(sys, "stdin", stdin)
    status, _, err = _run(
        capsys,
        "produce",
        *bs,
        "--topic",
        topic_name,
        "--property",
        "parse.key=true",
        "--property",
        "key.separator=:",
        "--header",
        "source=cli",
        "--compression",
        "lz4",
        "--acks",
        "1",
    )
    assert status == 0, err

    status, out, err = _run(
        capsys,
        "consume",
        *bs,
        "--topic",
        topic_name,
        "--from-beginning",
        "--max-messages",
        "3",
        "--format",
        "json",
        "--timeout-ms",
        "10000",
    )
    assert status == 0 and "Processed a total of 3 messages" in err
    records = [json.loads(line) for line in out.splitlines()]
    assert sorted((r["key"], r["value"]) for r in records) == [
        ("k1", "again"),
        ("k1", "hello"),
        ("k2", "world"),
    ]
    assert all(r["headers"] == [["source", "cli"]] and r["topic"] == topic_name for r in records)
    k1 = [r for r in records if r["key"] == "k1"]
    assert k1[0]["partition"] == k1[1]["partition"]

    partition = k1[0]["partition"]
    status, out, _ = _run(
        capsys,
        "consume",
        *bs,
        "--topic",
        topic_name,
        "--partition",
        str(partition),
        "--offset",
        "1",
        "--format",
        "kv",
        "--timeout-ms",
        "1000",
    )
    expected = [
        f"{r['key']}\t{r['value']}"
        for r in sorted(records, key=lambda r: r["offset"])
        if r["partition"] == partition and r["offset"] >= 1
    ]
    assert expected and expected[-1] == "k1\tagain"
    assert status == 0 and out.splitlines() == expected

    status, out, _ = _run(
        capsys,
        "consume",
        *bs,
        "--topic",
        topic_name,
        "--from-time",
        "0",
        "--max-messages",
        "3",
        "--timeout-ms",
        "5000",
    )
    assert status == 0 and sorted(out.split()) == ["again", "hello", "world"]

    status, out, _ = _run(
        capsys,
        "configs",
        "describe",
        *bs,
        "--entity-type",
        "topics",
        "--entity-name",
        topic_name,
        "--all",
    )
    assert status == 0
    row = next(line.split() for line in out.splitlines() if line.startswith("retention.ms"))
    assert row[1] == "60000"

    status, out, _ = _run(capsys, "topics", "delete", *bs, "--topic", topic_name)
    assert status == 0
    status, out, _ = _run(capsys, "topics", "list", *bs)
    assert topic_name not in out.split()


def test_errors_are_one_line_with_nonzero_status(
    broker, capsys: pytest.CaptureFixture[str]
) -> None:
    bs = ("--bootstrap-server", broker.bootstrap)
    status, _, err = _run(capsys, "topics", "describe", *bs, "--topic", "no-such-topic-here")
    assert status == 1
    assert err.startswith("tidelog topics describe: ") and "UNKNOWN_TOPIC_OR_PARTITION" in err
    assert err.count("\n") == 1
    status, _, err = _run(capsys, "topics", "create", *bs, "--topic", "x", "--config", "oops")
    assert status == 2 and "expected key=value" in err
    status, _, err = _run(capsys, "topics", "list", "--bootstrap-server", "127.0.0.1:1")
    assert status == 1 and err.startswith("tidelog topics list: ") and "NETWORK_EXCEPTION" in err
