"""The controller of a single-node cluster: the one place where metadata is committed.

Every operation runs in two steps. First a function of the concern (:mod:`.topics`,
:mod:`.configs`, :mod:`.producer_ids`, :mod:`.cluster`) checks the request against the
committed image and returns a :class:`~tidelog.metadata.controller.base.ControllerResult`:
the records to commit and the reply to give once they are. Nothing changes yet. Then
:meth:`Controller._commit_result`, the commit path:

1. appends the records as one batch (several when they exceed
   :data:`~tidelog.metadata.controller.base.MAX_RECORDS_PER_BATCH`, never splitting an
   item) to the metadata log and fsyncs it;
2. hands each committed batch to the :class:`~tidelog.metadata.loader.MetadataLoader`,
   which replays it into the next image and tells the publishers (the broker);
3. only then returns the reply.

State changes only by replaying committed records. This node is the only voter of its
quorum, so "committed" means "fsynced in the local metadata log"; with a Raft quorum
the commit path becomes "propose, and reply when the high watermark passes the records".

Operations are serialized by one lock and block on the fsync: an asyncio broker calls
them from a worker thread. The lock and the worker thread belong to this driver, not to
the checks, which are plain functions of a :class:`ControllerView`. Time, randomness and
fsync come from the injected :class:`~tidelog.runtime.system.Runtime`.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar

from tidelog.metadata.acls import AclBinding, AclBindingFilter
from tidelog.metadata.configs import BrokerConfig
from tidelog.metadata.controller import (
    acls,
    configs,
    elections,
    isr,
    producer_ids,
    quotas,
    reassignment,
    scram,
    topics,
)
from tidelog.metadata.controller.acls import AclDeleteResult, AclDescribeResult
from tidelog.metadata.controller.base import ControllerResult, ControllerView, group_batches
from tidelog.metadata.controller.cluster import (
    ClusterControl,
    HeartbeatReply,
    HeartbeatRequest,
    RegistrationReply,
    RegistrationRequest,
)
from tidelog.metadata.controller.configs import (
    AlterConfigsResource,
    ConfigResourceResult,
    DescribeConfigsResource,
    DescribeConfigsResult,
    IncrementalAlterConfigsResource,
    describe_configs,
    effective_broker_config,
)
from tidelog.metadata.controller.elections import ElectionResult, ElectionType
from tidelog.metadata.controller.isr import AlterPartitionReply, AlterPartitionRequest
from tidelog.metadata.controller.producer_ids import ProducerIdBlock
from tidelog.metadata.controller.quotas import (
    AlterQuotaResult,
    QuotaAlteration,
    QuotaFilterComponent,
)
from tidelog.metadata.controller.reassignment import (
    OngoingReassignment,
    ReassignmentRequest,
    ReassignmentResult,
)
from tidelog.metadata.controller.scram import (
    AlterScramResult,
    DescribeScramResult,
    ScramDeletion,
    ScramUpsertion,
)
from tidelog.metadata.controller.topics import (
    CreatePartitionsResult,
    CreateTopicResult,
    DeleteTopicResult,
    NewPartitions,
    NewTopic,
)
from tidelog.metadata.errors import OK, ApiError, MetadataError
from tidelog.metadata.image import MetadataDelta, MetadataImage
from tidelog.metadata.loader import MetadataLoader, Publisher
from tidelog.metadata.log import MetadataBatch, MetadataLog
from tidelog.metadata.quotas import QuotaEntity
from tidelog.metadata.records import BrokerEndpoint, MetadataRecord
from tidelog.protocol.error_codes import ErrorCode
from tidelog.runtime.system import Runtime, random_uuid
from tidelog.storage.errors import StorageError

__all__ = ["Controller", "Listener", "NotControllerError", "QuorumCommit"]

_log = logging.getLogger(__name__)

#: The most replicas a partition may have on a node of a metadata quorum, or None for as
#: many as there are active brokers. The one switch for replicated partitions: brokers do
#: not copy partitions between them yet (issue 21's data path), so a cluster of several
#: nodes gives every partition one replica until that work sets this to None. Placement,
#: elections and reassignment are written and tested for any factor already.
QUORUM_MAX_REPLICATION_FACTOR: int | None = 1

R = TypeVar("R")
#: A publisher of the loader: (new image, delta) after each committed change.
Listener = Publisher


class NotControllerError(MetadataError):
    """This node's controller is not the active one (it does not lead the metadata quorum,
    or has not loaded everything its leadership starts from): the operation changed
    nothing and belongs to the active controller (Kafka's NOT_CONTROLLER). ``leader_id``
    is the quorum leader this node knows, if any."""

    code = ErrorCode.NOT_CONTROLLER

    def __init__(self, leader_id: int | None, reason: str) -> None:
        super().__init__(reason)
        self.leader_id = leader_id


class QuorumCommit(Protocol):
    """The commit path of a controller that is one voter of a metadata quorum (given by
    the node's asyncio side, :mod:`tidelog.broker.quorum`). Called under the controller's
    lock from a worker thread."""

    def active_epoch(self) -> int:
        """The quorum epoch this node leads with everything before it loaded; raises
        :class:`NotControllerError` when it is not the active controller."""
        ...

    def next_offset(self) -> int:
        """The offset the next committed record will get."""
        ...

    def commit(self, records: Sequence[MetadataRecord]) -> int:
        """Propose ``records`` as one entry and return its last offset once it is committed
        and loaded into the image; :class:`NotControllerError` if leadership was lost."""
        ...

    def create_topic_at_active(self, topic: NewTopic) -> CreateTopicResult:
        """Have the active controller create ``topic`` (a CreateTopics sent to it) and
        return its answer once this node has loaded the result."""
        ...

    def producer_ids_at_active(self) -> ProducerIdBlock:
        """A block of producer ids for this node's broker from the active controller (an
        AllocateProducerIds sent to it, with the broker's registration epoch)."""
        ...


class Controller:
    """The active (and only) controller of a single-node cluster.

    Built by :func:`~tidelog.metadata.node.build_metadata_node`, which replays the
    metadata log into the loader and registers this node. :attr:`image` is the latest
    committed image; :meth:`add_listener` callbacks run after every committed change,
    under the controller's lock, with the new image and the delta.
    """

    def __init__(
        self,
        config: BrokerConfig,
        log: MetadataLog,
        loader: MetadataLoader,
        runtime: Runtime,
    ) -> None:
        self._static = config
        self._log = log
        self._loader = loader
        self._runtime = runtime
        self._config = effective_broker_config(config, loader.image)
        # The leader epoch batches are written in: the single voter's, until Raft.
        self._epoch = max(loader.image.epoch, 0)
        self._lock = threading.RLock()
        self._failure: str | None = None
        self.broker_epoch = -1
        # Broker sessions: a single node's controller is always the active one; a quorum
        # voter's is active while it leads (see _view).
        self._cluster = ClusterControl(config.get_int("broker.session.timeout.ms"))
        #: Set on a quorum voter (``controller.quorum.voters``): commits go through Raft.
        self._quorum: QuorumCommit | None = None
        self._quorum_mode = config.quorum_mode
        self._active_epoch: int | None = None
        # When the automatic preferred-leader rebalance next runs (None: not scheduled
        # yet; the first check comes one interval after this controller starts ticking).
        self._rebalance_at: int | None = None
        if self._quorum_mode:
            self._cluster.deactivate()
        # First publisher, so that every other one sees the config of its image.
        loader.add_publisher(self._follow_config)

    # -- state -------------------------------------------------------------------------

    @property
    def image(self) -> MetadataImage:
        return self._loader.image

    @property
    def config(self) -> BrokerConfig:
        """The broker config with the committed dynamic broker configs applied."""
        return self._config

    @property
    def static_config(self) -> BrokerConfig:
        return self._static

    @property
    def node_id(self) -> int:
        return self._static.node_id

    @property
    def metadata_log(self) -> MetadataLog:
        return self._log

    @property
    def loader(self) -> MetadataLoader:
        return self._loader

    def add_listener(self, listener: Listener) -> None:
        """Publish every later committed change to ``listener`` (see the loader)."""
        with self._lock:
            self._loader.add_publisher(listener)

    def close(self) -> None:
        with self._lock:
            self._log.close()

    def _follow_config(self, image: MetadataImage, delta: MetadataDelta) -> None:
        if delta.changed_broker_configs:
            self._config = effective_broker_config(self._static, image)

    def use_quorum(self, quorum: QuorumCommit) -> None:
        """Commit through ``quorum`` from now on (a quorum voter, once its driver runs)."""
        with self._lock:
            self._quorum = quorum

    @property
    def quorum_mode(self) -> bool:
        return self._quorum_mode

    def is_active(self) -> bool:
        """Whether this controller may take operations now (always on a single node)."""
        if not self._quorum_mode:
            return True
        quorum = self._quorum
        if quorum is None:
            return False
        try:
            quorum.active_epoch()
        except NotControllerError:
            return False
        return True

    def _local_view(self) -> ControllerView:
        """The committed image as this node has it, for planning what to ask the active
        controller for (never for committing)."""
        return ControllerView(
            self.image,
            self._config,
            self._static,
            self._runtime.random,
            max_replication_factor=QUORUM_MAX_REPLICATION_FACTOR if self._quorum_mode else None,
        )

    def _view(self) -> ControllerView:
        """The view an operation checks against. On a quorum voter, only while it is the
        active controller (else NotControllerError): broker sessions start afresh each
        time it becomes active and are dropped when it stops being so."""
        if not self._quorum_mode:
            return ControllerView(
                self.image,
                self._config,
                self._static,
                self._runtime.random,
                next_offset=self._log.end_offset,
            )
        try:
            if self._quorum is None:
                raise NotControllerError(None, "the metadata quorum is not running yet")
            epoch = self._quorum.active_epoch()
        except NotControllerError:
            if self._active_epoch is not None:
                self._active_epoch = None
                self._cluster.deactivate()
                self._rebalance_at = None
            raise
        if self._active_epoch != epoch:
            self._active_epoch = epoch
            self._cluster.activate()
            # A new term of office: the first rebalance comes one interval from now.
            self._rebalance_at = None
        return ControllerView(
            self.image,
            self._config,
            self._static,
            self._runtime.random,
            next_offset=self._quorum.next_offset(),
            max_replication_factor=QUORUM_MAX_REPLICATION_FACTOR,
        )

    # -- the commit path ---------------------------------------------------------------

    def _commit_result(self, result: ControllerResult[R]) -> R:
        """Commit ``result``'s records and return its reply once they are applied."""
        if not result.items:
            return result.response
        errors: dict[int, ApiError] = {}
        for members, records in group_batches(result.items):
            error = self._commit(records)
            if not error.ok:
                for index in members:
                    errors[index] = error
        if not errors:
            return result.response
        assert result.failed is not None, "a result with records says how it fails"
        return result.failed(errors)

    def _commit(self, records: Sequence[MetadataRecord]) -> ApiError:
        """Append ``records`` durably as one batch and load it; an error when that fails.

        A failed append leaves the log and the image possibly apart, so the controller
        then refuses every further change until restarted (replay settles it).
        """
        if self._failure is not None:
            return ApiError(ErrorCode.UNKNOWN_SERVER_ERROR, self._failure)
        if self._quorum is not None:
            # Committed by a majority and loaded (the loader is fed by the quorum) before
            # it returns; a lost leadership raises NotControllerError.
            self._quorum.commit(records)
            return OK
        try:
            first = self._log.append(records, leader_epoch=self._epoch)
        except (StorageError, OSError) as exc:
            self._failure = f"the metadata log failed and needs a restart: {exc}"
            _log.error("%s", self._failure)
            return ApiError(ErrorCode.KAFKA_STORAGE_ERROR, str(exc))
        entries = tuple((first + i, record) for i, record in enumerate(records))
        self._loader.load(MetadataBatch(first, entries[-1][0], self._epoch, entries))
        return OK

    # -- operations --------------------------------------------------------------------

    @property
    def cluster(self) -> ClusterControl:
        """Broker registrations' sessions (see :mod:`.cluster`)."""
        return self._cluster

    def commit_bootstrap(self, records: Sequence[MetadataRecord]) -> None:
        """Commit the records ``storage format`` left for the first start (see
        :mod:`~tidelog.metadata.bootstrap`), through the one commit path."""
        with self._lock:
            error = self._commit(records)
            if not error.ok:
                raise MetadataError(f"cannot commit the bootstrap records: {error.message}")

    def register_local_broker(self) -> int:
        """Register this node's broker with its advertised listeners and a new incarnation
        id, then heartbeat it once: it has replayed the whole log, so it is caught up and
        unfenced at once. The same path as any broker's; returns the broker epoch."""
        with self._lock:
            static = self._static
            request = RegistrationRequest(
                self.node_id,
                self.image.cluster_id,
                random_uuid(self._runtime.random),
                tuple(
                    BrokerEndpoint(e.name, e.host, e.port, e.security_protocol)
                    for e in static.advertised_listeners
                ),
                static.get_str("broker.rack"),
            )
            registered = self.register_broker(request)
            if not registered.error.ok:
                raise MetadataError(
                    f"cannot register broker {self.node_id}: {registered.error.message}"
                )
            self.broker_epoch = registered.broker_epoch
            beat = self.heartbeat_local_broker()
            if not beat.error.ok or beat.is_fenced:
                raise MetadataError(
                    f"broker {self.node_id} stays fenced: {beat.error.message or 'not caught up'}"
                )
            return self.broker_epoch

    def heartbeat_local_broker(self) -> HeartbeatReply:
        """Heartbeat this node's broker, as its lifecycle manager does every
        ``broker.heartbeat.interval.ms``. It has loaded everything committed (the loader
        publishes to it before a commit returns), so it reports the image's offset."""
        with self._lock:
            return self.heartbeat(
                HeartbeatRequest(self.node_id, self.broker_epoch, self.image.offset)
            )

    def register_broker(self, request: RegistrationRequest) -> RegistrationReply:
        """BrokerRegistration: the broker epoch (the offset of the committed record)."""
        with self._lock:
            reply = self._commit_result(
                self._cluster.register_broker(self._view(), request, self._runtime.clock())
            )
            registration = self.image.brokers.get(request.broker_id)
            if reply.error.ok and (
                registration is None or registration.epoch != reply.broker_epoch
            ):
                raise MetadataError(
                    f"broker {request.broker_id} was given epoch {reply.broker_epoch}, "
                    "which is not the offset of its registration"
                )
            return reply

    def heartbeat(self, request: HeartbeatRequest) -> HeartbeatReply:
        """BrokerHeartbeat: the broker's state after the records it caused commit."""
        with self._lock:
            return self._commit_result(
                self._cluster.heartbeat(self._view(), request, self._runtime.clock())
            )

    def unregister_broker(self, broker_id: int) -> ApiError:
        """UnregisterBroker."""
        with self._lock:
            return self._commit_result(self._cluster.unregister_broker(self._view(), broker_id))

    def tick(self, now: int) -> list[int]:
        """The active controller's timers: fence every broker not heard from for
        ``broker.session.timeout.ms``, one after the other (the ids fenced are returned),
        then, every ``leader.imbalance.check.interval.seconds`` with
        ``auto.leader.rebalance.enable``, move leaderships back to preferred replicas."""
        fenced: list[int] = []
        with self._lock:
            while True:
                result = self._cluster.fence_one_expired(self._view(), now)
                if result.response is None or self._commit_result(result) is None:
                    break
                _log.info(
                    "fenced broker %d: no heartbeat for broker.session.timeout.ms",
                    result.response,
                )
                fenced.append(result.response)
            self._maybe_rebalance(now)
        return fenced

    def _rebalance_interval_ms(self) -> int | None:
        if not self._config.get_bool("auto.leader.rebalance.enable"):
            return None
        return self._config.get_int("leader.imbalance.check.interval.seconds") * 1000

    def _maybe_rebalance(self, now: int) -> None:
        interval = self._rebalance_interval_ms()
        if interval is None or not self._cluster.active:
            self._rebalance_at = None
            return
        if self._rebalance_at is None:
            self._rebalance_at = now + interval
            return
        if now < self._rebalance_at:
            return
        self._rebalance_at = now + interval
        results = self._commit_result(elections.rebalance_leaders(self._view()))
        moved = [f"{r.topic}-{r.partition}" for r in results if r.error.ok]
        if moved:
            _log.info("preferred leaders elected again for %d partitions: %s", len(moved), moved)

    def next_deadline(self, now: int) -> int | None:
        """When :meth:`tick` may next have something to do (None: nothing to watch)."""
        with self._lock:
            deadlines = [self._cluster.next_deadline(self.image, now), self._rebalance_at]
            due = [d for d in deadlines if d is not None]
            return min(due) if due else None

    def create_topics(
        self, topics_: Sequence[NewTopic], *, validate_only: bool = False
    ) -> list[CreateTopicResult]:
        """CreateTopics: one result per requested topic, in request order."""
        with self._lock:
            view = self._view()
            return self._commit_result(
                topics.create_topics(view, topics_, validate_only=validate_only)
            )

    def auto_create_topic(self, name: str) -> CreateTopicResult:
        """Create ``name`` for a Metadata request that allows auto-creation (see
        :func:`~tidelog.metadata.controller.topics.auto_create_topic`)."""
        with self._lock:
            if self._quorum is not None and not self.is_active():
                # Kafka's brokers forward auto-creation to the active controller too.
                spec = topics.auto_create_spec(self._local_view(), name)
                if isinstance(spec, CreateTopicResult):
                    return spec
                quorum = self._quorum
            else:
                return self._commit_result(topics.auto_create_topic(self._view(), name))
        # Outside the lock: the answer comes from another node.
        return quorum.create_topic_at_active(spec)

    def delete_topics(
        self, names: Sequence[str] = (), topic_ids: Sequence[uuid.UUID] = ()
    ) -> list[DeleteTopicResult]:
        """DeleteTopics by name and/or id: results for names first, then ids."""
        with self._lock:
            return self._commit_result(topics.delete_topics(self._view(), names, topic_ids))

    def create_partitions(
        self, requests: Sequence[NewPartitions], *, validate_only: bool = False
    ) -> list[CreatePartitionsResult]:
        """CreatePartitions: one result per requested topic."""
        with self._lock:
            return self._commit_result(
                topics.create_partitions(self._view(), requests, validate_only=validate_only)
            )

    def alter_partition(self, request: AlterPartitionRequest) -> AlterPartitionReply:
        """AlterPartition: a leader's ISR change (see :mod:`.isr`)."""
        with self._lock:
            return self._commit_result(isr.alter_partition(self._view(), request))

    def elect_leaders(
        self, election_type: ElectionType, partitions: Sequence[tuple[str, int]] | None
    ) -> list[ElectionResult]:
        """ElectLeaders (see :mod:`.elections`); ``partitions`` None: all of them."""
        with self._lock:
            return self._commit_result(
                elections.elect_leaders(self._view(), election_type, partitions)
            )

    def alter_partition_reassignments(
        self, requests: Sequence[ReassignmentRequest], *, allow_replication_factor_change: bool
    ) -> list[ReassignmentResult]:
        """AlterPartitionReassignments (see :mod:`.reassignment`)."""
        with self._lock:
            return self._commit_result(
                reassignment.alter_partition_reassignments(
                    self._view(),
                    requests,
                    allow_replication_factor_change=allow_replication_factor_change,
                )
            )

    def list_partition_reassignments(
        self, topics_: Sequence[tuple[str, Sequence[int]]] | None
    ) -> list[OngoingReassignment]:
        """ListPartitionReassignments over the current image; reads only."""
        return reassignment.list_partition_reassignments(self.image, topics_)

    def alter_configs(
        self, resources: Sequence[AlterConfigsResource], *, validate_only: bool = False
    ) -> list[ConfigResourceResult]:
        """AlterConfigs: each resource's dynamic configs become exactly those given."""
        with self._lock:
            return self._commit_result(
                configs.alter_configs(self._view(), resources, validate_only=validate_only)
            )

    def incremental_alter_configs(
        self, resources: Sequence[IncrementalAlterConfigsResource], *, validate_only: bool = False
    ) -> list[ConfigResourceResult]:
        """IncrementalAlterConfigs: SET, DELETE, APPEND, SUBTRACT per key."""
        with self._lock:
            return self._commit_result(
                configs.incremental_alter_configs(
                    self._view(), resources, validate_only=validate_only
                )
            )

    def describe_configs(
        self,
        resources: Sequence[DescribeConfigsResource],
        *,
        include_synonyms: bool = False,
        include_documentation: bool = False,
    ) -> list[DescribeConfigsResult]:
        """DescribeConfigs over the current image (see :func:`describe_configs`); reads
        only, so without the lock."""
        return describe_configs(
            self._static,
            self.image,
            resources,
            include_synonyms=include_synonyms,
            include_documentation=include_documentation,
        )

    def allocate_producer_ids(
        self, broker_id: int, broker_epoch: int | None = None
    ) -> ProducerIdBlock:
        """AllocateProducerIds: the next block of ids, committed before it is handed out,
        so no id is ever given twice. ``broker_epoch`` None skips the epoch check (the
        co-located broker asking)."""
        with self._lock:
            if self._quorum is not None and broker_id == self.node_id and not self.is_active():
                # This node's own broker, while another node is the active controller.
                quorum = self._quorum
            else:
                return self._commit_result(
                    producer_ids.allocate_producer_ids(self._view(), broker_id, broker_epoch)
                )
        return quorum.producer_ids_at_active()

    def alter_user_scram_credentials(
        self, deletions: Sequence[ScramDeletion], upsertions: Sequence[ScramUpsertion]
    ) -> list[AlterScramResult]:
        """AlterUserScramCredentials: one result per user; each user's changes commit
        together."""
        with self._lock:
            return self._commit_result(
                scram.alter_user_scram_credentials(self._view(), deletions, upsertions)
            )

    def describe_user_scram_credentials(
        self, users: Sequence[str] | None
    ) -> list[DescribeScramResult]:
        """DescribeUserScramCredentials over the current image; reads only."""
        return scram.describe_user_scram_credentials(self.image, users)

    def alter_client_quotas(
        self, alterations: Sequence[QuotaAlteration], *, validate_only: bool
    ) -> list[AlterQuotaResult]:
        """AlterClientQuotas: one result per entry; each entry's changes commit together."""
        with self._lock:
            return self._commit_result(
                quotas.alter_client_quotas(self._view(), alterations, validate_only=validate_only)
            )

    def describe_client_quotas(
        self, components: Sequence[QuotaFilterComponent], *, strict: bool
    ) -> tuple[ApiError, list[tuple[QuotaEntity, Mapping[str, float]]]]:
        """DescribeClientQuotas over the current image; reads only."""
        return quotas.describe_client_quotas(self.image, components, strict=strict)

    def create_acls(self, bindings: Sequence[AclBinding]) -> list[ApiError]:
        """CreateAcls: one error (OK when created or already there) per binding."""
        with self._lock:
            return self._commit_result(acls.create_acls(self._view(), bindings))

    def delete_acls(self, filters: Sequence[AclBindingFilter]) -> list[AclDeleteResult]:
        """DeleteAcls: per filter, the ACLs it removed or its error."""
        with self._lock:
            return self._commit_result(acls.delete_acls(self._view(), filters))

    def describe_acls(self, acl_filter: AclBindingFilter) -> AclDescribeResult:
        """DescribeAcls over the current image; reads only."""
        return acls.describe_acls(self.image, acl_filter)
