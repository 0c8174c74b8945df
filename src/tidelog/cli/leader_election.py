"""`tidelog leader-election`: Kafka's kafka-leader-election, on the client (ElectLeaders).

The partitions are one (``--topic`` and ``--partition``), every partition
(``--all-topic-partitions``: the request names none, and the controller then leaves out
the partitions whose leader is already the right one), or a JSON file
``{"partitions":[{"topic":"t","partition":0},...]}``. As Kafka's tool does, it prints one
line for the partitions elected, one for those that already had a valid leader, and one
per partition that failed; any failure makes the exit status 1.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from tidelog.cli.output import UsageError, add_bootstrap, fail, guarded, read_json_file
from tidelog.client import Admin, ClientError, TopicPartition
from tidelog.protocol import ErrorCode

COMMAND = "leader-election"
ELECTION_TYPES = ("preferred", "unclean")


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        COMMAND,
        help="elect partition leaders (preferred or unclean)",
        description=(
            "Elect the preferred replica of partitions as their leader, or (unclean) any "
            "live replica of partitions that have no leader."
        ),
    )
    add_bootstrap(parser)
    parser.add_argument(
        "--election-type",
        required=True,
        type=str.lower,
        choices=ELECTION_TYPES,
        help="preferred: make the first replica the leader; unclean: elect a replica out "
        "of sync if no in-sync one is alive (may lose data)",
    )
    parser.add_argument("--topic", help="with --partition: the one partition to elect")
    parser.add_argument("--partition", type=int, help="with --topic")
    parser.add_argument(
        "--all-topic-partitions", action="store_true", help="every partition of every topic"
    )
    parser.add_argument(
        "--path-to-json-file",
        metavar="FILE",
        help='{"partitions":[{"topic":"t","partition":0},...]}',
    )
    parser.set_defaults(run=guarded(COMMAND, _run))


def parse_partitions_json(data: Any) -> list[TopicPartition]:
    if not isinstance(data, dict) or not isinstance(data.get("partitions"), list):
        raise UsageError('the file must be an object with a "partitions" list')
    partitions: list[TopicPartition] = []
    for entry in data["partitions"]:
        topic = entry.get("topic") if isinstance(entry, dict) else None
        partition = entry.get("partition") if isinstance(entry, dict) else None
        if (
            not isinstance(topic, str)
            or not topic
            or not isinstance(partition, int)
            or isinstance(partition, bool)
            or partition < 0
        ):
            raise UsageError(f"entry {json.dumps(entry)}: expected a topic and a partition")
        tp = TopicPartition(topic, partition)
        if tp in partitions:
            raise UsageError(f"partition {tp} is listed twice")
        partitions.append(tp)
    if not partitions:
        raise UsageError("the file lists no partition")
    return partitions


def wanted_partitions(args: argparse.Namespace) -> list[TopicPartition] | None:
    """The partitions the options name; None for every partition."""
    chosen = [
        given
        for given in (
            args.topic is not None or args.partition is not None,
            args.all_topic_partitions,
            args.path_to_json_file is not None,
        )
        if given
    ]
    if len(chosen) != 1:
        raise UsageError(
            "give exactly one of --topic with --partition, --all-topic-partitions, "
            "--path-to-json-file"
        )
    if args.all_topic_partitions:
        return None
    if args.path_to_json_file is not None:
        data = read_json_file(args.path_to_json_file, "--path-to-json-file")
        return parse_partitions_json(data)
    if args.topic is None or args.partition is None:
        raise UsageError("--topic and --partition go together")
    if args.partition < 0:
        raise UsageError(f"--partition {args.partition}: must be 0 or more")
    return [TopicPartition(args.topic, args.partition)]


def outcome_lines(
    election_type: str, outcomes: Mapping[TopicPartition, ClientError | None]
) -> tuple[list[str], list[str]]:
    """Kafka's lines for the elected and the already-elected partitions (stdout), and one
    per failed partition (stderr)."""
    kind = election_type.upper()
    elected = sorted(tp for tp, err in outcomes.items() if err is None)
    noop = sorted(
        tp
        for tp, err in outcomes.items()
        if err is not None and err.code is ErrorCode.ELECTION_NOT_NEEDED
    )
    failed = sorted(
        (tp, err)
        for tp, err in outcomes.items()
        if err is not None and err.code is not ErrorCode.ELECTION_NOT_NEEDED
    )
    lines = []
    if elected:
        lines.append(
            f"Successfully completed leader election ({kind}) for partitions "
            + ", ".join(map(str, elected))
        )
    if noop:
        lines.append("Valid replica already elected for partitions " + ", ".join(map(str, noop)))
    errors = [
        f"Error completing leader election ({kind}) for partition: {tp}: {err}"
        for tp, err in failed
    ]
    return lines, errors


def _run(args: argparse.Namespace) -> int:
    partitions = wanted_partitions(args)
    with Admin({"bootstrap.servers": args.bootstrap_server}) as admin:
        outcomes = admin.elect_leaders(args.election_type, partitions)
    lines, errors = outcome_lines(args.election_type, outcomes)
    if not outcomes:
        lines.append("No partition needed a leader election.")
    for line in lines:
        print(line)
    if errors:
        for line in errors:
            print(line)
        return fail(COMMAND, f"{len(errors)} replica(s) could not be elected")
    return 0
