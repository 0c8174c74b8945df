"""`tidelog configs describe|alter`: Kafka's kafka-configs for topics and brokers."""

from __future__ import annotations

import argparse
from typing import Any

from tidelog.cli.output import UsageError, add_bootstrap, guarded, parse_pairs, print_table
from tidelog.client import Admin, AlterConfigOp, ConfigResource

_TYPES = {"topics": "topic", "brokers": "broker"}


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "configs",
        help="describe and alter topic and broker configs",
        description="Describe and alter topic and broker configs.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for action, helptext in (("describe", "show configs"), ("alter", "change configs")):
        sub = actions.add_parser(action, help=helptext)
        add_bootstrap(sub)
        sub.add_argument("--entity-type", required=True, choices=sorted(_TYPES))
        sub.add_argument("--entity-name", required=True, help="topic name or broker id")
        if action == "describe":
            sub.add_argument("--all", action="store_true", help="include defaults")
            sub.set_defaults(run=guarded("configs describe", _describe))
        else:
            sub.add_argument("--add-config", action="append", default=[], metavar="K=V,...")
            sub.add_argument("--delete-config", action="append", default=[], metavar="K,...")
            sub.set_defaults(run=guarded("configs alter", _alter))


def _resource(args: argparse.Namespace) -> ConfigResource:
    return ConfigResource(_TYPES[args.entity_type], args.entity_name)


def _describe(args: argparse.Namespace) -> int:
    resource = _resource(args)
    with Admin({"bootstrap.servers": args.bootstrap_server}) as admin:
        entries = admin.describe_configs([resource])[resource]
    shown = [e for e in entries.values() if args.all or not e.is_default]
    print(f"Configs for {args.entity_type[:-1]} {args.entity_name}:")
    print_table(
        ("NAME", "VALUE", "SOURCE", "READ-ONLY"),
        (
            (
                e.name,
                "(sensitive)" if e.is_sensitive else e.value,
                e.source,
                str(e.read_only).lower(),
            )
            for e in shown
        ),
    )
    return 0


def _alter(args: argparse.Namespace) -> int:
    ops = [
        AlterConfigOp(k, v, "set") for k, v in parse_pairs(args.add_config, "--add-config").items()
    ]
    for item in args.delete_config:
        ops += [AlterConfigOp(k.strip(), None, "delete") for k in item.split(",") if k.strip()]
    if not ops:
        raise UsageError("nothing to alter: give --add-config and/or --delete-config")
    with Admin({"bootstrap.servers": args.bootstrap_server}) as admin:
        admin.alter_configs({_resource(args): ops})
    print(f"Completed updating config for {args.entity_type[:-1]} {args.entity_name}.")
    return 0
