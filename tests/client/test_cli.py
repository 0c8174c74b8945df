"""The networked `tidelog` commands end to end, in-process, against a real broker."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import time
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


# -- consume --group, groups describe/list ------------------------------------------------------

# Tansu takes about half the session timeout to complete a join (45 s by default).
GROUP_SESSION = ("--consumer-property", "session.timeout.ms=6000")


def _produce_values(bootstrap: str, topic: str, values: list[str]) -> None:
    from tidelog.client import Producer

    with Producer({"bootstrap.servers": bootstrap}) as producer:
        futures = [
            producer.send(topic, v.encode(), key=f"k{n}".encode()) for n, v in enumerate(values)
        ]
        assert producer.flush(30) == 0
        assert all(f.exception() is None for f in futures)


def _table(out: str, first_header: str) -> list[dict[str, str]]:
    """Rows (header -> cell) of every table in ``out`` whose header starts with
    ``first_header``; cells hold no spaces."""
    rows: list[dict[str, str]] = []
    header: list[str] | None = None
    for line in out.splitlines():
        cells = line.split()
        if not cells:
            header = None
        elif cells[0] == first_header:
            header = cells
        elif header is not None:
            rows.append(dict(zip(header, cells, strict=True)))
    return rows


def _assert_no_lag(rows: list[dict[str, str]], tansu: bool) -> None:
    if tansu:
        return  # Tansu's latest offset is the last batch's base offset + 1 (compatibility.md)
    assert all(r["CURRENT-OFFSET"] == r["LOG-END-OFFSET"] and r["LAG"] == "0" for r in rows)


def _consume_group(
    capsys: pytest.CaptureFixture[str], bootstrap: str, topic: str, group: str, *flags: str
) -> tuple[int, list[str], str]:
    status, out, err = _run(
        capsys,
        "consume",
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        "--group",
        group,
        *GROUP_SESSION,
        "--timeout-ms",
        "30000",
        *flags,
    )
    return status, out.splitlines(), err


def test_consume_in_a_group_commits_and_the_next_run_resumes(
    broker, topic_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    tansu = broker.kind == "tansu"
    bs = ("--bootstrap-server", broker.bootstrap)
    _fill(broker.bootstrap, topic_name, 2, 0)
    first = [f"first-{n}" for n in range(6)]
    _produce_values(broker.bootstrap, topic_name, first)
    group = f"g-{topic_name}"

    status, lines, err = _consume_group(
        capsys, broker.bootstrap, topic_name, group, "--from-beginning", "--max-messages", "6"
    )
    assert status == 0 and "Processed a total of 6 messages" in err
    assert sorted(lines) == sorted(first)

    status, out, err = _run(capsys, "groups", "describe", *bs, group)
    assert status == 0, err
    rows = _table(out, "GROUP")
    # Every record was consumed, so what the group committed is each partition's end.
    assert sorted(r["PARTITION"] for r in rows) == ["0", "1"]
    assert sum(int(r["CURRENT-OFFSET"]) for r in rows) == 6
    _assert_no_lag(rows, tansu)

    # The next run starts at the committed offsets: --from-beginning no longer applies.
    second = [f"second-{n}" for n in range(4)]
    _produce_values(broker.bootstrap, topic_name, second)
    status, lines, err = _consume_group(
        capsys, broker.bootstrap, topic_name, group, "--from-beginning", "--max-messages", "4"
    )
    assert status == 0, err
    assert sorted(lines) == sorted(second)
    status, out, _ = _run(capsys, "groups", "describe", *bs, group)
    rows = _table(out, "GROUP")
    assert sum(int(r["CURRENT-OFFSET"]) for r in rows) == 10
    _assert_no_lag(rows, tansu)

    # A second group that read only part of the topic committed what it printed.
    other = f"h-{topic_name}"
    status, lines, _ = _consume_group(
        capsys, broker.bootstrap, topic_name, other, "--from-beginning", "--max-messages", "3"
    )
    assert status == 0 and len(lines) == 3

    status, out, err = _run(capsys, "groups", "describe", *bs, "--all-groups")
    assert status == 0, err
    by_group: dict[str, list[dict[str, str]]] = {}
    for row in _table(out, "GROUP"):
        by_group.setdefault(row["GROUP"], []).append(row)
    assert {group, other} <= set(by_group)
    assert sum(int(r["CURRENT-OFFSET"]) for r in by_group[other]) == 3
    if not tansu:
        assert sum(int(r["LAG"]) for r in by_group[other]) == 7

    status, out, err = _run(capsys, "groups", "describe", *bs, "--all-groups", "--state")
    assert status == 0, err
    assert out.splitlines()[0].split() == [
        "GROUP",
        "COORDINATOR",
        "(ID)",
        "ASSIGNMENT-STRATEGY",
        "STATE",
        "#MEMBERS",
    ]
    states = {r["GROUP"]: r for r in _table(out, "GROUP")}
    for name in (group, other):
        assert states[name]["#MEMBERS"] == "0"
        if not tansu:
            assert states[name]["COORDINATOR"] == broker.bootstrap
            assert (states[name]["(ID)"], states[name]["STATE"]) == ("(1)", "Empty")

    status, out, err = _run(capsys, "groups", "list", *bs)
    assert status == 0, err
    listed = {r["GROUP"]: r["STATE"] for r in _table(out, "GROUP")}
    expected = "Unknown" if tansu else "Empty"
    assert listed[group] == listed[other] == expected


def test_groups_describe_members_and_state_of_a_live_member(
    broker, topic_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from tidelog.client import Consumer

    tansu = broker.kind == "tansu"
    bs = ("--bootstrap-server", broker.bootstrap)
    _fill(broker.bootstrap, topic_name, 2, 10)
    group = f"live-{topic_name}"
    config = {
        "bootstrap.servers": broker.bootstrap,
        "group.id": group,
        "client.id": "live-client",
        "session.timeout.ms": 6000,
    }
    with Consumer(config) as consumer:
        consumer.subscribe([topic_name])
        deadline = time.monotonic() + 60
        while len(consumer.assignment()) < 2:
            assert time.monotonic() < deadline, "no assignment within 60 s"
            consumer.poll(0.2)

        status, out, err = _run(capsys, "groups", "describe", *bs, group, "--members")
        assert status == 0, err
        (member,) = _table(out, "GROUP")
        assert list(member) == ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS"]
        assert member["GROUP"] == group
        if not tansu:
            assert member["CLIENT-ID"] == "live-client" and member["#PARTITIONS"] == "2"

        status, out, err = _run(capsys, "groups", "describe", *bs, group, "--members", "--verbose")
        assert status == 0, err
        (member,) = _table(out, "GROUP")
        assert list(member)[-1] == "ASSIGNMENT" and "GROUP-INSTANCE-ID" in member
        if not tansu:
            assert member["ASSIGNMENT"] == f"{topic_name}(0,1)"

        status, out, err = _run(capsys, "groups", "describe", *bs, group, "--state")
        assert status == 0, err
        row = out.splitlines()[1].split()
        assert row[0] == group and row[-1] == "1"
        if not tansu:
            assert row[-3:-1] == ["range", "Stable"]

        status, out, _ = _run(capsys, "groups", "list", *bs)
        listed = {r["GROUP"]: r["STATE"] for r in _table(out, "GROUP")}
        if not tansu:  # Tansu's ListGroups left out this group, which has committed nothing
            assert listed[group] == "Stable"


# -- pipes closed early -------------------------------------------------------------------------


TIDELOG = Path(sys.executable).parent / "tidelog"


def _piped(command: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``tidelog <args> | <command>`` through bash; the status is tidelog's (pipefail) unless
    the reader failed."""
    quoted = " ".join(f'"${{{n}}}"' for n in range(1, len(args) + 1))
    return subprocess.run(
        ["bash", "-c", f'set -o pipefail; "$0" {quoted} | {command}', str(TIDELOG), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_reader_closing_the_pipe_ends_consume_quietly_and_the_group_commits(
    broker, topic_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # About 500 kB of output: far more than a pipe holds, so writing fails once head is gone.
    _fill(broker.bootstrap, topic_name, 1, 0)
    _produce_values(broker.bootstrap, topic_name, [f"{n:05d}-" + "x" * 90 for n in range(5000)])
    group = f"pipe-{topic_name}"
    done = _piped(
        "head -1",
        "consume",
        "--bootstrap-server",
        broker.bootstrap,
        "--topic",
        topic_name,
        "--group",
        group,
        *GROUP_SESSION,
        "--from-beginning",
        "--timeout-ms",
        "30000",
    )
    assert done.stderr == ""
    assert done.returncode == 0
    assert done.stdout == "00000-" + "x" * 90 + "\n"
    # Closing after the broken pipe still committed what had been handed out.
    status, out, err = _run(
        capsys, "groups", "describe", "--bootstrap-server", broker.bootstrap, group
    )
    assert status == 0, err
    (row,) = _table(out, "GROUP")
    assert int(row["CURRENT-OFFSET"]) >= 1

    # Commands that print once and end go through the same path.
    done = _piped("head -1", "topics", "describe", "--bootstrap-server", broker.bootstrap)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("Topic: ")


# -- dump-log of a broker's partition directory -------------------------------------------------


def test_dump_log_of_a_partition_directory_prints_every_segment_in_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from client_broker import Broker

    from tidelog.client import Admin, NewTopic, Producer

    server = Broker(tmp_path, "tidelog")
    try:
        topic = "segmented"
        with Admin({"bootstrap.servers": server.bootstrap}) as admin:
            admin.create_topics([NewTopic(topic, 1, 1, {"segment.bytes": "4096"})])
        with Producer({"bootstrap.servers": server.bootstrap, "linger.ms": 0}) as producer:
            for n in range(600):
                producer.send(topic, b"value-%04d" % n + b"." * 40).result(30)
    finally:
        server.stop()
    directory = tmp_path / "data" / f"{topic}-0"
    segments = sorted(directory.glob("*.log"), key=lambda p: int(p.stem))
    assert len(segments) >= 3

    assert main(["dump-log", str(directory)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if line.startswith("Dumping ")] == [
        f"Dumping {p}" for p in segments
    ]
    # Batches follow one another from offset 0 to 599, each in the file its offset belongs to.
    following = 0
    current_base = -1
    for line in out:
        if line.startswith("Log starting offset: "):
            current_base = int(line.split()[-1])
            assert current_base == following
        elif line.startswith("baseOffset: "):
            cells = line.split()
            assert int(cells[1]) == following and int(cells[1]) >= current_base
            following = int(cells[3]) + 1
    assert following == 600

    done = _piped("head -1", "dump-log", "--print-data-log", str(directory))
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"Dumping {segments[0]}\n"
