"""`tidelog groups list|describe|reset-offsets|delete`: Kafka's kafka-consumer-groups, on the
client.

``describe GROUP`` (or ``--all-groups``) prints, per group, a header line and the members with
their assignments, then one row per partition the group owns or has committed for: committed
offset, log end offset, lag, and the member that owns it. As kafka-consumer-groups,
``--members`` shows only the members (``--verbose`` adds their assignments) and ``--state``
one line of coordinator, assignment strategy, state and member count. ``reset-offsets`` only prints the new offsets unless ``--execute`` is given, and, as
Kafka's tool, refuses while the group has active members (state other than Empty or Dead).
Cells with nothing to show hold ``-``.
"""

from __future__ import annotations

import argparse
from typing import Any

from tidelog.cli.output import UsageError, add_bootstrap, fail, guarded, print_table
from tidelog.client import Admin, ClientError, PartialFailureError, TopicPartition
from tidelog.client.groups import (
    GroupDescription,
    MemberDescription,
    ResetSpec,
    parse_datetime,
    plan_reset,
)
from tidelog.protocol import ErrorCode

COMMAND = "groups"
NONE = "-"


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "groups",
        help="list, describe, reset offsets of and delete consumer groups",
        description="List, describe, reset the offsets of, and delete consumer groups.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    listing = actions.add_parser("list", help="list groups with their state")
    add_bootstrap(listing)
    listing.add_argument(
        "--state", action="append", default=[], help="only groups in this state (repeatable)"
    )
    listing.set_defaults(run=guarded(COMMAND, _list))

    describe = actions.add_parser(
        "describe", help="members, assignments, committed offsets and lag"
    )
    add_bootstrap(describe)
    which = describe.add_mutually_exclusive_group(required=True)
    which.add_argument("group", metavar="GROUP", nargs="?")
    which.add_argument("--all-groups", action="store_true", help="describe every group")
    view = describe.add_mutually_exclusive_group()
    view.add_argument(
        "--offsets", action="store_true", help="members and per-partition lag (the default)"
    )
    view.add_argument("--members", action="store_true", help="only the members")
    view.add_argument(
        "--state",
        action="store_true",
        help="coordinator, assignment strategy, state and number of members",
    )
    describe.add_argument(
        "--verbose", action="store_true", help="with --members: each member's assignment"
    )
    describe.set_defaults(run=guarded(COMMAND, _describe))

    reset = actions.add_parser(
        "reset-offsets", help="move a stopped group's committed offsets (dry run by default)"
    )
    add_bootstrap(reset)
    reset.add_argument("group", metavar="GROUP")
    scope = reset.add_mutually_exclusive_group(required=True)
    scope.add_argument(
        "--topic",
        action="append",
        metavar="TOPIC[:P,...]",
        help="a topic, or some of its partitions (repeatable)",
    )
    scope.add_argument(
        "--all-topics", action="store_true", help="every topic the group has offsets for"
    )
    target = reset.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true")
    target.add_argument("--to-latest", action="store_true")
    target.add_argument("--to-datetime", metavar="ISO8601")
    target.add_argument("--to-offset", type=int, metavar="N")
    target.add_argument("--shift-by", type=int, metavar="N")
    mode = reset.add_mutually_exclusive_group()
    mode.add_argument("--execute", action="store_true", help="commit the new offsets")
    mode.add_argument("--dry-run", action="store_true", help="only show them (the default)")
    reset.set_defaults(run=guarded(COMMAND, _reset))

    delete = actions.add_parser("delete", help="delete groups that have no active member")
    add_bootstrap(delete)
    delete.add_argument("groups", nargs="+", metavar="GROUP")
    delete.set_defaults(run=guarded(COMMAND, _delete))


def _admin(args: argparse.Namespace) -> Admin:
    return Admin({"bootstrap.servers": args.bootstrap_server})


def _list(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        groups = admin.list_groups(args.state or None)
    print_table(
        ("GROUP", "STATE", "PROTOCOL-TYPE"),
        ((g.group_id, g.state or NONE, g.protocol_type or NONE) for g in groups),
    )
    return 0


def _describe_one(admin: Admin, group: str) -> GroupDescription | None:
    """The group, or None when it does not exist (state Dead, or GROUP_ID_NOT_FOUND)."""
    try:
        description = admin.describe_groups([group])[group]
    except PartialFailureError as exc:
        error = exc.errors.get(group)
        if error is not None and error.code is ErrorCode.GROUP_ID_NOT_FOUND:
            return None
        raise
    return None if description.state == "Dead" else description


def _assignment_text(member: MemberDescription) -> str:
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(member.assignment):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return ",".join(f"{t}({','.join(map(str, ps))})" for t, ps in by_topic.items()) or NONE


def _end_offsets(admin: Admin, partitions: set[TopicPartition]) -> dict[TopicPartition, int]:
    """Log end offsets, per topic so that one deleted topic does not hide the others."""
    out: dict[TopicPartition, int] = {}
    for topic in sorted({tp.topic for tp in partitions}):
        specs = {tp: "latest" for tp in partitions if tp.topic == topic}
        try:
            answers = admin.list_offsets(specs)
        except ClientError:
            continue
        out.update({tp: a.offset for tp, a in answers.items()})
    return out


def _describe(args: argparse.Namespace) -> int:
    if args.verbose and not args.members:
        raise UsageError("--verbose applies to --members only")
    with _admin(args) as admin:
        names = [g.group_id for g in admin.list_groups()] if args.all_groups else [args.group]
        first = True
        for name in names:
            group = _describe_one(admin, name)
            if group is None:
                if args.all_groups:
                    continue  # deleted since it was listed
                return fail(COMMAND, f"consumer group {name!r} does not exist")
            if not first:
                print()
            first = False
            if args.members:
                _print_members(group, verbose=args.verbose)
            elif args.state:
                _print_state(admin, group)
            else:
                _print_offsets(admin, group)
    return 0


def _print_members(group: GroupDescription, *, verbose: bool) -> None:
    if not group.members:
        print(f"Consumer group {group.group_id!r} has no active members.")
        return
    headers = ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS"]
    if verbose:
        headers[2:2] = ["GROUP-INSTANCE-ID"]
        headers.append("ASSIGNMENT")
    rows = []
    for m in sorted(group.members, key=lambda m: m.member_id):
        row: list[object] = [
            group.group_id,
            m.member_id,
            m.host or NONE,
            m.client_id or NONE,
            len(m.assignment),
        ]
        if verbose:
            row[2:2] = [m.group_instance_id or NONE]
            row.append(_assignment_text(m))
        rows.append(row)
    print_table(headers, rows)


def _print_state(admin: Admin, group: GroupDescription) -> None:
    coordinator = admin.find_coordinator(group.group_id)
    print_table(
        ("GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"),
        [
            (
                group.group_id,
                f"{coordinator.host}:{coordinator.port} ({coordinator.node_id})",
                group.protocol or NONE,
                group.state,
                len(group.members),
            )
        ],
    )


def _print_offsets(admin: Admin, group: GroupDescription) -> None:
    committed = admin.list_consumer_group_offsets(group.group_id)
    owned = {tp for m in group.members for tp in m.assignment}
    partitions = owned | set(committed)
    ends = _end_offsets(admin, partitions)
    print(
        f"Group: {group.group_id}  State: {group.state}  "
        f"ProtocolType: {group.protocol_type or NONE}  Protocol: {group.protocol or NONE}  "
        f"Coordinator: {group.coordinator}"
    )
    print()
    if group.members:
        print_table(
            ("CONSUMER-ID", "GROUP-INSTANCE-ID", "HOST", "CLIENT-ID", "#PARTITIONS", "ASSIGNMENT"),
            (
                (
                    m.member_id,
                    m.group_instance_id or NONE,
                    m.host,
                    m.client_id,
                    len(m.assignment),
                    _assignment_text(m),
                )
                for m in sorted(group.members, key=lambda m: m.member_id)
            ),
        )
    else:
        print(f"Consumer group {group.group_id!r} has no active members.")
    print()
    rows = []
    for tp in sorted(partitions):
        current = committed.get(tp)
        end = ends.get(tp)
        owner = group.owner(tp)
        lag = NONE if current is None or end is None else end - current.offset
        rows.append(
            (
                group.group_id,
                tp.topic,
                tp.partition,
                NONE if current is None else current.offset,
                NONE if end is None else end,
                lag,
                NONE if owner is None else owner.member_id,
                NONE if owner is None else owner.host,
                NONE if owner is None else owner.client_id,
            )
        )
    print_table(
        (
            "GROUP",
            "TOPIC",
            "PARTITION",
            "CURRENT-OFFSET",
            "LOG-END-OFFSET",
            "LAG",
            "CONSUMER-ID",
            "HOST",
            "CLIENT-ID",
        ),
        rows,
    )


def _reset_spec(args: argparse.Namespace) -> ResetSpec:
    if args.to_earliest:
        return ResetSpec("earliest")
    if args.to_latest:
        return ResetSpec("latest")
    if args.to_datetime is not None:
        try:
            return ResetSpec("datetime", parse_datetime(args.to_datetime))
        except ValueError as exc:
            raise UsageError(f"--to-datetime: {exc}") from None
    if args.to_offset is not None:
        if args.to_offset < 0:
            raise UsageError(f"--to-offset {args.to_offset}: offsets are not negative")
        return ResetSpec("offset", args.to_offset)
    return ResetSpec("shift", args.shift_by)


def _parse_topic(text: str) -> tuple[str, list[int] | None]:
    """``t`` -> (t, None: every partition); ``t:0,2`` -> (t, [0, 2])."""
    topic, sep, rest = text.partition(":")
    if not topic:
        raise UsageError(f"--topic {text!r}: expected TOPIC or TOPIC:P,P,...")
    if not sep:
        return topic, None
    try:
        parts = sorted({int(p) for p in rest.split(",") if p.strip()})
    except ValueError:
        raise UsageError(f"--topic {text!r}: partitions are integers") from None
    if not parts or parts[0] < 0:
        raise UsageError(f"--topic {text!r}: expected TOPIC or TOPIC:P,P,...")
    return topic, parts


def _reset_partitions(admin: Admin, args: argparse.Namespace) -> list[TopicPartition]:
    if args.all_topics:
        return sorted(admin.list_consumer_group_offsets(args.group))
    chosen: set[TopicPartition] = set()
    for text in args.topic:
        topic, parts = _parse_topic(text)
        info = admin.describe_topics([topic])[topic]
        existing = {p.partition for p in info.partitions}
        if parts is None:
            parts = sorted(existing)
        missing = [p for p in parts if p not in existing]
        if missing:
            raise UsageError(
                f"--topic {text!r}: topic {topic!r} has no partition "
                + ", ".join(map(str, missing))
            )
        chosen.update(TopicPartition(topic, p) for p in parts)
    return sorted(chosen)


def _reset(args: argparse.Namespace) -> int:
    spec = _reset_spec(args)
    with _admin(args) as admin:
        group = _describe_one(admin, args.group)
        if group is not None and not group.is_inactive:
            return fail(
                COMMAND,
                f"offsets of group {args.group!r} can be reset only when it is inactive, "
                f"but its state is {group.state}",
            )
        partitions = _reset_partitions(admin, args)
        if not partitions:
            return fail(COMMAND, f"group {args.group!r} has no partitions to reset")
        earliest = {
            tp: r.offset
            for tp, r in admin.list_offsets(dict.fromkeys(partitions, "earliest")).items()
        }
        latest = {
            tp: r.offset
            for tp, r in admin.list_offsets(dict.fromkeys(partitions, "latest")).items()
        }
        committed = None
        if spec.kind == "shift":
            committed = {
                tp: None if o is None else o.offset
                for tp, o in admin.list_consumer_group_offsets(args.group, partitions).items()
            }
        by_time = None
        if spec.kind == "datetime":
            answers = admin.list_offsets(dict.fromkeys(partitions, spec.value))
            by_time = {tp: r.offset for tp, r in answers.items()}
        plan = plan_reset(
            spec, partitions, earliest=earliest, latest=latest, committed=committed, by_time=by_time
        )
        if args.execute:
            admin.alter_consumer_group_offsets(args.group, plan)
    print_table(
        ("TOPIC", "PARTITION", "NEW-OFFSET"),
        ((tp.topic, tp.partition, offset) for tp, offset in sorted(plan.items())),
    )
    print()
    if args.execute:
        print(f"Offsets of group {args.group} reset.")
    else:
        print("Dry run: no offsets were changed. Add --execute to reset them.")
    return 0


def _delete(args: argparse.Namespace) -> int:
    wanted = list(dict.fromkeys(args.groups))
    with _admin(args) as admin:
        try:
            admin.delete_groups(wanted)
        except PartialFailureError as exc:
            for group in wanted:
                if group not in exc.errors:
                    print(f"Group {group} deleted.")
            raise
    for group in wanted:
        print(f"Group {group} deleted.")
    return 0
