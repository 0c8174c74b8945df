"""Format a node's directories before its first start, as ``kafka-storage format`` does.

:func:`format_storage` writes ``meta.properties`` (cluster id, node id, a directory id)
into every log dir and the metadata log dir of a configuration. It owns the dirs while it
works, through the same ``.lock`` files a running broker holds
(:func:`~tidelog.storage.lock_log_dirs`), so it cannot format data a broker is using,
and a broker cannot start on dirs half formatted.

Besides ``meta.properties``, ``--add-scram`` credentials go into ``bootstrap.checkpoint``
in the metadata log dir (:mod:`~tidelog.metadata.bootstrap`), which the first start
commits. Kafka's bootstrap snapshot also holds its feature levels (``metadata.version``...),
and with ``--standalone`` / ``--initial-controllers`` the voters of a dynamic quorum
(KIP-853). Tidelog has no feature levels yet and formats a static quorum only.
A node started on unformatted dirs still formats them itself (:func:`~tidelog.metadata.
meta_properties.ensure_meta_properties`), so a single node needs no format step.
"""

from __future__ import annotations

from collections.abc import Sequence

from tidelog.metadata.bootstrap import write_bootstrap
from tidelog.metadata.configs import BrokerConfig
from tidelog.metadata.errors import MetaPropertiesError
from tidelog.metadata.meta_properties import (
    META_PROPERTIES,
    FormatResult,
    check_cluster_id,
    format_dirs,
)
from tidelog.metadata.records import MetadataRecord
from tidelog.runtime.system import Runtime
from tidelog.storage import lock_log_dirs

__all__ = ["format_storage"]


def format_storage(
    config: BrokerConfig,
    cluster_id: str,
    runtime: Runtime,
    *,
    ignore_formatted: bool = False,
    bootstrap: Sequence[MetadataRecord] = (),
) -> FormatResult:
    """Format ``config``'s log dirs and metadata log dir with ``cluster_id``.

    Raises :class:`~tidelog.metadata.errors.MetaPropertiesError` (invalid id, a dir
    already formatted, an id other than the configured ``cluster.id``),
    :class:`~tidelog.runtime.filelock.LockHeldError` (a broker runs on a dir) or the
    OSError of a dir that cannot be written; nothing is written then.
    """
    check_cluster_id(cluster_id)
    if config.cluster_id is not None and config.cluster_id != cluster_id:
        raise MetaPropertiesError(
            f"cluster.id is {config.cluster_id} in the configuration, but --cluster-id is "
            f"{cluster_id}; give the same id, or remove cluster.id from the configuration"
        )
    dirs = [*config.log_dirs, config.metadata_log_dir]
    locks = lock_log_dirs(dirs)
    try:
        if bootstrap and (config.metadata_log_dir / META_PROPERTIES).exists():
            raise MetaPropertiesError(
                f"metadata.log.dir {config.metadata_log_dir} is already formatted: "
                "--add-scram applies to a new cluster only; on a running one use "
                "tidelog configs alter --entity-type users"
            )
        result = format_dirs(
            dirs,
            cluster_id=cluster_id,
            node_id=config.node_id,
            ignore_formatted=ignore_formatted,
            fsync=runtime.fsync,
            source=runtime.random,
        )
        if bootstrap:
            write_bootstrap(config.metadata_log_dir, bootstrap, runtime.clock(), runtime.fsync)
        return result
    finally:
        for lock in locks:
            lock.release()
