"""`tidelog reassign-partitions --generate|--execute|--verify|--cancel`: Kafka's
kafka-reassign-partitions, on the client (AlterPartitionReassignments and
ListPartitionReassignments, KIP-455).

A plan is Kafka's JSON, ``{"version":1,"partitions":[{"topic","partition","replicas",
"log_dirs"}]}``; ``log_dirs`` is optional and may only say ``"any"`` (moving a replica
between the directories of one broker, AlterReplicaLogDirs, is not served). ``--generate``
proposes a plan for the topics of ``--topics-to-move-json-file``
(``{"version":1,"topics":[{"topic":"t"}]}``) over ``--broker-list``, keeping each topic's
replication factor and placing replicas as the controller places a new topic's (leaders
striped, rack-aware), which it does not submit. ``--execute`` prints the current
assignment of the plan's partitions (the rollback plan) and submits the plan; it refuses
while any reassignment is under way unless ``--additional``. ``--verify`` says per
partition whether the move is complete, still in progress, or failed (no reassignment is
running and the replicas are not the plan's), and exits 1 if any failed. ``--cancel``
cancels the plan's partitions that are still being reassigned (they return to their
original replicas). Throttles (``--throttle``) are not implemented: no data is copied by
the reassignment itself yet.

A file that is not such JSON, a partition listed twice, a replica listed twice, a topic or
partition that does not exist, or a broker that is not registered is refused with one line
before anything is submitted.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

from tidelog.cli.output import UsageError, add_bootstrap, guarded, read_json_file
from tidelog.client import Admin, TopicInfo, TopicPartition

COMMAND = "reassign-partitions"
ANY_LOG_DIR = "any"
Assignment = dict[TopicPartition, list[int]]


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        COMMAND,
        help="move partition replicas between brokers",
        description=(
            "Generate, execute, verify or cancel a partition reassignment: a JSON plan of "
            "the replicas each partition should have, the first being its preferred leader."
        ),
    )
    add_bootstrap(parser)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--generate", action="store_true", help="propose a plan; submits nothing")
    mode.add_argument("--execute", action="store_true", help="start the plan's reassignment")
    mode.add_argument("--verify", action="store_true", help="is the plan's reassignment done?")
    mode.add_argument("--cancel", action="store_true", help="cancel the plan's reassignment")
    parser.add_argument(
        "--reassignment-json-file",
        metavar="FILE",
        help="the plan, for --execute, --verify and --cancel",
    )
    parser.add_argument(
        "--topics-to-move-json-file",
        metavar="FILE",
        help='with --generate: {"version":1,"topics":[{"topic":"name"},...]}',
    )
    parser.add_argument(
        "--broker-list",
        metavar="ID,ID,...",
        help="with --generate: the brokers to place the replicas on",
    )
    parser.add_argument(
        "--disable-rack-aware",
        action="store_true",
        help="with --generate: ignore the brokers' racks",
    )
    parser.add_argument(
        "--additional",
        action="store_true",
        help="with --execute: start even though other reassignments are under way",
    )
    parser.set_defaults(run=guarded(COMMAND, _run))


# ---------------------------------------------------------------------------- JSON


def _is_int(value: object) -> TypeGuard[int]:
    # JSON's true and false are ints to Python; a broker id or partition is not one.
    return isinstance(value, int) and not isinstance(value, bool)


def parse_reassignment(data: Any) -> Assignment:
    """A reassignment plan's partitions and target replicas, in the file's order."""
    if not isinstance(data, dict) or not isinstance(data.get("partitions"), list):
        raise UsageError('the plan must be an object with a "partitions" list')
    if data.get("version", 1) != 1:
        raise UsageError(f"unsupported plan version {data.get('version')!r}: expected 1")
    if not data["partitions"]:
        raise UsageError("the plan's partition list is empty")
    plan: Assignment = {}
    for entry in data["partitions"]:
        if not isinstance(entry, dict):
            raise UsageError(f"plan entry {entry!r}: expected an object")
        topic, partition, replicas = (
            entry.get("topic"),
            entry.get("partition"),
            entry.get("replicas"),
        )
        if not isinstance(topic, str) or not topic:
            raise UsageError(f"plan entry {json.dumps(entry)}: no topic name")
        if not _is_int(partition) or partition < 0:
            raise UsageError(f"plan entry {json.dumps(entry)}: no valid partition number")
        tp = TopicPartition(topic, partition)
        if not isinstance(replicas, list) or not replicas:
            raise UsageError(f"partition {tp}: replicas must be a non-empty list of broker ids")
        if not all(_is_int(r) and r >= 0 for r in replicas):
            raise UsageError(f"partition {tp}: replicas {replicas} are not all broker ids")
        if len(set(replicas)) != len(replicas):
            raise UsageError(f"partition {tp}: replicas {replicas} list a broker twice")
        _check_log_dirs(tp, entry.get("log_dirs"), len(replicas))
        if tp in plan:
            raise UsageError(f"partition {tp} is listed twice in the plan")
        plan[tp] = list(replicas)
    return plan


def _check_log_dirs(tp: TopicPartition, log_dirs: Any, replicas: int) -> None:
    if log_dirs is None:
        return
    if not isinstance(log_dirs, list) or len(log_dirs) != replicas:
        raise UsageError(f"partition {tp}: log_dirs must list one entry per replica")
    if any(d != ANY_LOG_DIR for d in log_dirs):
        raise UsageError(
            f"partition {tp}: log_dirs other than {ANY_LOG_DIR!r} are not supported "
            "(moving replicas between log directories is not implemented)"
        )


def parse_topics_to_move(data: Any) -> list[str]:
    if not isinstance(data, dict) or not isinstance(data.get("topics"), list):
        raise UsageError('the topics file must be an object with a "topics" list')
    if data.get("version", 1) != 1:
        raise UsageError(f"unsupported topics file version {data.get('version')!r}: expected 1")
    names: list[str] = []
    for entry in data["topics"]:
        name = entry.get("topic") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name:
            raise UsageError(f"topics file entry {entry!r}: no topic name")
        if name in names:
            raise UsageError(f"topic {name} is listed twice in the topics file")
        names.append(name)
    if not names:
        raise UsageError("the topics file lists no topic")
    return names


def parse_broker_list(text: str | None) -> list[int]:
    if not text:
        raise UsageError("--generate needs --broker-list")
    try:
        brokers = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise UsageError(f"--broker-list {text!r}: expected comma-separated broker ids") from None
    if not brokers:
        raise UsageError("--broker-list is empty")
    if len(set(brokers)) != len(brokers):
        raise UsageError(f"--broker-list {text!r} lists a broker twice")
    return brokers


def format_assignment(assignment: Mapping[TopicPartition, Sequence[int]]) -> str:
    """Kafka's plan JSON on one line, partitions sorted by topic and number."""
    return json.dumps(
        {
            "version": 1,
            "partitions": [
                {
                    "topic": tp.topic,
                    "partition": tp.partition,
                    "replicas": list(replicas),
                    "log_dirs": [ANY_LOG_DIR] * len(replicas),
                }
                for tp, replicas in sorted(assignment.items())
            ],
        },
        separators=(",", ":"),
    )


def propose(
    topics: Mapping[str, TopicInfo],
    brokers: Sequence[int],
    racks: Mapping[int, str | None],
    rng: random.Random,
) -> Assignment:
    """A new assignment of every partition of ``topics`` over ``brokers``, each topic
    keeping its replication factor; placed as the controller places a new topic."""
    # The controller's own placement, so a generated plan looks like a created topic.
    from tidelog.metadata.controller.placement import assign_replicas

    proposed: Assignment = {}
    for name, info in sorted(topics.items()):
        factor = len(info.partitions[0].replicas) if info.partitions else 0
        if factor > len(brokers):
            raise UsageError(
                f"topic {name} has replication factor {factor}, more than the "
                f"{len(brokers)} brokers of --broker-list"
            )
        placed = assign_replicas(brokers, racks, len(info.partitions), factor, rng=rng)
        for p, replicas in zip(info.partitions, placed, strict=True):
            proposed[TopicPartition(name, p.partition)] = replicas
    return proposed


# ---------------------------------------------------------------------------- modes


def _run(args: argparse.Namespace) -> int:
    if args.generate:
        if not args.topics_to_move_json_file:
            raise UsageError("--generate needs --topics-to-move-json-file")
        return _generate(args)
    if not args.reassignment_json_file:
        mode = "--execute" if args.execute else "--verify" if args.verify else "--cancel"
        raise UsageError(f"{mode} needs --reassignment-json-file")
    plan = parse_reassignment(
        read_json_file(args.reassignment_json_file, "--reassignment-json-file")
    )
    with Admin({"bootstrap.servers": args.bootstrap_server}) as admin:
        if args.execute:
            return _execute(admin, plan, additional=args.additional)
        if args.verify:
            return _verify(admin, plan)
        return _cancel(admin, plan)


def _current(admin: Admin, partitions: Sequence[TopicPartition]) -> Assignment:
    """The replicas now of ``partitions``; an unknown topic or partition is refused."""
    topics = admin.describe_topics(sorted({tp.topic for tp in partitions}))
    current: Assignment = {}
    for tp in partitions:
        parts = {p.partition: p for p in topics[tp.topic].partitions}
        if tp.partition not in parts:
            raise UsageError(f"partition {tp} does not exist")
        current[tp] = list(parts[tp.partition].replicas)
    return current


def _generate(args: argparse.Namespace) -> int:
    names = parse_topics_to_move(
        read_json_file(args.topics_to_move_json_file, "--topics-to-move-json-file")
    )
    brokers = parse_broker_list(args.broker_list)
    with Admin({"bootstrap.servers": args.bootstrap_server}) as admin:
        topics = admin.describe_topics(names)
        registered = {
            b.node_id: b.rack for b in admin.describe_cluster(include_fenced_brokers=True).brokers
        }
    _check_brokers(brokers, registered)
    racks = {} if args.disable_rack_aware else {b: registered[b] for b in brokers}
    current = {
        TopicPartition(name, p.partition): list(p.replicas)
        for name, info in topics.items()
        for p in info.partitions
    }
    proposed = propose(topics, brokers, racks, random.Random())
    print("Current partition replica assignment")
    print(format_assignment(current))
    print()
    print("Proposed partition reassignment configuration")
    print(format_assignment(proposed))
    return 0


def _check_brokers(brokers: Sequence[int], registered: Mapping[int, object]) -> None:
    unknown = sorted({b for b in brokers if b not in registered})
    if unknown:
        raise UsageError(
            "the proposed assignment names brokers that are not registered: "
            + ",".join(map(str, unknown))
        )


def _execute(admin: Admin, plan: Assignment, *, additional: bool) -> int:
    current = _current(admin, list(plan))
    registered = {b.node_id for b in admin.describe_cluster(include_fenced_brokers=True).brokers}
    _check_brokers([b for replicas in plan.values() for b in replicas], dict.fromkeys(registered))
    if not additional and admin.list_partition_reassignments():
        raise UsageError(
            "cannot execute: a partition reassignment is under way; give --additional to "
            "start this one as well"
        )
    print("Current partition replica assignment")
    print()
    print(format_assignment(current))
    print()
    print("Save this to use as the --reassignment-json-file option during rollback")
    admin.alter_partition_reassignments(plan)
    print(
        "Successfully started partition reassignment"
        f"{'s' if len(plan) != 1 else ''} for {','.join(str(tp) for tp in sorted(plan))}"
    )
    return 0


def verify_lines(
    plan: Mapping[TopicPartition, Sequence[int]],
    current: Mapping[TopicPartition, Sequence[int] | None],
    ongoing: Mapping[TopicPartition, object],
) -> tuple[list[str], bool]:
    """One line per partition of the plan, and whether every one is complete or still
    moving (none failed). ``current`` maps a partition that no longer exists to None."""
    lines = []
    ok = True
    for tp, target in sorted(plan.items()):
        replicas = current.get(tp)
        if tp in ongoing:
            lines.append(f"Reassignment of partition {tp} is still in progress.")
        elif replicas is None:
            ok = False
            lines.append(f"Reassignment of partition {tp} failed: the partition does not exist.")
        elif list(replicas) == list(target):
            lines.append(f"Reassignment of partition {tp} is completed.")
        else:
            ok = False
            lines.append(
                f"Reassignment of partition {tp} failed: there is no active reassignment of "
                f"it, but its replica set is {_ids(replicas)} rather than {_ids(target)}."
            )
    return lines, ok


def _ids(replicas: Sequence[int]) -> str:
    return "[" + ",".join(map(str, replicas)) + "]"


def _verify(admin: Admin, plan: Assignment) -> int:
    ongoing = admin.list_partition_reassignments(list(plan))
    wanted = sorted({tp.topic for tp in plan})
    known = set(admin.list_topics(include_internal=True))
    topics = admin.describe_topics([t for t in wanted if t in known])
    current: dict[TopicPartition, Sequence[int] | None] = {}
    for name, info in topics.items():
        for p in info.partitions:
            current[TopicPartition(name, p.partition)] = p.replicas
    lines, ok = verify_lines(plan, current, ongoing)
    print("Status of partition reassignment:")
    for line in lines:
        print(line)
    return 0 if ok else 1


def _cancel(admin: Admin, plan: Assignment) -> int:
    _current(admin, list(plan))
    ongoing = admin.list_partition_reassignments(list(plan))
    active = sorted(tp for tp in plan if tp in ongoing)
    if not active:
        print("None of the specified partition reassignments are active.")
        return 0
    admin.alter_partition_reassignments(dict.fromkeys(active))
    print(
        "Successfully cancelled partition reassignments for: " + ",".join(str(tp) for tp in active)
    )
    return 0
