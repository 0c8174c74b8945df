"""`tidelog acls --add|--remove|--list`: Kafka's kafka-acls, over CreateAcls, DeleteAcls and
DescribeAcls.

As kafka-acls does: ``--allow-principal`` / ``--deny-principal`` name who (hosts from
``--allow-host`` / ``--deny-host``, default every host), ``--operation`` what (default
All), ``--topic``, ``--group``, ``--cluster`` and ``--transactional-id`` on what, with
``--resource-pattern-type`` LITERAL (default) or PREFIXED, and ANY or MATCH for --list
and --remove. ``--producer`` and ``--consumer`` are kafka-acls's shortcuts: Write,
Describe and Create on the topics (Write and Describe on a ``--transactional-id``); Read
and Describe on the topics and Read on the ``--group``. ``--remove`` asks before it
deletes, unless ``--force``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from typing import Any

from tidelog.cli.output import UsageError, add_bootstrap, guarded, print_table
from tidelog.client import Admin
from tidelog.protocol.acls import (
    CLUSTER_NAME,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)

_ANY_HOST = "*"
_HEADERS = ("RESOURCE-TYPE", "NAME", "PATTERN", "PRINCIPAL", "HOST", "OPERATION", "PERMISSION")
# What kafka-acls's --producer and --consumer shortcuts stand for, per resource type.
_PRODUCER = {
    ResourceType.TOPIC: (AclOperation.WRITE, AclOperation.DESCRIBE, AclOperation.CREATE),
    ResourceType.TRANSACTIONAL_ID: (AclOperation.WRITE, AclOperation.DESCRIBE),
}
_CONSUMER = {
    ResourceType.TOPIC: (AclOperation.READ, AclOperation.DESCRIBE),
    ResourceType.GROUP: (AclOperation.READ,),
}


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "acls",
        help="add, remove and list ACLs",
        description="Add, remove and list ACLs (the broker needs authorizer.class.name set).",
    )
    add_bootstrap(parser)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--add", action="store_true", help="create the ACLs described")
    action.add_argument("--remove", action="store_true", help="delete the ACLs described")
    action.add_argument("--list", action="store_true", help="show ACLs")
    for flag, helptext in (
        ("--allow-principal", "principal (User:name, User:*) the ACLs allow"),
        ("--deny-principal", "principal the ACLs deny"),
        ("--allow-host", "host the allow ACLs apply to (default: every host)"),
        ("--deny-host", "host the deny ACLs apply to (default: every host)"),
        ("--operation", "Read, Write, Create, Delete, Alter, Describe, ClusterAction, "
         "DescribeConfigs, AlterConfigs, IdempotentWrite, All (default All)"),
        ("--topic", "topic name (or prefix, or * for every topic)"),
        ("--group", "consumer group id (or prefix, or *)"),
        ("--transactional-id", "transactional id (or prefix, or *)"),
    ):  # fmt: skip
        parser.add_argument(flag, action="append", default=[], help=helptext)
    parser.add_argument("--principal", help="--list: only the ACLs of this principal")
    parser.add_argument("--cluster", action="store_true", help="the cluster resource")
    parser.add_argument(
        "--resource-pattern-type",
        default=None,
        type=str.upper,
        choices=("LITERAL", "PREFIXED", "MATCH", "ANY"),
        metavar="TYPE",
        help="literal (default), prefixed; match or any for --list and --remove",
    )
    parser.add_argument("--producer", action="store_true", help="the ACLs a producer needs")
    parser.add_argument("--consumer", action="store_true", help="the ACLs a consumer needs")
    parser.add_argument("--force", action="store_true", help="--remove without asking")
    parser.set_defaults(run=guarded("acls", _run))


def _operation(text: str) -> AclOperation:
    wanted = text.replace("_", "").replace("-", "").upper()
    for operation in AclOperation:
        if operation.name.replace("_", "") == wanted and operation not in (
            AclOperation.UNKNOWN,
            AclOperation.ANY,
        ):
            return operation
    names = "Read, Write, Create, Delete, Alter, Describe, ClusterAction, DescribeConfigs, "
    raise UsageError(
        f"--operation {text!r}: expected one of {names}AlterConfigs, IdempotentWrite, All"
    )


def _resources(args: argparse.Namespace) -> list[tuple[ResourceType, str]]:
    resources = [(ResourceType.TOPIC, name) for name in args.topic]
    resources += [(ResourceType.GROUP, name) for name in args.group]
    resources += [(ResourceType.TRANSACTIONAL_ID, name) for name in args.transactional_id]
    if args.cluster:
        resources.append((ResourceType.CLUSTER, CLUSTER_NAME))
    return resources


def _pattern(args: argparse.Namespace, allowed: Iterable[str]) -> PatternType:
    name = args.resource_pattern_type or "LITERAL"
    if name not in allowed:
        action = "--add" if args.add else "--list/--remove"
        raise UsageError(f"--resource-pattern-type {name.lower()} is not valid with {action}")
    return PatternType[name]


def _entries(
    args: argparse.Namespace, default_operations: tuple[AclOperation, ...]
) -> list[tuple[str, str, AclPermissionType, AclOperation]]:
    """(principal, host, permission, operation) for every principal, host and operation."""
    operations = [_operation(text) for text in args.operation] or list(default_operations)
    out: list[tuple[str, str, AclPermissionType, AclOperation]] = []
    for principals, hosts, permission in (
        (args.allow_principal, args.allow_host, AclPermissionType.ALLOW),
        (args.deny_principal, args.deny_host, AclPermissionType.DENY),
    ):
        for principal in principals:
            for host in hosts or [_ANY_HOST]:
                out.extend((principal, host, permission, op) for op in operations)
    return out


def _shortcut_bindings(args: argparse.Namespace) -> list[AclBinding]:
    """The ACLs --producer or --consumer stands for."""
    table = _PRODUCER if args.producer else _CONSUMER
    if args.consumer and not args.group:
        raise UsageError("--consumer needs --group (consumers read their group's offsets)")
    if args.operation:
        raise UsageError("--operation cannot be combined with --producer or --consumer")
    pattern = _pattern(args, ("LITERAL", "PREFIXED"))
    bindings: list[AclBinding] = []
    for resource_type, name in _resources(args):
        operations = table.get(resource_type)
        if operations is None:
            continue
        for principal, host, permission, _ in _entries(args, (AclOperation.ALL,)):
            bindings.extend(
                AclBinding(resource_type, name, pattern, principal, host, op, permission)
                for op in operations
            )
    return bindings


def _bindings(args: argparse.Namespace) -> list[AclBinding]:
    if not _resources(args):
        raise UsageError("--add needs one of --topic, --group, --cluster, --transactional-id")
    if not (args.allow_principal or args.deny_principal):
        raise UsageError("--add needs --allow-principal or --deny-principal")
    if args.producer or args.consumer:
        return _shortcut_bindings(args)
    pattern = _pattern(args, ("LITERAL", "PREFIXED"))
    return [
        AclBinding(resource_type, name, pattern, principal, host, operation, permission)
        for resource_type, name in _resources(args)
        for principal, host, permission, operation in _entries(args, (AclOperation.ALL,))
    ]


def _filters(args: argparse.Namespace) -> list[AclBindingFilter]:
    """--list and --remove: per resource (every ACL when none is named), the ACLs of the
    principals, hosts and operations given (all of them when no principal is)."""
    resources = _resources(args)
    if not resources:
        if args.remove:
            raise UsageError(
                "--remove needs one of --topic, --group, --cluster, --transactional-id"
            )
        pattern = PatternType[args.resource_pattern_type or "ANY"]
        return [AclBindingFilter(pattern_type=pattern, principal=args.principal)]
    pattern = _pattern(args, ("LITERAL", "PREFIXED", "MATCH", "ANY"))
    filters = []
    for resource_type, name in resources:
        entries = _entries(args, (AclOperation.ALL,))
        if not entries:
            filters.append(AclBindingFilter(resource_type, name, pattern, args.principal))
            continue
        filters.extend(
            AclBindingFilter(resource_type, name, pattern, principal, host, operation, permission)
            for principal, host, permission, operation in entries
        )
    return filters


def _rows(bindings: Iterable[AclBinding]) -> list[tuple[str, ...]]:
    return [
        (
            b.resource_type.name,
            b.resource_name,
            b.pattern_type.name,
            b.principal,
            b.host,
            b.operation.name,
            b.permission.name,
        )
        for b in sorted(set(bindings), key=lambda b: (b.resource_type, b.resource_name, str(b)))
    ]


def _confirmed(filters: list[AclBindingFilter]) -> bool:
    print("Remove the ACLs matching:", file=sys.stderr)
    for f in filters:
        parts = [
            f"resource type {f.resource_type.name}",
            f"name {f.resource_name if f.resource_name is not None else '(any)'}",
            f"pattern {f.pattern_type.name}",
            f"principal {f.principal or '(any)'}",
            f"host {f.host or '(any)'}",
            f"operation {f.operation.name}",
            f"permission {f.permission.name}",
        ]
        print("  " + ", ".join(parts), file=sys.stderr)
    print("Are you sure? (y/n) ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline().strip().lower()
    return answer in ("y", "yes")


def _run(args: argparse.Namespace) -> int:
    with Admin({"bootstrap.servers": args.bootstrap_server}) as admin:
        if args.add:
            bindings = _bindings(args)
            admin.create_acls(bindings)
            print(f"Added {len(bindings)} ACL(s):")
            print_table(_HEADERS, _rows(bindings))
            return 0
        filters = _filters(args)
        if args.list:
            found = [b for f in filters for b in admin.describe_acls(f)]
            print_table(_HEADERS, _rows(found))
            return 0
        if not args.force and not _confirmed(filters):
            raise UsageError("not confirmed: nothing removed (--force removes without asking)")
        deleted = [b for per_filter in admin.delete_acls(filters) for b in per_filter]
        print(f"Removed {len(set(deleted))} ACL(s):")
        print_table(_HEADERS, _rows(deleted))
        return 0
