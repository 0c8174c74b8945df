"""The networked `tidelog` commands end to end, in-process, against a real broker."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

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


# -- tidelog perf consume ----------------------------------------------------------------------

SUMMARY_HEADER = (
    "start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, "
    "rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec"
)
MIB = 1024 * 1024


def _fill(bootstrap: str, topic: str, partitions: int, count: int) -> int:
    """``count`` records with keys and values of varied sizes (some null); their bytes."""
    from tidelog.client import Admin, NewTopic, Producer

    with Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(topic, partitions, 1)])
    nbytes = 0
    with Producer({"bootstrap.servers": bootstrap, "linger.ms": 2}) as producer:
        futures = []
        for i in range(count):
            key = None if i % 3 == 0 else b"k%d" % i
            value = None if i % 7 == 0 else b"v" * (i % 120)
            nbytes += len(key or b"") + len(value or b"")
            futures.append(producer.send(topic, value, key=key))
        assert producer.flush(30) == 0
        assert all(f.exception() is None for f in futures)
    return nbytes


def _perf_consume(bootstrap: str, *argv: str) -> subprocess.CompletedProcess[str]:
    command = [str(Path(sys.executable).parent / "tidelog"), "perf", "consume"]
    return subprocess.run(
        [*command, "--bootstrap-server", bootstrap, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _summary(stdout: str) -> list[str]:
    fields = stdout.splitlines()[-1].split(", ")
    assert len(fields) == 10, stdout
    return fields


def test_perf_consume_reads_exactly_the_records_asked_for(broker, topic_name: str) -> None:
    nbytes = _fill(broker.bootstrap, topic_name, 3, 3000)
    done = _perf_consume(
        broker.bootstrap, "--topic", topic_name, "--messages", "3000", "--reporting-interval", "50"
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == SUMMARY_HEADER and len(lines) == 2
    fields = _summary(done.stdout)
    assert fields[4] == "3000"
    assert fields[2] == f"{nbytes / MIB:.4f}"
    assert fields[6] == "0"  # no group, no rebalance
    assert fields[0] <= fields[1]  # start and end times, same format, same day
    assert all(
        re.fullmatch(
            r"\d+ records consumed, [\d.]+ records/sec \([\d.]+ MB/sec\), \d+ of 3000 in total\.",
            line,
        )
        for line in done.stderr.splitlines()
    ), done.stderr

    # Fewer than exist: exactly that many, the rest stays.
    done = _perf_consume(
        broker.bootstrap, "--topic", topic_name, "--messages", "1234", "--hide-header"
    )
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 1 and _summary(done.stdout)[4] == "1234"


SHORT_SESSION = ("--consumer-property", "session.timeout.ms=6000")


def test_perf_consume_in_a_group_resumes_where_it_committed(broker, topic_name: str) -> None:
    _fill(broker.bootstrap, topic_name, 2, 1000)
    group = f"perf-{topic_name}"
    first = _perf_consume(
        broker.bootstrap,
        "--topic",
        topic_name,
        "--messages",
        "600",
        "--group",
        group,
        # Tansu takes about half the session timeout to complete a join (45 s by default).
        *SHORT_SESSION,
        "--show-detailed-stats",
        "--reporting-interval",
        "20",
    )
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    detailed_header = "time, threadId" + SUMMARY_HEADER.split("end.time")[1]
    assert lines[0] == detailed_header
    assert lines[-2] == SUMMARY_HEADER
    rows = [line.split(", ") for line in lines[1:-2]]
    assert rows and all(len(row) == 10 and row[1] == "0" for row in rows)
    assert [int(row[4]) for row in rows] == sorted(int(row[4]) for row in rows)
    assert rows[-1][4] == "600"  # cumulative count of the last interval
    assert _summary(first.stdout)[4] == "600"
    assert int(_summary(first.stdout)[6]) >= 0
    assert first.stderr == ""  # detailed rows replace the progress lines
    # The group committed 600 on leaving: the other 400 remain for it, no more.
    rest = _perf_consume(
        broker.bootstrap,
        "--topic",
        topic_name,
        "--messages",
        "401",
        "--group",
        group,
        *SHORT_SESSION,
        "--timeout",
        "8000",  # counted from the start, so it covers the join (initial rebalance delay)
        "--hide-header",
    )
    assert rest.returncode == 1
    assert rest.stderr.splitlines()[-1] == (
        "tidelog perf consume: only 400 of 401 records arrived: none came for 8000 ms (--timeout)"
    )
    assert _summary(rest.stdout)[4] == "400"


def test_perf_consume_gives_up_after_the_timeout(broker, topic_name: str) -> None:
    _fill(broker.bootstrap, topic_name, 1, 10)
    # The idle timer starts before the first fetch: 1 s was too short for a loaded machine
    # to look up the offsets and fetch the ten records.
    done = _perf_consume(
        broker.bootstrap, "--topic", topic_name, "--messages", "20", "--timeout", "5000"
    )
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        "tidelog perf consume: only 10 of 20 records arrived: none came for 5000 ms (--timeout)"
    )
    assert _summary(done.stdout)[4] == "10"
    # From the end: the ten records already there do not count.
    done = _perf_consume(
        broker.bootstrap,
        "--topic",
        topic_name,
        "--messages",
        "1",
        "--timeout",
        "1000",
        "--from-latest",
    )
    if broker.kind == "tansu":
        return  # Tansu's latest offset is the last batch's base offset + 1 (compatibility.md)
    assert done.returncode == 1 and "only 0 of 1 records arrived" in done.stderr


def test_perf_consume_bad_flags_are_one_line_errors(
    broker, capsys: pytest.CaptureFixture[str]
) -> None:
    bs = ("--bootstrap-server", broker.bootstrap)
    for flags, message in (
        (("--messages", "0"), "--messages must be positive"),
        (("--messages", "5", "--timeout", "-1"), "--timeout must be positive"),
        (("--messages", "5", "--reporting-interval", "0"), "--reporting-interval must be positive"),
        (("--messages", "5", "--consumer-property", "oops"), "expected key=value"),
    ):
        status, out, err = _run(capsys, "perf", "consume", *bs, "--topic", "t", *flags)
        assert status == 2 and out == ""
        assert err.startswith("tidelog perf consume: ") and message in err
        assert err.count("\n") == 1
    status, _, err = _run(
        capsys,
        "perf",
        "consume",
        *bs,
        "--topic",
        "t",
        "--messages",
        "5",
        "--consumer-property",
        "no.such.property=1",
    )
    assert status == 1 and err.startswith("tidelog perf consume: ") and err.count("\n") == 1
    status, _, err = _run(
        capsys, "perf", "consume", *bs, "--topic", "no-such-topic-for-perf", "--messages", "5"
    )
    assert status == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in err and err.count("\n") == 1
