"""Build a node's metadata side from a config and a runtime: log, loader, controller.

:func:`build_metadata_node` is the one way to make it, for the server
(:mod:`tidelog.broker.app`), the tests, and later the simulation, which gives it a fake
clock, a seeded random source and a disk that forgets unsynced writes through the
:class:`~tidelog.runtime.system.Runtime`:

1. check (or write, on the first start) ``meta.properties`` in every log dir;
2. open the metadata log (storage recovery drops a torn tail) and replay it through the
   :class:`~tidelog.metadata.loader.MetadataLoader` (no publisher yet: whoever
   subscribes next starts from the replayed image);
3. make the :class:`~tidelog.metadata.controller.Controller`; on the first start (an
   empty log) commit the records ``storage format`` left in ``bootstrap.checkpoint``
   (SCRAM credentials), then register this node.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tidelog.metadata.bootstrap import read_bootstrap
from tidelog.metadata.configs import BrokerConfig
from tidelog.metadata.controller import Controller
from tidelog.metadata.image import MetadataImage
from tidelog.metadata.loader import MetadataLoader
from tidelog.metadata.log import MetadataBatch, MetadataLog
from tidelog.metadata.meta_properties import ensure_meta_properties
from tidelog.metadata.quorum_state import FileQuorumStateStore
from tidelog.metadata.raft import Entry
from tidelog.metadata.raft_log import FileRaftLog
from tidelog.metadata.records import decode_record
from tidelog.runtime.system import Runtime

__all__ = ["MetadataNode", "build_metadata_node", "entry_batch", "load_entries"]


@dataclass(frozen=True)
class MetadataNode:
    """The metadata parts of one node, built together and closed together."""

    config: BrokerConfig
    runtime: Runtime
    log: MetadataLog
    loader: MetadataLoader
    controller: Controller
    #: A quorum voter's Raft log (over the same ``__cluster_metadata-0`` as ``log``) and
    #: quorum-state file; None on a single node.
    raft_log: FileRaftLog | None = None
    quorum_state: FileQuorumStateStore | None = None

    def close(self) -> None:
        self.controller.close()


def entry_batch(entry: Entry) -> MetadataBatch:
    """A committed Raft entry as the loader takes it."""
    if entry.control:
        return MetadataBatch(entry.offset, entry.end_offset - 1, entry.epoch, (), True)
    records = tuple(
        (entry.offset + i, decode_record(value)) for i, value in enumerate(entry.records)
    )
    return MetadataBatch(entry.offset, entry.end_offset - 1, entry.epoch, records)


def load_entries(loader: MetadataLoader, entries: Iterable[Entry]) -> None:
    """Apply committed Raft entries to ``loader``, in order."""
    for entry in entries:
        loader.load(entry_batch(entry))


def build_metadata_node(config: BrokerConfig, runtime: Runtime) -> MetadataNode:
    """Check meta.properties, replay the metadata log, register this node; on a voter of a
    quorum (``controller.quorum.voters``), open its Raft log instead (see
    :func:`_build_quorum_voter`)."""
    dirs = [*config.log_dirs, config.metadata_log_dir]
    cluster_id = ensure_meta_properties(
        dirs,
        node_id=config.node_id,
        cluster_id=config.cluster_id,
        fsync=runtime.fsync,
        source=runtime.random,
    )
    if config.quorum_mode:
        return _build_quorum_voter(config, runtime, cluster_id)
    log = MetadataLog.open(config.metadata_log_dir, clock=runtime.clock, fsync=runtime.fsync)
    try:
        loader = MetadataLoader(MetadataImage.empty(cluster_id))
        loader.replay(log.batches())
        controller = Controller(config, log, loader, runtime)
        if loader.image.offset < 0:
            bootstrap = read_bootstrap(config.metadata_log_dir)
            if bootstrap:
                controller.commit_bootstrap(bootstrap)
        controller.register_local_broker()
    except BaseException:
        log.close()
        raise
    return MetadataNode(config, runtime, log, loader, controller)


def _build_quorum_voter(config: BrokerConfig, runtime: Runtime, cluster_id: str) -> MetadataNode:
    """A voter of a metadata quorum: the Raft log and quorum-state file, an empty image
    (the loader is fed by the quorum's driver, committed entries only, from the latest
    snapshot on) and a controller that commits through the quorum once it is given one.
    Its broker registers over the wire once a leader is known (the broker's side)."""
    raft_log = FileRaftLog.open(config.metadata_log_dir, clock=runtime.clock, fsync=runtime.fsync)
    try:
        store = FileQuorumStateStore.open(
            config.metadata_log_dir,
            config.quorum_voters,
            cluster_id=cluster_id,
            fsync=runtime.fsync,
        )
        loader = MetadataLoader(MetadataImage.empty(cluster_id))
        controller = Controller(config, raft_log.metadata_log, loader, runtime)
    except BaseException:
        raft_log.close()
        raise
    return MetadataNode(config, runtime, raft_log.metadata_log, loader, controller, raft_log, store)
