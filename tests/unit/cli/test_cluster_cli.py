"""`tidelog cluster` and `tidelog metadata-quorum`: the example files, Kafka's status and
replication fields computed from a DescribeQuorum answer, and one-line failures."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tidelog.cli.cluster import node_properties
from tidelog.cli.main import main
from tidelog.cli.metadata_quorum import replication_rows, status_lines
from tidelog.client import QuorumInfo, QuorumReplica

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "cluster"

QUORUM = QuorumInfo(
    leader_id=2,
    leader_epoch=7,
    high_watermark=118,
    voters=(
        QuorumReplica(1, 110, 1_700_000_000_900, 1_700_000_000_400),
        QuorumReplica(2, 120, 1_700_000_001_000, 1_700_000_001_000),
        QuorumReplica(3, 120, 1_700_000_000_950, 1_700_000_000_950),
    ),
    observers=(QuorumReplica(4, 100, 1_700_000_000_500, -1),),
)


@pytest.mark.parametrize("node", [1, 2, 3])
def test_the_example_files_are_what_cluster_up_writes(node: int) -> None:
    example = (EXAMPLES / f"server-{node}.properties").read_text()
    assert example == node_properties(node, 3, 19092, f"/tmp/tidelog-cluster/node-{node}/data")


def test_example_ports_do_not_clash() -> None:
    ports = []
    for node in (1, 2, 3):
        for line in (EXAMPLES / f"server-{node}.properties").read_text().splitlines():
            if line.startswith("listeners="):
                ports += [int(item.rsplit(":", 1)[1]) for item in line.split("=", 1)[1].split(",")]
    assert sorted(ports) == [19092, 19093, 19094, 19192, 19193, 19194]


def test_status_fields_follow_kafka_metadata_quorum() -> None:
    fields = dict(status_lines("abc", QUORUM))
    assert list(fields) == [
        "ClusterId",
        "LeaderId",
        "LeaderEpoch",
        "HighWatermark",
        "MaxFollowerLag",
        "MaxFollowerLagTimeMs",
        "CurrentVoters",
        "CurrentObservers",
    ]
    assert fields["LeaderId"] == 2 and fields["LeaderEpoch"] == 7
    assert fields["HighWatermark"] == 118
    # Voter 1 is furthest behind: 10 offsets, last caught up 600 ms before the leader.
    assert fields["MaxFollowerLag"] == 10
    assert fields["MaxFollowerLagTimeMs"] == 600
    assert fields["CurrentVoters"] == "[1,2,3]"
    assert fields["CurrentObservers"] == "[4]"


def test_replication_rows_put_the_leader_first_and_mark_observers() -> None:
    rows = replication_rows(QUORUM)
    assert [(r[0], r[1], r[2], r[5]) for r in rows] == [
        (2, 120, 0, "Leader"),
        (1, 110, 10, "Follower"),
        (3, 120, 0, "Follower"),
        (4, 100, 20, "Observer"),
    ]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize(
    "argv",
    [
        ["metadata-quorum", "--bootstrap-controller", "{addr}", "describe", "--status"],
        ["metadata-quorum", "--bootstrap-server", "{addr}", "describe", "--replication"],
        ["cluster", "describe", "--bootstrap-server", "{addr}"],
    ],
)
def test_an_unreachable_address_is_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"127.0.0.1:{_closed_port()}"
    assert main([a.format(addr=address) for a in argv]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tidelog ")
    assert address in err


def test_metadata_quorum_needs_an_address(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["metadata-quorum", "describe", "--status"])
    assert exit_info.value.code == 2
    assert "--bootstrap-server" in capsys.readouterr().err


def test_cluster_up_refuses_a_bad_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cluster", "up", "--nodes", "0", "--base-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == "tidelog cluster up: --nodes 0: give 1 to 9 nodes"
