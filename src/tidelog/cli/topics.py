"""`tidelog topics create|list|describe|alter|delete`: Kafka's kafka-topics, on the client.

``describe`` shows each partition's leader ("none" without one), replicas and ISR, and
while a reassignment runs the replicas being added and removed (ListPartitionReassignments),
and offline replicas when there are any; Kafka's filters (``--under-replicated-partitions``
and the others) list only the partitions that match, with ``min.insync.replicas`` taken
from each topic's effective config."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tidelog.cli.output import UsageError, add_bootstrap, guarded, parse_pairs, print_table
from tidelog.client import (
    Admin,
    AlterConfigOp,
    ClientError,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    PartitionInfo,
    PartitionReassignment,
    TopicInfo,
    TopicPartition,
    UnsupportedApiError,
)
from tidelog.protocol import ErrorCode


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
    describe.add_argument(
        "--under-replicated-partitions",
        action="store_true",
        help="only partitions whose ISR is smaller than their replicas",
    )
    describe.add_argument(
        "--unavailable-partitions",
        action="store_true",
        help="only partitions without a leader, or whose leader is not a live broker",
    )
    describe.add_argument(
        "--under-min-isr-partitions",
        action="store_true",
        help=f"only partitions whose ISR is smaller than the topic's {MIN_ISR}",
    )
    describe.add_argument(
        "--at-min-isr-partitions",
        action="store_true",
        help=f"only partitions whose ISR is exactly the topic's {MIN_ISR}",
    )
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
        moving = _reassignments(admin, topics)
        live = {b.node_id for b in admin.describe_cluster().brokers}
    described = {
        name: [
            PartitionState.of(p, moving.get(TopicPartition(name, p.partition)))
            for p in info.partitions
        ]
        for name, info in topics.items()
    }
    filters = [f for f in PARTITION_FILTERS if getattr(args, f.replace("-", "_"))]
    if filters:
        _print_filtered(described, configs, live, filters)
        return 0
    first = True
    for name, partitions in described.items():
        if not first:
            print()
        first = False
        overrides = {
            k: e.value
            for k, e in configs.get(ConfigResource("topic", name), {}).items()
            if not e.is_default
        }
        replication = partitions[0].replication_factor if partitions else 0
        print(
            f"Topic: {name}  TopicId: {topics[name].topic_id}  "
            f"PartitionCount: {len(partitions)}  ReplicationFactor: {replication}"
        )
        if overrides:
            print("Configs: " + ",".join(f"{k}={v}" for k, v in sorted(overrides.items())))
        print_partitions(partitions, with_topic=False)
    return 0


# The partition filters of kafka-topics --describe: with any, only the partitions that
# match one of them are listed (one table over every topic), and no topic headers.
PARTITION_FILTERS = (
    "under-replicated-partitions",
    "unavailable-partitions",
    "under-min-isr-partitions",
    "at-min-isr-partitions",
)
MIN_ISR = "min.insync.replicas"


@dataclass(frozen=True, slots=True)
class PartitionState:
    """What `topics describe` shows of a partition: Metadata's view, and the reassignment
    under way if any (ListPartitionReassignments; Metadata does not carry it)."""

    topic: str
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline: tuple[int, ...] = ()
    adding: tuple[int, ...] = ()
    removing: tuple[int, ...] = ()

    @classmethod
    def of(cls, p: PartitionInfo, moving: PartitionReassignment | None) -> PartitionState:
        return cls(
            p.topic,
            p.partition,
            p.leader,
            p.replicas,
            p.isr,
            p.offline_replicas,
            moving.adding_replicas if moving else (),
            moving.removing_replicas if moving else (),
        )

    @property
    def replication_factor(self) -> int:
        # While replicas are added the target is what counts (Kafka's TopicCommand).
        return len(self.replicas) - len(self.adding)

    def matches(self, name: str, live: set[int], min_isr: int | None) -> bool:
        has_leader = self.leader >= 0
        if name == "under-replicated-partitions":
            return len(self.isr) < self.replication_factor
        if name == "unavailable-partitions":
            return not has_leader or self.leader not in live
        if name == "under-min-isr-partitions":
            return not has_leader or (min_isr is not None and len(self.isr) < min_isr)
        return min_isr is not None and len(self.isr) == min_isr


def _reassignments(
    admin: Admin, topics: Mapping[str, TopicInfo]
) -> dict[TopicPartition, PartitionReassignment]:
    """The reassignments under way among ``topics``' partitions; none when the cluster does
    not serve ListPartitionReassignments or does not let us ask (Describe on the cluster),
    as kafka-topics then still describes the rest."""
    partitions = [TopicPartition(n, p.partition) for n, i in topics.items() for p in i.partitions]
    if not partitions:
        return {}
    try:
        return admin.list_partition_reassignments(partitions)
    except UnsupportedApiError:
        return {}
    except ClientError as exc:
        if exc.code is ErrorCode.CLUSTER_AUTHORIZATION_FAILED:
            return {}
        raise


def _ids(ids: Sequence[int]) -> str:
    return ",".join(map(str, ids))


def print_partitions(partitions: Sequence[PartitionState], *, with_topic: bool) -> None:
    """Kafka's per-partition fields as columns; Adding, Removing and Offline appear only
    when some partition shown has any."""
    optional = [
        (title, field)
        for title, field in (
            ("ADDING", "adding"),
            ("REMOVING", "removing"),
            ("OFFLINE", "offline"),
        )
        if any(getattr(p, field) for p in partitions)
    ]
    headers = [
        *(["TOPIC"] if with_topic else []),
        "PARTITION",
        "LEADER",
        "REPLICAS",
        "ISR",
        *(title for title, _ in optional),
    ]
    print_table(
        headers,
        (
            (
                *([p.topic] if with_topic else []),
                p.partition,
                p.leader if p.leader >= 0 else "none",
                _ids(p.replicas),
                _ids(p.isr),
                *(_ids(getattr(p, field)) for _, field in optional),
            )
            for p in partitions
        ),
    )


def _min_isr(entries: Mapping[str, ConfigEntry]) -> int | None:
    entry = entries.get(MIN_ISR)
    try:
        return None if entry is None or entry.value is None else int(entry.value)
    except ValueError:
        return None


def _print_filtered(
    described: Mapping[str, Sequence[PartitionState]],
    configs: Mapping[ConfigResource, Mapping[str, ConfigEntry]],
    live: set[int],
    filters: Sequence[str],
) -> None:
    matching = []
    for name, partitions in described.items():
        min_isr = _min_isr(configs.get(ConfigResource("topic", name), {}))
        matching += [p for p in partitions if any(p.matches(f, live, min_isr) for f in filters)]
    if matching:
        print_partitions(matching, with_topic=True)


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
