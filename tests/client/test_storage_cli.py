"""`tidelog storage random-uuid` and `tidelog storage format`, as real processes.

A node formatted with a cluster id starts with it, as a real client (confluent-kafka) sees
in Metadata and DescribeCluster; formatting twice, a bad id, or dirs a running broker
holds are refused in one line and leave the dirs as they were.
"""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "interop"))

from interop_broker import BrokerProcess, venv_bin

pytestmark = pytest.mark.slow

TIMEOUT_S = 60.0


def _tidelog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv_bin() / "tidelog"), *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )


def _new_cluster_id() -> str:
    done = _tidelog("storage", "random-uuid")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _properties(tmp_path: Path, data: Path) -> Path:
    path = tmp_path / "server.properties"
    path.write_text(f"node.id=1\nlog.dirs={data}\n")
    return path


def _one_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def test_random_uuid_prints_a_new_id_in_kafkas_form() -> None:
    ids = set()
    for _ in range(3):
        done = _tidelog("storage", "random-uuid")
        assert done.returncode == 0 and done.stderr == ""
        assert done.stdout.endswith("\n") and done.stdout.count("\n") == 1
        cluster_id = done.stdout.strip()
        assert len(cluster_id) == 22 and not cluster_id.startswith("-")
        raw = base64.urlsafe_b64decode(cluster_id + "==")
        assert len(raw) == 16
        assert base64.urlsafe_b64encode(raw).decode().rstrip("=") == cluster_id
        ids.add(cluster_id)
    assert len(ids) == 3


def test_a_formatted_node_serves_its_cluster_id(tmp_path: Path) -> None:
    from confluent_kafka.admin import AdminClient

    cluster_id = _new_cluster_id()
    data = tmp_path / "data"
    config = _properties(tmp_path, data)
    done = _tidelog("storage", "format", "--cluster-id", cluster_id, "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert f"Formatted directory {data} with cluster id {cluster_id}" in done.stdout
    meta = (data / "meta.properties").read_text()
    assert f"cluster.id={cluster_id}\n" in meta and "node.id=1\n" in meta
    assert "version=1\n" in meta and "directory.id=" in meta

    broker = BrokerProcess(tmp_path, "tidelog", data_dir=data)
    broker.start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 0})
        assert admin.list_topics(timeout=10).cluster_id == cluster_id
        assert admin.describe_cluster().result(timeout=10).cluster_id == cluster_id
    finally:
        broker.stop()
    assert f"cluster.id={cluster_id}\n" in (data / "meta.properties").read_text()

    # A configured cluster.id other than the formatted one: the node does not start.
    other = _new_cluster_id()
    refused = BrokerProcess(
        tmp_path, "tidelog", data_dir=data, extra_args=["--override", f"cluster.id={other}"]
    ).run_to_exit()
    assert refused.returncode == 1
    line = _one_line(refused.stderr)
    assert line.startswith("tidelog serve: cannot start: ")
    assert cluster_id in line and other in line


def test_format_twice_is_refused_unless_ignore_formatted(tmp_path: Path) -> None:
    cluster_id = _new_cluster_id()
    data = tmp_path / "data"
    config = str(_properties(tmp_path, data))
    assert _tidelog("storage", "format", "-t", cluster_id, "-c", config).returncode == 0
    before = (data / "meta.properties").read_bytes()

    again = _tidelog("storage", "format", "-t", _new_cluster_id(), "-c", config)
    assert again.returncode == 1 and again.stdout == ""
    line = _one_line(again.stderr)
    assert line.startswith("tidelog storage format: cannot format: ")
    assert "already formatted" in line and "--ignore-formatted" in line
    assert (data / "meta.properties").read_bytes() == before

    for flag in ("--ignore-formatted", "-g"):
        ignored = _tidelog("storage", "format", flag, "-t", cluster_id, "-c", config)
        assert ignored.returncode == 0, ignored.stderr
        assert "All of the log directories are already formatted." in ignored.stdout
        assert (data / "meta.properties").read_bytes() == before

    # --override adds a dir the way `tidelog serve` takes it; only that one is written.
    extra = tmp_path / "extra"
    grown = _tidelog(
        "storage", "format", "-g", "-t", cluster_id, "-c", config,
        "--override", f"log.dirs={data},{extra}",
    )  # fmt: skip
    assert grown.returncode == 0, grown.stderr
    assert f"Formatted directory {extra}" in grown.stdout
    assert f"cluster.id={cluster_id}\n" in (extra / "meta.properties").read_text()
    assert (data / "meta.properties").read_bytes() == before


@pytest.mark.parametrize("bad", ["not-a-cluster-id", "AAAAAAAAAAAAAAAAAAAAAAAA", "x" * 22])
def test_a_bad_cluster_id_is_refused_in_one_line(tmp_path: Path, bad: str) -> None:
    data = tmp_path / "data"
    config = str(_properties(tmp_path, data))
    done = _tidelog("storage", "format", "--cluster-id", bad, "--config", config)
    assert done.returncode == 1 and done.stdout == ""
    line = _one_line(done.stderr)
    assert line.startswith("tidelog storage format: cannot format: ")
    assert bad in line and "random-uuid" in line
    assert not (data / "meta.properties").exists()


def test_format_refuses_dirs_a_running_broker_holds(tmp_path: Path) -> None:
    data = tmp_path / "data"
    broker = BrokerProcess(tmp_path, "tidelog", data_dir=data)
    broker.start()  # no format: the first start formats the dir itself
    try:
        before = (data / "meta.properties").read_bytes()
        config = str(_properties(tmp_path, data))
        for flag in ([], ["--ignore-formatted"]):
            done = _tidelog("storage", "format", *flag, "-t", _new_cluster_id(), "-c", config)
            assert done.returncode == 1 and done.stdout == ""
            line = _one_line(done.stderr)
            assert "is in use by another process" in line and str(data / ".lock") in line
            assert "--data-dir" not in line  # not an option of this command
        assert (data / "meta.properties").read_bytes() == before
        assert broker.running()
    finally:
        broker.stop()
