"""What the console's pages show, gathered with the admin client (no HTML here).

Every figure comes from a standard Kafka API (Metadata, DescribeCluster, DescribeLogDirs,
ListOffsets, DescribeConfigs, ListGroups, DescribeGroups, OffsetFetch), so the console shows
any Kafka-compatible cluster. Partition health follows the metadata: a partition is offline
when it has no leader, under-replicated when its ISR is smaller than its replica set.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from tidelog.client import (
    BrokerInfo,
    ClientError,
    ConfigEntry,
    ConfigResource,
    GroupDescription,
    PartialFailureError,
    PartitionInfo,
    TopicInfo,
    TopicPartition,
)
from tidelog.client.aio.admin import AIOAdmin
from tidelog.client.groups import ResetSpec, plan_reset
from tidelog.protocol import ErrorCode


@dataclass(frozen=True, slots=True)
class BrokerDisk:
    node_id: int
    partitions: int  # replicas held, over all its log dirs
    used_bytes: int  # bytes of those replicas
    dirs: tuple[tuple[str, int, int, str | None], ...]  # (path, total, usable, error)
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Overview:
    cluster_id: str | None
    controller_id: int
    brokers: tuple[BrokerInfo, ...]
    topics: int
    partitions: int
    offline: tuple[PartitionInfo, ...]
    under_replicated: tuple[PartitionInfo, ...]
    disks: dict[int, BrokerDisk]


def is_offline(p: PartitionInfo, live: Iterable[int]) -> bool:
    return p.leader < 0 or p.leader not in set(live)


def is_under_replicated(p: PartitionInfo) -> bool:
    return len(p.isr) < len(p.replicas)


async def partition_sizes(admin: AIOAdmin, brokers: Iterable[int]) -> dict[int, BrokerDisk]:
    """DescribeLogDirs of each broker; a broker that fails is shown with its error."""
    out: dict[int, BrokerDisk] = {}
    for node in brokers:
        try:
            dirs = await admin.describe_log_dirs(node)
        except ClientError as exc:
            out[node] = BrokerDisk(node, 0, 0, (), error=str(exc))
            continue
        sizes = {tp: s for d in dirs for tp, s in d.partition_sizes.items()}
        out[node] = BrokerDisk(
            node,
            len(sizes),
            sum(sizes.values()),
            tuple((d.path, d.total_bytes, d.usable_bytes, d.error) for d in dirs),
        )
    return out


async def replica_sizes(
    admin: AIOAdmin, brokers: Iterable[int]
) -> dict[tuple[int, TopicPartition], int]:
    """Bytes of each (broker, partition) replica; brokers that do not answer are left out."""
    out: dict[tuple[int, TopicPartition], int] = {}
    for node in brokers:
        try:
            dirs = await admin.describe_log_dirs(node)
        except ClientError:
            continue
        for d in dirs:
            for tp, size in d.partition_sizes.items():
                out[(node, tp)] = size
    return out


async def overview(admin: AIOAdmin) -> Overview:
    cluster = await admin.describe_cluster()
    topics = await admin.describe_topics(None)
    live = [b.node_id for b in cluster.brokers]
    partitions = [p for t in topics.values() for p in t.partitions]
    return Overview(
        cluster_id=cluster.cluster_id,
        controller_id=cluster.controller_id,
        brokers=cluster.brokers,
        topics=len(topics),
        partitions=len(partitions),
        offline=tuple(p for p in partitions if is_offline(p, live)),
        under_replicated=tuple(p for p in partitions if is_under_replicated(p)),
        disks=await partition_sizes(admin, live),
    )


@dataclass(frozen=True, slots=True)
class TopicRow:
    name: str
    internal: bool
    partitions: int
    replication_factor: int
    size: int  # bytes on the partitions' leaders
    offline: int
    under_replicated: int


def _leader_size(p: PartitionInfo, sizes: dict[tuple[int, TopicPartition], int]) -> int:
    tp = TopicPartition(p.topic, p.partition)
    if (p.leader, tp) in sizes:
        return sizes[(p.leader, tp)]
    return max((sizes.get((r, tp), 0) for r in p.replicas), default=0)


async def topic_rows(
    admin: AIOAdmin, *, include_internal: bool, filter_text: str
) -> list[TopicRow]:
    cluster = await admin.describe_cluster()
    live = [b.node_id for b in cluster.brokers]
    topics = await admin.describe_topics(None)
    wanted = [
        t
        for t in topics.values()
        if (include_internal or not t.is_internal) and filter_text.lower() in t.name.lower()
    ]
    sizes = await replica_sizes(admin, live)
    return [
        TopicRow(
            name=t.name,
            internal=t.is_internal,
            partitions=len(t.partitions),
            replication_factor=max((len(p.replicas) for p in t.partitions), default=0),
            size=sum(_leader_size(p, sizes) for p in t.partitions),
            offline=sum(is_offline(p, live) for p in t.partitions),
            under_replicated=sum(is_under_replicated(p) for p in t.partitions),
        )
        for t in sorted(wanted, key=lambda t: t.name)
    ]


async def describe_topic(admin: AIOAdmin, name: str) -> TopicInfo:
    """The topic's metadata; UNKNOWN_TOPIC_OR_PARTITION (a ClientError) when it does not exist."""
    try:
        return (await admin.describe_topics([name]))[name]
    except PartialFailureError as exc:
        raise exc.errors.get(name, exc) from None


@dataclass(frozen=True, slots=True)
class PartitionRow:
    info: PartitionInfo
    start: int
    end: int
    size: int
    offline: bool
    under_replicated: bool


@dataclass(frozen=True, slots=True)
class TopicDetail:
    info: TopicInfo
    partitions: tuple[PartitionRow, ...]
    configs: dict[str, ConfigEntry]

    @property
    def messages(self) -> int:
        return sum(p.end - p.start for p in self.partitions)

    @property
    def size(self) -> int:
        return sum(p.size for p in self.partitions)


async def offsets_of(
    admin: AIOAdmin, partitions: Iterable[TopicPartition]
) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
    """Start and end offsets of ``partitions``; a topic that fails (deleted since) is left out
    rather than hiding the others."""
    starts: dict[TopicPartition, int] = {}
    ends: dict[TopicPartition, int] = {}
    wanted = list(partitions)
    for topic in sorted({tp.topic for tp in wanted}):
        mine = [tp for tp in wanted if tp.topic == topic]
        try:
            first = await admin.list_offsets(dict.fromkeys(mine, "earliest"))
            last = await admin.list_offsets(dict.fromkeys(mine, "latest"))
        except ClientError:
            continue
        starts.update({tp: r.offset for tp, r in first.items()})
        ends.update({tp: r.offset for tp, r in last.items()})
    return starts, ends


async def topic_detail(admin: AIOAdmin, name: str) -> TopicDetail:
    info = await describe_topic(admin, name)
    cluster = await admin.describe_cluster()
    live = [b.node_id for b in cluster.brokers]
    tps = [TopicPartition(name, p.partition) for p in info.partitions]
    starts, ends = await offsets_of(admin, tps)
    sizes = await replica_sizes(admin, live)
    resource = ConfigResource("topic", name)
    configs = (await admin.describe_configs([resource]))[resource]
    rows = tuple(
        PartitionRow(
            info=p,
            start=starts.get(tp, -1),
            end=ends.get(tp, -1),
            size=_leader_size(p, sizes),
            offline=is_offline(p, live),
            under_replicated=is_under_replicated(p),
        )
        for p, tp in zip(info.partitions, tps, strict=True)
    )
    return TopicDetail(info, rows, configs)


# -- consumer groups ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GroupOffsetRow:
    tp: TopicPartition
    committed: int | None
    end: int | None
    owner: str | None  # member id

    @property
    def lag(self) -> int | None:
        if self.committed is None or self.end is None:
            return None
        return max(0, self.end - self.committed)


@dataclass(frozen=True, slots=True)
class GroupDetail:
    description: GroupDescription
    offsets: tuple[GroupOffsetRow, ...] = field(default_factory=tuple)

    @property
    def total_lag(self) -> int | None:
        lags = [r.lag for r in self.offsets if r.lag is not None]
        return sum(lags) if lags else None


async def describe_group(admin: AIOAdmin, group: str) -> GroupDescription | None:
    """The group, or None when it does not exist (Dead, or GROUP_ID_NOT_FOUND)."""
    try:
        description = (await admin.describe_groups([group]))[group]
    except PartialFailureError as exc:
        error = exc.errors.get(group)
        if error is not None and error.code is ErrorCode.GROUP_ID_NOT_FOUND:
            return None
        raise
    return None if description.state == "Dead" else description


async def group_detail(admin: AIOAdmin, group: str) -> GroupDetail | None:
    description = await describe_group(admin, group)
    if description is None:
        return None
    committed = await admin.list_consumer_group_offsets(group)
    owned = {tp for m in description.members for tp in m.assignment}
    partitions = sorted(owned | set(committed))
    _, ends = await offsets_of(admin, partitions)
    rows = []
    for tp in partitions:
        current = committed.get(tp)
        owner = description.owner(tp)
        rows.append(
            GroupOffsetRow(
                tp=tp,
                committed=None if current is None else current.offset,
                end=ends.get(tp),
                owner=None if owner is None else owner.member_id,
            )
        )
    return GroupDetail(description, tuple(rows))


async def plan_group_reset(
    admin: AIOAdmin,
    group: str,
    spec: ResetSpec,
    partitions: list[TopicPartition],
    exact: dict[TopicPartition, int] | None = None,
) -> dict[TopicPartition, int]:
    """New offsets under Kafka's reset rules. With ``spec.kind == "offset"`` each partition
    takes its own target from ``exact`` (clamped to the partition's range, as the tool does)."""
    starts, ends = await offsets_of(admin, partitions)
    missing = [tp for tp in partitions if tp not in ends]
    if missing:
        raise ClientError(
            f"{', '.join(map(str, missing))}: {ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.message}",
            code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        )
    committed = None
    if spec.kind == "shift":
        committed = {
            tp: None if o is None else o.offset
            for tp, o in (await admin.list_consumer_group_offsets(group, partitions)).items()
        }
    by_time = None
    if spec.kind == "datetime":
        answers = await admin.list_offsets(dict.fromkeys(partitions, spec.value))
        by_time = {tp: r.offset for tp, r in answers.items()}
    if spec.kind == "offset":
        targets = exact or {}
        plan: dict[TopicPartition, int] = {}
        for tp in partitions:
            plan.update(
                plan_reset(ResetSpec("offset", targets[tp]), [tp], earliest=starts, latest=ends)
            )
        return plan
    return plan_reset(
        spec, partitions, earliest=starts, latest=ends, committed=committed, by_time=by_time
    )
