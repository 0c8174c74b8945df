"""What the console's pages show, gathered with the admin client (no HTML here).

Every figure comes from a standard Kafka API (Metadata, DescribeCluster, DescribeLogDirs,
ListOffsets, DescribeConfigs, ListGroups, DescribeGroups, OffsetFetch, DescribeQuorum,
ListPartitionReassignments, DescribeAcls, DescribeUserScramCredentials, ListTransactions,
DescribeTransactions, DescribeProducers), so the console shows any Kafka-compatible
cluster. Partition health follows the metadata: a partition is offline when it has no
leader, under-replicated when its ISR is smaller than its replica set, under min ISR when
its ISR is smaller than the topic's ``min.insync.replicas``.

A figure whose API the cluster does not serve (UNSUPPORTED_VERSION) or refuses as a whole
(SECURITY_DISABLED, CLUSTER_AUTHORIZATION_FAILED...) is returned as an :class:`Unavailable`
note the page shows in its place, so the rest of the page still renders. Each page makes a
fixed number of requests, whatever the number of partitions: calls are batched.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from tidelog.client import (
    BrokerConnectionError,
    BrokerInfo,
    ClientError,
    ConfigEntry,
    ConfigResource,
    GroupDescription,
    PartialFailureError,
    PartitionInfo,
    PartitionReassignment,
    ProducerState,
    QuorumInfo,
    QuorumReplica,
    RequestTimeoutError,
    TopicInfo,
    TopicPartition,
    TransactionDescription,
    TransactionListing,
)
from tidelog.client.aio.admin import AIOAdmin
from tidelog.client.groups import ResetSpec, plan_reset
from tidelog.protocol import ErrorCode
from tidelog.protocol.acls import AclBinding, AclBindingFilter

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Unavailable:
    """Why a section of a page has nothing to show: the Kafka error the cluster answered
    (its name and the error table's description) and what the client said."""

    name: str
    description: str
    detail: str

    @classmethod
    def of(cls, exc: ClientError) -> Unavailable:
        if exc.code is None:
            return cls("", "", exc.message)
        return cls(exc.code.name, exc.code.message, str(exc))

    @property
    def not_served(self) -> bool:
        return self.name == ErrorCode.UNSUPPORTED_VERSION.name


async def optional(call: Awaitable[T]) -> T | Unavailable:
    """The answer of ``call``, or the cluster's refusal as a note for the page. Errors of
    reaching the cluster at all still fail the page (503)."""
    try:
        return await call
    except (BrokerConnectionError, RequestTimeoutError):
        raise
    except PartialFailureError as exc:
        first = next(iter(exc.errors.values()), exc)
        return Unavailable.of(first)
    except ClientError as exc:
        return Unavailable.of(exc)


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


def is_under_replicated(p: PartitionInfo, moving: PartitionReassignment | None = None) -> bool:
    """Fewer in-sync replicas than the partition should have; while it is being reassigned,
    the replicas being added do not count yet (as kafka-topics counts them)."""
    return len(p.isr) < len(p.replicas) - (len(moving.adding_replicas) if moving else 0)


async def reassignments_of(
    admin: AIOAdmin, partitions: list[TopicPartition] | None = None
) -> dict[TopicPartition, PartitionReassignment] | Unavailable:
    """The reassignments under way, of ``partitions`` or of every partition, in one request
    to the controller. Only a partition with replicas being added or removed is being
    reassigned (some brokers list every partition, with none of either)."""
    moving = await optional(admin.list_partition_reassignments(partitions))
    if isinstance(moving, Unavailable):
        return moving
    return {tp: r for tp, r in moving.items() if r.adding_replicas or r.removing_replicas}


def _under_replicated(
    p: PartitionInfo, moving: dict[TopicPartition, PartitionReassignment] | Unavailable
) -> bool:
    found = (
        None
        if isinstance(moving, Unavailable)
        else moving.get(TopicPartition(p.topic, p.partition))
    )
    return is_under_replicated(p, found)


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
    moving = await reassignments_of(admin)
    return Overview(
        cluster_id=cluster.cluster_id,
        controller_id=cluster.controller_id,
        brokers=cluster.brokers,
        topics=len(topics),
        partitions=len(partitions),
        offline=tuple(p for p in partitions if is_offline(p, live)),
        under_replicated=tuple(p for p in partitions if _under_replicated(p, moving)),
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
    moving = await reassignments_of(admin)
    return [
        TopicRow(
            name=t.name,
            internal=t.is_internal,
            partitions=len(t.partitions),
            replication_factor=max((len(p.replicas) for p in t.partitions), default=0),
            size=sum(_leader_size(p, sizes) for p in t.partitions),
            offline=sum(is_offline(p, live) for p in t.partitions),
            under_replicated=sum(_under_replicated(p, moving) for p in t.partitions),
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
    under_min_isr: bool = False
    reassignment: PartitionReassignment | None = None


@dataclass(frozen=True, slots=True)
class TopicDetail:
    info: TopicInfo
    partitions: tuple[PartitionRow, ...]
    configs: dict[str, ConfigEntry]
    min_insync_replicas: int | None = None
    # Why reassignments are not shown (ListPartitionReassignments not served or refused).
    reassignments_unavailable: Unavailable | None = None

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
    rather than hiding the others. Two requests per leader for all of them; topic by topic
    only when one of them failed."""
    starts: dict[TopicPartition, int] = {}
    ends: dict[TopicPartition, int] = {}
    wanted = list(partitions)
    if not wanted:
        return starts, ends
    try:
        first = await admin.list_offsets(dict.fromkeys(wanted, "earliest"))
        last = await admin.list_offsets(dict.fromkeys(wanted, "latest"))
    except ClientError:
        pass
    else:
        return {tp: r.offset for tp, r in first.items()}, {tp: r.offset for tp, r in last.items()}
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
    min_isr = _min_insync_replicas(configs)
    # One request for every partition of the topic; the controller answers it.
    moving = await reassignments_of(admin, tps)
    reassignments = {} if isinstance(moving, Unavailable) else moving
    rows = tuple(
        PartitionRow(
            info=p,
            start=starts.get(tp, -1),
            end=ends.get(tp, -1),
            size=_leader_size(p, sizes),
            offline=is_offline(p, live),
            under_replicated=is_under_replicated(p, reassignments.get(tp)),
            under_min_isr=is_under_min_isr(p, min_isr),
            reassignment=reassignments.get(tp),
        )
        for p, tp in zip(info.partitions, tps, strict=True)
    )
    return TopicDetail(
        info,
        rows,
        configs,
        min_insync_replicas=min_isr,
        reassignments_unavailable=moving if isinstance(moving, Unavailable) else None,
    )


def _min_insync_replicas(configs: dict[str, ConfigEntry]) -> int | None:
    entry = configs.get("min.insync.replicas")
    if entry is None or entry.value is None:
        return None
    try:
        return int(entry.value)
    except ValueError:
        return None


def is_under_min_isr(p: PartitionInfo, min_isr: int | None) -> bool:
    """Fewer in-sync replicas than ``min.insync.replicas``: producers with acks=all are
    refused (NOT_ENOUGH_REPLICAS). An offline partition is counted as offline instead."""
    return min_isr is not None and p.leader >= 0 and len(p.isr) < min_isr


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


async def describe_groups(admin: AIOAdmin, groups: list[str]) -> list[GroupDescription]:
    """The groups that exist, in the order asked (Dead, or GROUP_ID_NOT_FOUND: left out);
    any other failure is raised."""
    try:
        found = await admin.describe_groups(groups)
    except PartialFailureError as exc:
        if any(e.code is not ErrorCode.GROUP_ID_NOT_FOUND for e in exc.errors.values()):
            raise
        # Only missing groups failed: ask again for the others alone.
        rest = [g for g in groups if g not in exc.errors]
        found = await admin.describe_groups(rest) if rest else {}
    return [found[g] for g in groups if g in found and found[g].state != "Dead"]


async def group_details(admin: AIOAdmin, groups: list[str]) -> list[GroupDetail]:
    """The groups that exist with their committed offsets, owners and lag. The end
    offsets of all their partitions are read together (two requests per leader), not
    group by group."""
    descriptions = await describe_groups(admin, groups)
    committed = {
        d.group_id: await admin.list_consumer_group_offsets(d.group_id) for d in descriptions
    }
    partitions = {
        d.group_id: sorted(
            {tp for m in d.members for tp in m.assignment} | set(committed[d.group_id])
        )
        for d in descriptions
    }
    _, ends = await offsets_of(admin, {tp for tps in partitions.values() for tp in tps})
    details = []
    for description in descriptions:
        rows = []
        for tp in partitions[description.group_id]:
            current = committed[description.group_id].get(tp)
            owner = description.owner(tp)
            rows.append(
                GroupOffsetRow(
                    tp=tp,
                    committed=None if current is None else current.offset,
                    end=ends.get(tp),
                    owner=None if owner is None else owner.member_id,
                )
            )
        details.append(GroupDetail(description, tuple(rows)))
    return details


async def group_detail(admin: AIOAdmin, group: str) -> GroupDetail | None:
    """The group, or None when it does not exist."""
    found = await group_details(admin, [group])
    return found[0] if found else None


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


# -- cluster and metadata quorum ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BrokerRow:
    info: BrokerInfo
    leaders: int  # partitions it leads
    replicas: int  # replicas it holds


@dataclass(frozen=True, slots=True)
class QuorumRow:
    """A voter or observer of the metadata quorum; lag is how far its log end is behind
    the leader's (None while the leader has not seen its log end)."""

    replica: QuorumReplica
    role: str  # "leader", "follower" or "observer"
    lag: int | None


@dataclass(frozen=True, slots=True)
class ClusterView:
    cluster_id: str | None
    controller_id: int
    brokers: tuple[BrokerRow, ...]
    quorum: QuorumInfo | Unavailable

    @property
    def quorum_rows(self) -> tuple[QuorumRow, ...]:
        if isinstance(self.quorum, Unavailable):
            return ()
        return quorum_rows(self.quorum)


def quorum_rows(quorum: QuorumInfo) -> tuple[QuorumRow, ...]:
    """The leader first, then the other voters, then the observers (Kafka's order)."""
    leader = next((r for r in quorum.voters if r.replica_id == quorum.leader_id), None)
    leader_end = leader.log_end_offset if leader is not None else quorum.high_watermark
    ordered = [
        *(("leader", r) for r in quorum.voters if r.replica_id == quorum.leader_id),
        *(("follower", r) for r in quorum.voters if r.replica_id != quorum.leader_id),
        *(("observer", r) for r in quorum.observers),
    ]
    return tuple(
        QuorumRow(r, role, max(0, leader_end - r.log_end_offset) if r.log_end_offset >= 0 else None)
        for role, r in ordered
    )


async def cluster_view(admin: AIOAdmin) -> ClusterView:
    """Brokers (fenced ones too) with the partitions each leads and the replicas each
    holds (one Metadata request for every topic), and the metadata quorum."""
    cluster = await admin.describe_cluster(include_fenced_brokers=True)
    topics = await admin.describe_topics(None)
    leaders: Counter[int] = Counter()
    replicas: Counter[int] = Counter()
    for topic in topics.values():
        for p in topic.partitions:
            if p.leader >= 0:
                leaders[p.leader] += 1
            replicas.update(p.replicas)
    return ClusterView(
        cluster_id=cluster.cluster_id,
        controller_id=cluster.controller_id,
        brokers=tuple(
            BrokerRow(b, leaders.get(b.node_id, 0), replicas.get(b.node_id, 0))
            for b in cluster.brokers
        ),
        # A single node without controller.quorum.voters does not serve DescribeQuorum:
        # UNSUPPORTED_VERSION, which the page shows as "no quorum".
        quorum=await optional(admin.describe_quorum()),
    )


# -- ACLs and SCRAM users ------------------------------------------------------------------------


async def acls(admin: AIOAdmin, acl_filter: AclBindingFilter) -> list[AclBinding] | Unavailable:
    """The ACLs ``acl_filter`` selects, sorted by resource then principal; SECURITY_DISABLED
    (no authorizer) and the like as a note."""
    found = await optional(admin.describe_acls(acl_filter))
    if isinstance(found, Unavailable):
        return found
    return sorted(
        found,
        key=lambda b: (
            b.resource_type.name,
            b.resource_name,
            b.pattern_type.name,
            b.principal,
            b.host,
            b.operation.name,
            b.permission.name,
        ),
    )


async def scram_users(admin: AIOAdmin) -> dict[str, list[tuple[str, int]]] | Unavailable:
    """user -> [(mechanism, iterations)], sorted by user, in one request."""
    found = await optional(admin.describe_user_scram_credentials())
    if isinstance(found, Unavailable):
        return found
    return {user: sorted(found[user]) for user in sorted(found)}


# -- transactions -----------------------------------------------------------------------------


async def transactions(
    admin: AIOAdmin, states: list[str]
) -> list[TransactionListing] | Unavailable:
    """ListTransactions of every broker (one request each), filtered by state there."""
    return await optional(admin.list_transactions(states=states))


async def describe_transaction(admin: AIOAdmin, tid: str) -> TransactionDescription:
    """The transaction as its coordinator describes it; TRANSACTIONAL_ID_NOT_FOUND (a
    ClientError) when there is no such id."""
    try:
        return (await admin.describe_transactions([tid]))[tid]
    except PartialFailureError as exc:
        raise exc.errors.get(tid, exc) from None


async def producers(
    admin: AIOAdmin, partitions: list[TopicPartition]
) -> dict[TopicPartition, list[ProducerState] | Unavailable] | Unavailable:
    """The producers each partition's leader keeps state for (one DescribeProducers per
    leader for all of them); a partition that fails is shown with its error."""
    if not partitions:
        return {}
    try:
        found = await admin.describe_producers(partitions)
    except PartialFailureError as exc:
        # The partitions that answered are not in the error: ask again for those alone.
        failed = {tp: Unavailable.of(e) for tp, e in exc.errors.items()}
        rest = [tp for tp in partitions if tp not in failed]
        answered = await optional(admin.describe_producers(rest)) if rest else {}
        if isinstance(answered, Unavailable):
            return answered
        merged: dict[TopicPartition, list[ProducerState] | Unavailable] = {**answered}
        merged.update({tp: e for tp, e in failed.items() if isinstance(tp, TopicPartition)})
        return merged
    except (BrokerConnectionError, RequestTimeoutError):
        raise
    except ClientError as exc:
        return Unavailable.of(exc)
    return dict(found)
