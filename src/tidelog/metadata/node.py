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

from dataclasses import dataclass

from tidelog.metadata.bootstrap import read_bootstrap
from tidelog.metadata.configs import BrokerConfig
from tidelog.metadata.controller import Controller
from tidelog.metadata.image import MetadataImage
from tidelog.metadata.loader import MetadataLoader
from tidelog.metadata.log import MetadataLog
from tidelog.metadata.meta_properties import ensure_meta_properties
from tidelog.runtime.system import Runtime

__all__ = ["MetadataNode", "build_metadata_node"]


@dataclass(frozen=True)
class MetadataNode:
    """The metadata parts of one node, built together and closed together."""

    config: BrokerConfig
    runtime: Runtime
    log: MetadataLog
    loader: MetadataLoader
    controller: Controller

    def close(self) -> None:
        self.controller.close()


def build_metadata_node(config: BrokerConfig, runtime: Runtime) -> MetadataNode:
    """Check meta.properties, replay the metadata log, register this node."""
    dirs = [*config.log_dirs, config.metadata_log_dir]
    cluster_id = ensure_meta_properties(
        dirs,
        node_id=config.node_id,
        cluster_id=config.cluster_id,
        fsync=runtime.fsync,
        source=runtime.random,
    )
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
