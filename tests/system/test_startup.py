"""Start-up of a real `tidelog serve`: one process owns a data directory, and a start that
cannot happen says why in one line.

- A second broker on the data directory of a running one exits with status 1 and one line
  naming the directory, and touches nothing there; every record the first one acknowledged
  (confluent-kafka, acks=all) is read back after both stopped and the first started again.
- Each start-up failure (the data directory is a file, lies under a file, may not be written,
  is on a read-only or a full file system; the port is in use; a config value is bad) exits
  non-zero with exactly one line on stderr, naming the path or key and the fix, and no
  traceback. A broker that could not listen closes what it had opened (the clean-shutdown
  marker is written) without claiming to have "stopped cleanly".

The suite runs as root, where permission bits stop nobody: the permission case runs the broker
with CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH dropped from its capability bounding set
(setpriv), so root obeys the bits as any user does. The read-only and full file systems are
mounted in a mount namespace of the broker's own (unshare), gone when it exits: a read-only
bind of the data directory, and a 64 KiB tmpfs filled up before the broker starts.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from interop_broker import BrokerProcess
from system_wire import WireClient

from tidelog.storage.manager import CLEAN_SHUTDOWN_MARKER, LOG_DIR_LOCK

Brokers = Callable[..., BrokerProcess]

TOPIC = "owned"
RECORDS = 300

# Drop root's power to ignore permission bits (a root without these is held to the mode bits
# like any user); setpriv is util-linux's.
WITHOUT_DAC_OVERRIDE = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]
# `sh -c SCRIPT DIR BROKER-COMMAND...`: mount over DIR in a private mount namespace, then run
# the broker there.
READ_ONLY_BIND = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
# The same, for a copy of a stopped broker's data directory ("$1"): the broker starts (its
# few appends fit in pages it already has) and its logs fail to close.
FULL_TMPFS_OVER_COPY = (
    'mount -t tmpfs -o size=1m tmpfs "$0" && cp -a "$1/." "$0/" && '
    '{ head -c 4194304 /dev/zero > "$0/filler" 2>/dev/null; true; } && shift && exec "$@"'
)
FULL_TMPFS = (
    'mount -t tmpfs -o size=64k tmpfs "$0" && '
    '{ head -c 1048576 /dev/zero > "$0/filler" 2>/dev/null; true; } && exec "$@"'
)


def mounted_over(tmp_path: Path, name: str, script: str) -> tuple[Path, dict[str, Any]]:
    """A new data directory `name`, and the broker options that run `script` over it first."""
    path = tmp_path / name
    path.mkdir()
    return path, {
        "data_dir": path,
        "prefix": ["unshare", "--mount", "--", "sh", "-c", script, str(path)],
    }


def the_one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The only non-empty line of stderr, from `tidelog serve`, without a traceback."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"stderr has {len(lines)} lines:\n{result.stderr}"
    assert lines[0].startswith("tidelog serve: "), lines[0]
    assert result.stdout == ""
    return lines[0]


def files_under(directory: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(directory)): path.read_bytes()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def produce_acknowledged(broker: BrokerProcess) -> list[bytes]:
    """RECORDS values to TOPIC with acks=all; every delivery report must be a success."""
    with WireClient(broker.host, broker.port) as client:
        client.create_topic(TOPIC, 1)
    errors: list[KafkaError] = []

    def report(err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            errors.append(err)

    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 5, "log_level": 0}
    )
    values = [b"owned-%d" % i for i in range(RECORDS)]
    for value in values:
        producer.produce(TOPIC, value, partition=0, on_delivery=report)
    assert producer.flush(30) == 0, "records still unacknowledged after 30 s"
    assert errors == []
    return values


def stored_values(broker: BrokerProcess) -> list[bytes | None]:
    with WireClient(broker.host, broker.port) as client:
        records = client.fetch_records(TOPIC, 0)
    assert [r.offset for r in records] == list(range(len(records)))
    return [r.value for r in records]


def test_a_second_broker_on_a_running_brokers_data_is_refused(brokers: Brokers) -> None:
    # No periodic checkpoint rewrite during the test: the first broker's files must stay
    # byte for byte as they are unless the second broker touches them.
    first = brokers(extra_args=["--override", "log.flush.offset.checkpoint.interval.ms=3600000"])
    acknowledged = produce_acknowledged(first)
    before = files_under(first.data_dir)
    assert LOG_DIR_LOCK in before

    second = brokers(ready=False, data_dir=first.data_dir)
    result = second.run_to_exit()

    assert result.returncode == 1
    line = the_one_line(result)
    assert f"log.dirs: {first.data_dir} is in use by another process" in line
    assert str(first.data_dir / LOG_DIR_LOCK) in line
    assert files_under(first.data_dir) == before
    assert first.running()
    assert stored_values(first) == acknowledged

    assert first.stop() == 0
    first.start()
    assert stored_values(first) == acknowledged


def data_dir_is_a_file(tmp_path: Path) -> tuple[dict[str, Any], list[str]]:
    path = tmp_path / "some-file"
    path.write_text("not a directory\n")
    return {"data_dir": path}, [f"log.dirs: cannot use {path}: Not a directory", "--data-dir"]


def data_dir_under_a_file(tmp_path: Path) -> tuple[dict[str, Any], list[str]]:
    path = tmp_path / "some-file" / "data"
    path.parent.write_text("not a directory\n")
    return {"data_dir": path}, [f"log.dirs: cannot use {path}: Not a directory", "--data-dir"]


def data_dir_without_write_permission(tmp_path: Path) -> tuple[dict[str, Any], list[str]]:
    path = tmp_path / "not-writable"
    path.mkdir(mode=0o555)
    path.chmod(0o555)  # whatever the umask
    options = {"data_dir": path, "prefix": WITHOUT_DAC_OVERRIDE}
    return options, [f"log.dirs: cannot use {path / LOG_DIR_LOCK}: Permission denied", "--data-dir"]


def data_dir_on_a_read_only_file_system(tmp_path: Path) -> tuple[dict[str, Any], list[str]]:
    path, options = mounted_over(tmp_path, "read-only", READ_ONLY_BIND)
    return options, [
        f"log.dirs: cannot use {path / LOG_DIR_LOCK}: Read-only file system",
        "mount it writable",
        "--data-dir",
    ]


def data_dir_on_a_full_disk(tmp_path: Path) -> tuple[dict[str, Any], list[str]]:
    path, options = mounted_over(tmp_path, "full", FULL_TMPFS)
    return options, [
        f"log.dirs: No space left on device while writing to {path}",
        "free space on that disk",
        "--data-dir",
    ]


def bad_config_value(tmp_path: Path) -> tuple[dict[str, Any], list[str]]:
    options = {"extra_args": ["--override", "num.partitions=0"]}
    return options, ["invalid value '0' for configuration num.partitions: must be at least 1"]


@pytest.mark.parametrize(
    ("setup", "status"),
    [
        (data_dir_is_a_file, 1),
        (data_dir_under_a_file, 1),
        (data_dir_without_write_permission, 1),
        (data_dir_on_a_read_only_file_system, 1),
        (data_dir_on_a_full_disk, 1),
        # A usage error, like the other commands' bad arguments.
        (bad_config_value, 2),
    ],
    ids=lambda value: value.__name__.replace("_", "-") if callable(value) else None,
)
def test_a_start_up_failure_is_one_line(
    setup: Callable[[Path], tuple[dict[str, Any], list[str]]],
    status: int,
    brokers: Brokers,
    tmp_path: Path,
) -> None:
    options, fragments = setup(tmp_path)
    broker = brokers(ready=False, **options)
    result = broker.run_to_exit()
    assert result.returncode == status, result.stderr
    line = the_one_line(result)
    for fragment in fragments:
        assert fragment in line


def test_a_port_in_use_is_one_line_and_what_was_opened_is_closed(brokers: Brokers) -> None:
    broker = brokers(ready=False)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        broker.port = taken.getsockname()[1]
        result = broker.run_to_exit()

    assert result.returncode == 1
    line = the_one_line(result)
    assert f"listeners: PLAINTEXT://127.0.0.1:{broker.port} is in use by another process" in line
    assert "--port" in line
    assert "stopped cleanly" not in result.stderr
    # The metadata log and the log dirs were opened before the bind failed; they were
    # closed as at a clean stop, and the next start on the free port serves them.
    assert (broker.data_dir / CLEAN_SHUTDOWN_MARKER).exists()
    broker.start()


def test_a_disk_full_at_the_stop_is_one_line(brokers: Brokers) -> None:
    first = brokers()
    assert first.stop() == 0
    broker = brokers(ready=False, data_dir=first.workdir / "full")
    broker.data_dir.mkdir()
    script = ["sh", "-c", FULL_TMPFS_OVER_COPY, str(broker.data_dir), str(first.data_dir)]
    broker.prefix = ["unshare", "--mount", "--", *script]
    broker.start()

    assert broker.stop() == 1
    said = broker.log_tail(20).split("=== start #1")[-1]
    assert "Traceback" not in said
    last = said.strip().splitlines()[-1]
    assert last.startswith("tidelog serve: closing failed, the next start recovers: log.dirs: ")
    assert "No space left on device" in last
    assert "broker stopped cleanly" not in said


def test_a_quorum_nodes_client_port_in_use_is_named(tmp_path: Path) -> None:
    # A quorum node binds its controller listener first and its client listener once the
    # quorum lets its broker in: the line must name the listener that failed, by port.
    from interop_broker import free_port, venv_bin

    controller_port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        client_port = taken.getsockname()[1]
        config = tmp_path / "server.properties"
        config.write_text(
            "process.roles=broker,controller\n"
            "node.id=1\n"
            f"controller.quorum.voters=1@127.0.0.1:{controller_port}\n"
            f"listeners=PLAINTEXT://127.0.0.1:{client_port},"
            f"CONTROLLER://127.0.0.1:{controller_port}\n"
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{client_port}\n"
            "controller.listener.names=CONTROLLER\n"
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT\n"
            f"log.dirs={tmp_path / 'data'}\n"
        )
        result = subprocess.run(
            [str(venv_bin() / "tidelog"), "serve", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 1, result.stderr
    # The node logged its progress up to the bind (it ran a quorum of one); the failure is
    # one line, the last, with no traceback.
    assert "Traceback" not in result.stderr, result.stderr
    line = result.stderr.splitlines()[-1]
    assert line.startswith("tidelog serve: cannot start: "), result.stderr
    assert f"listeners: PLAINTEXT://127.0.0.1:{client_port} is in use by another process" in line
    assert str(controller_port) not in line
