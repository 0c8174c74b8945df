"""`tidelog topics create|list|describe|alter|delete`: Kafka's kafka-topics, on the client."""

from __future__ import annotations

import argparse
from typing import Any

from tidelog.cli.output import UsageError, add_bootstrap, guarded, parse_pairs, print_table
from tidelog.client import Admin, AlterConfigOp, ConfigResource, NewTopic


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "topics",
        help="create, list, describe, alter and delete topics",
        description="Create, list, describe, alter and delete topics.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    create = actions.add_parser("create", help="create a topic")
    add_bootstrap(create)
    create.add_argument("--topic", required=True)
    create.add_argument("--partitions", type=int, default=-1, help="default: the broker's")
    create.add_argument("--replication-factor", type=int, default=-1, help="default: the broker's")
    create.add_argument("--config", action="append", default=[], metavar="K=V")
    create.add_argument("--if-not-exists", action="store_true")
    create.add_argument("--validate-only", action="store_true")
    create.set_defaults(run=guarded("topics create", _create))

    listing = actions.add_parser("list", help="list topic names")
    add_bootstrap(listing)
    listing.add_argument("--exclude-internal", action="store_true")
    listing.set_defaults(run=guarded("topics list", _list))

    describe = actions.add_parser("describe", help="partitions, leaders, replicas and configs")
    add_bootstrap(describe)
    describe.add_argument("--topic", action="append", default=[], help="default: every topic")
    describe.set_defaults(run=guarded("topics describe", _describe))

    alter = actions.add_parser("alter", help="add partitions and/or change configs")
    add_bootstrap(alter)
    alter.add_argument("--topic", required=True)
    alter.add_argument("--partitions", type=int, help="new total number of partitions")
    alter.add_argument("--config", action="append", default=[], metavar="K=V")
    alter.set_defaults(run=guarded("topics alter", _alter))

    delete = actions.add_parser("delete", help="delete topics")
    add_bootstrap(delete)
    delete.add_argument("--topic", action="append", required=True)
    delete.set_defaults(run=guarded("topics delete", _delete))


def _admin(args: argparse.Namespace) -> Admin:
    return Admin({"bootstrap.servers": args.bootstrap_server})


def _create(args: argparse.Namespace) -> int:
    configs = parse_pairs(args.config)
    with _admin(args) as admin:
        if args.if_not_exists and args.topic in admin.list_topics(include_internal=True):
            return 0
        admin.create_topics(
            [NewTopic(args.topic, args.partitions, args.replication_factor, configs)],
            validate_only=args.validate_only,
        )
    verb = "is valid" if args.validate_only else "created"
    print(f"Topic {args.topic} {verb}.")
    return 0


def _list(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        for name in admin.list_topics(include_internal=not args.exclude_internal):
            print(name)
    return 0


def _describe(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        topics = admin.describe_topics(args.topic or None)
        configs = admin.describe_configs([ConfigResource("topic", n) for n in topics])
    first = True
    for name, info in topics.items():
        if not first:
            print()
        first = False
        overrides = {
            k: e.value
            for k, e in configs.get(ConfigResource("topic", name), {}).items()
            if not e.is_default
        }
        replication = len(info.partitions[0].replicas) if info.partitions else 0
        print(
            f"Topic: {name}  TopicId: {info.topic_id}  PartitionCount: {len(info.partitions)}  "
            f"ReplicationFactor: {replication}"
        )
        if overrides:
            print("Configs: " + ",".join(f"{k}={v}" for k, v in sorted(overrides.items())))
        print_table(
            ("PARTITION", "LEADER", "REPLICAS", "ISR"),
            (
                (
                    p.partition,
                    p.leader,
                    ",".join(map(str, p.replicas)),
                    ",".join(map(str, p.isr)),
                )
                for p in info.partitions
            ),
        )
    return 0


def _alter(args: argparse.Namespace) -> int:
    configs = parse_pairs(args.config)
    if args.partitions is None and not configs:
        raise UsageError("nothing to alter: give --partitions and/or --config")
    with _admin(args) as admin:
        if args.partitions is not None:
            admin.create_partitions({args.topic: args.partitions})
        if configs:
            admin.alter_configs(
                {
                    ConfigResource("topic", args.topic): [
                        AlterConfigOp(k, v, "set") for k, v in configs.items()
                    ]
                }
            )
    print(f"Topic {args.topic} altered.")
    return 0


def _delete(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        admin.delete_topics(args.topic)
    for name in args.topic:
        print(f"Topic {name} deleted.")
    return 0
