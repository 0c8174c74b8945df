"""`tidelog metadata-quorum describe --status|--replication`: Kafka's kafka-metadata-quorum.

The quorum is asked with DescribeQuorum, which only its leader answers: every address given
(``--bootstrap-controller``, comma-separated controller listeners, or ``--bootstrap-server``)
is tried in turn until the leader answers (:meth:`tidelog.client.Admin.describe_quorum`).
The cluster id comes from DescribeCluster on the same addresses, as Kafka's tool does.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from tidelog.cli.output import UsageError, guarded, print_table
from tidelog.client import Admin, ClientError, QuorumInfo, QuorumReplica
from tidelog.protocol import ErrorCode

# Added to a failure through --bootstrap-server: brokers that do not pass DescribeQuorum on.
_CONTROLLER_HINT = "ask a controller listener with --bootstrap-controller HOST:PORT[,HOST:PORT]"
# Added when no broker asked serves DescribeQuorum at all.
_NO_QUORUM_HINT = (
    "a single node without controller.quorum.voters has no metadata quorum; on a quorum "
    "node, " + _CONTROLLER_HINT
)
# Added when every controller asked said it does not lead.
_LEADER_HINT = "only the quorum's leader answers: give every voter's controller address"


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "metadata-quorum",
        help="describe the metadata quorum (like kafka-metadata-quorum)",
        description="Describe the metadata quorum: its leader, epoch and each replica's lag.",
    )
    add_quorum_bootstrap(parser)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    describe = actions.add_parser("describe", help="the quorum's status or replication")
    shown = describe.add_mutually_exclusive_group(required=True)
    shown.add_argument("--status", action="store_true", help="leader, epoch, high watermark")
    shown.add_argument("--replication", action="store_true", help="each replica's log and lag")
    describe.set_defaults(run=guarded("metadata-quorum", _describe))


def add_quorum_bootstrap(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    """``--bootstrap-server`` / ``--bootstrap-controller``, one of them (Kafka's pair)."""
    where = parser.add_mutually_exclusive_group(required=required)
    where.add_argument(
        "--bootstrap-server", metavar="HOST:PORT", help="a broker that passes DescribeQuorum on"
    )
    where.add_argument(
        "--bootstrap-controller",
        metavar="HOST:PORT[,HOST:PORT]",
        help="controller listeners (the voters' addresses in controller.quorum.voters)",
    )


def describe_quorum(bootstrap: str, *, through_broker: bool) -> QuorumInfo:
    """The quorum as its leader describes it; a failure through a broker says what to try."""
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        try:
            quorum: QuorumInfo = admin.describe_quorum()
        except ClientError as exc:
            if through_broker and exc.code is ErrorCode.UNSUPPORTED_VERSION:
                raise ClientError(f"{exc}; {_NO_QUORUM_HINT}", code=exc.code) from None
            if through_broker:
                raise ClientError(f"{exc}; {_CONTROLLER_HINT}", code=exc.code) from None
            if exc.code is ErrorCode.NOT_LEADER_OR_FOLLOWER:
                raise ClientError(f"{exc}; {_LEADER_HINT}", code=exc.code) from None
            raise
    return quorum


def _describe(args: argparse.Namespace) -> int:
    through_broker = args.bootstrap_controller is None
    bootstrap = args.bootstrap_controller or args.bootstrap_server
    if not bootstrap:
        raise UsageError("give --bootstrap-server or --bootstrap-controller")
    quorum = describe_quorum(bootstrap, through_broker=through_broker)
    if args.replication:
        print_replication(quorum)
        return 0
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        cluster_id = admin.describe_cluster().cluster_id
    print_status(cluster_id, quorum)
    return 0


def leader_state(quorum: QuorumInfo) -> QuorumReplica | None:
    return next((r for r in quorum.voters if r.replica_id == quorum.leader_id), None)


def status_lines(cluster_id: str | None, quorum: QuorumInfo) -> list[tuple[str, object]]:
    """kafka-metadata-quorum's --status fields. The lag of a follower is how far its log end
    is behind the leader's; the lag time, how long before the leader it was last caught up
    (Kafka's definitions)."""
    leader = leader_state(quorum)
    followers = [r for r in quorum.voters if r.replica_id != quorum.leader_id]
    max_lag, lag_time = 0, 0
    if leader is not None and followers:
        furthest = min(followers, key=lambda r: r.log_end_offset)
        max_lag = max(0, leader.log_end_offset - furthest.log_end_offset)
        if max_lag == 0:
            lag_time = 0  # every follower holds the leader's whole log
        elif furthest.last_caught_up_timestamp < 0 or leader.last_caught_up_timestamp < 0:
            lag_time = -1
        else:
            lag_time = max(0, leader.last_caught_up_timestamp - furthest.last_caught_up_timestamp)
    return [
        ("ClusterId", cluster_id or ""),
        ("LeaderId", quorum.leader_id),
        ("LeaderEpoch", quorum.leader_epoch),
        ("HighWatermark", quorum.high_watermark),
        ("MaxFollowerLag", max_lag),
        ("MaxFollowerLagTimeMs", lag_time),
        ("CurrentVoters", _ids(quorum.voters)),
        ("CurrentObservers", _ids(quorum.observers)),
    ]


def print_status(cluster_id: str | None, quorum: QuorumInfo) -> None:
    lines = status_lines(cluster_id, quorum)
    width = max(len(name) for name, _ in lines) + 2
    for name, value in lines:
        print(f"{name + ':':<{width}}{value}")


def replication_rows(quorum: QuorumInfo) -> list[tuple[object, ...]]:
    """One row per replica: the leader first, then followers, then observers (Kafka's order)."""
    leader = leader_state(quorum)
    leader_end = leader.log_end_offset if leader is not None else quorum.high_watermark
    ordered = [
        *(("Leader", r) for r in quorum.voters if r.replica_id == quorum.leader_id),
        *(("Follower", r) for r in quorum.voters if r.replica_id != quorum.leader_id),
        *(("Observer", r) for r in quorum.observers),
    ]
    return [
        (
            r.replica_id,
            r.log_end_offset,
            max(0, leader_end - r.log_end_offset) if r.log_end_offset >= 0 else -1,
            r.last_fetch_timestamp,
            r.last_caught_up_timestamp,
            status,
        )
        for status, r in ordered
    ]


REPLICATION_HEADERS = (
    "NodeId",
    "LogEndOffset",
    "Lag",
    "LastFetchTimestamp",
    "LastCaughtUpTimestamp",
    "Status",
)


def print_replication(quorum: QuorumInfo, out: Any = None) -> None:
    print_table(REPLICATION_HEADERS, replication_rows(quorum), out or sys.stdout)


def _ids(replicas: Sequence[QuorumReplica]) -> str:
    return "[" + ",".join(str(r.replica_id) for r in replicas) + "]"
