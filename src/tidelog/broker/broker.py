"""The broker: the services API handlers share, kept in step with the metadata image.

Handlers reach everything through ``ctx.broker`` (a :class:`Broker`):

* ``partitions`` — the partitions this node leads (:class:`~tidelog.broker.partitions.Partitions`);
* ``controller`` — the metadata controller (topics, configs, producer ids); its operations
  block on fsync, so handlers call them through :meth:`Broker.run_blocking`;
* ``image`` — the current metadata image; ``config`` — the broker configuration with its
  dynamic values applied (Kafka's names);
* ``clock()`` — milliseconds, the only source of time for handlers;
* ``node_id``, ``cluster_id``; ``endpoint(listener)`` — the address clients are given for
  this node on a listener (``advertised_host``/``advertised_port`` are the first one's);
* ``advertised_versions`` — the version table ApiVersions answers with;
  ``listener_versions`` — the table of a listener that serves other APIs (a controller
  listener), by listener name;
* ``groups`` — the group coordinator's driver (:mod:`tidelog.broker.groups`);
* ``transactions`` — the transaction coordinator's driver (:mod:`tidelog.broker.transactions`);
* ``transaction_verifier`` — asked before a transactional batch starts a transaction on a
  partition (:class:`~tidelog.broker.produce_validation.TransactionVerifier`); the
  transaction coordinator replaces the default, which refuses them all;
* ``authorizer`` — the ACL decision over the image's ACLs
  (:class:`~tidelog.security.authorizer.Authorizer`), rebuilt when they change; None when
  ``authorizer.class.name`` is empty (no authorization).

Every metadata change reaches :meth:`Broker.apply_metadata` on the event loop thread, in
the order the changes were committed, *before* the handler that caused it resumes: the
controller's commit path hands each committed batch to the metadata loader, which calls
its publishers before the operation returns, and the broker's publisher queues the
application on the loop ahead of the operation's own completion. So a CreateTopics
response is never sent before the topic's partitions exist.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from tidelog.broker.partitions import Partition, Partitions
from tidelog.broker.produce_validation import RefuseTransactions, TransactionVerifier
from tidelog.metadata.configs import BrokerConfig, topic_log_config
from tidelog.metadata.controller import Controller
from tidelog.metadata.image import MetadataDelta, MetadataImage
from tidelog.protocol import SUPPORTED_VERSIONS, ApiKey, ErrorCode, VersionRange
from tidelog.security.authorizer import Authorizer, configured_authorizer
from tidelog.storage import LogConfig

if TYPE_CHECKING:
    from tidelog.broker.groups import GroupDriver
    from tidelog.broker.metrics import BrokerMetrics
    from tidelog.broker.quotas import ClientQuotaManager
    from tidelog.broker.request_log import SlowRequestLog
    from tidelog.broker.transactions import TransactionDriver

_log = logging.getLogger(__name__)

T = TypeVar("T")


class ProducerIdsExhausted(Exception):
    """The controller could not hand out a producer id block; carries the error code."""

    def __init__(self, code: ErrorCode, message: str | None) -> None:
        super().__init__(message or code.name)
        self.code = code


class Broker:
    """Shared state of one broker process. Built and started by :mod:`tidelog.broker.app`."""

    def __init__(
        self,
        *,
        node_id: int,
        partitions: Partitions,
        clock: Callable[[], int],
        controller: Controller | None = None,
    ) -> None:
        self.node_id = node_id
        self.partitions = partitions
        self.clock = clock
        self.controller = controller
        self.cluster_id = controller.image.cluster_id if controller is not None else ""
        self.advertised_host = "127.0.0.1"
        self.advertised_port = 9092
        #: listener name -> (host, port) given to clients who connected on that listener;
        #: a listener not in it (a controller listener) gets the first one's address.
        self.listener_endpoints: dict[str, tuple[str, int]] = {}
        self.advertised_versions: Mapping[ApiKey, VersionRange] = SUPPORTED_VERSIONS
        self.listener_versions: dict[str, Mapping[ApiKey, VersionRange]] = {}
        self._next_producer_id = 0
        self._producer_id_end = 0
        #: Set at shutdown: waits (fetch long polls) end at once with what there is.
        self.stopping = False
        #: the group coordinator's driver, set by the app (None: group APIs unavailable)
        self.groups: GroupDriver | None = None
        #: the transaction coordinator's driver, set by the app (None: transactions
        #: unavailable)
        self.transactions: TransactionDriver | None = None
        #: the counters of ``metrics.listener``, set by the app (None: metrics are off)
        self.metrics: BrokerMetrics | None = None
        #: KIP-890 verification of transactional produce (the transaction coordinator's)
        self.transaction_verifier: TransactionVerifier = RefuseTransactions()
        #: ``slow.request.threshold.ms``'s log, set by the app (None: off)
        self.slow_request_log: SlowRequestLog | None = None
        #: the ACL decision, kept in step with the image by apply_metadata (None: off)
        self.authorizer: Authorizer | None = None
        #: byte-rate quota enforcement, set by the app (None: quotas are not enforced)
        self.quotas: ClientQuotaManager | None = None

    # -- metadata ------------------------------------------------------------------------

    @property
    def image(self) -> MetadataImage:
        assert self.controller is not None, "broker built without a controller"
        return self.controller.image

    @property
    def config(self) -> BrokerConfig:
        assert self.controller is not None, "broker built without a controller"
        return self.controller.config

    def endpoint(self, listener: str) -> tuple[str, int]:
        """(host, port) of this node for clients that connected on ``listener``."""
        return self.listener_endpoints.get(listener, (self.advertised_host, self.advertised_port))

    def topic_name_of(self, topic_id: uuid.UUID) -> str | None:
        topic = self.image.topic_by_id(topic_id)
        return topic.name if topic is not None else None

    def topic_id_of(self, topic: str) -> uuid.UUID | None:
        found = self.image.topic(topic)
        return found.topic_id if found is not None else None

    def log_config_of(self, topic: str) -> LogConfig:
        return topic_log_config(self.config, self.image.topic_config(topic))

    async def run_blocking(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking call (controller operation, fsync) in a worker thread."""
        return await asyncio.to_thread(fn, *args, **kwargs)

    def apply_metadata(self, image: MetadataImage, delta: MetadataDelta | None) -> None:
        """Make the partitions match ``image``: create, delete, reconfigure.

        ``delta`` None means "check everything" (at start, after replaying the log): also
        removes partitions of topics the image no longer has, e.g. deleted while this
        broker was down.
        """
        if delta is None or delta.changed_acls:
            # Built whole from the image: ACL changes are rare, decisions are per request.
            self.authorizer = configured_authorizer(self.config, image.acls.values())
        if delta is None:
            wanted = set(image.topics_by_name)
            for stale in {p.topic for p in self.partitions} - wanted:
                _log.info("removing the logs of %s, which the metadata no longer has", stale)
                self.partitions.remove_topic(stale)
            for name in sorted(wanted):
                self._ensure_topic(image, name)
            return
        for deleted in delta.deleted_topics:
            self.partitions.remove_topic(deleted.name)
        for name, _ in delta.created_partitions:
            self._ensure_topic(image, name)
        for name, _ in delta.changed_partitions:
            self._ensure_topic(image, name)
        if delta.changed_broker_configs:
            reconfigure = set(image.topics_by_name)
            expiration_ms = self.config.producer_id_expiration_ms
            for partition in self.partitions:
                partition.set_producer_id_expiration_ms(expiration_ms)
        else:
            reconfigure = set(delta.changed_topic_configs)
        for name in sorted(reconfigure):
            config = topic_log_config(self.config, image.topic_config(name))
            for partition in self.partitions.of_topic(name):
                partition.log.update_config(config)

    def _ensure_topic(self, image: MetadataImage, name: str) -> list[Partition]:
        topic = image.topic(name)
        if topic is None:
            return []
        config = topic_log_config(self.config, image.topic_config(name))
        ensured = []
        for index, part in sorted(topic.partitions.items()):
            if part.leader != self.node_id:
                continue
            ensured.append(
                self.partitions.ensure(
                    name,
                    index,
                    config=config,
                    topic_id=topic.topic_id,
                    leader_epoch=part.leader_epoch,
                    producer_id_expiration_ms=self.config.producer_id_expiration_ms,
                )
            )
        return ensured

    def begin_stopping(self) -> None:
        """End every wait now: long polls answer with what they have."""
        self.stopping = True
        for partition in self.partitions:
            partition.wake_waiters()

    # -- producer ids --------------------------------------------------------------------

    async def allocate_producer_id(self) -> int:
        """A producer id never handed out before (blocks come from the controller)."""
        if self._next_producer_id >= self._producer_id_end:
            assert self.controller is not None, "broker built without a controller"
            block = await self.run_blocking(self.controller.allocate_producer_ids, self.node_id)
            if not block.error.ok:
                raise ProducerIdsExhausted(block.error.code, block.error.message)
            self._next_producer_id = block.first_producer_id
            self._producer_id_end = block.first_producer_id + block.length
        producer_id = self._next_producer_id
        self._next_producer_id += 1
        return producer_id
