"""DescribeLogDirs: the log dirs of this broker and the partitions each one holds.

One result per configured log dir (its absolute path, as Kafka reports it), listing the
partitions that live in it: size (the bytes of all its segments), offset lag 0 (there are
no future replicas being moved between dirs, so ``is_future_key`` is false too). ``topics``
null means every partition; otherwise only the listed partitions that exist here (unknown
ones are left out, as in Kafka). From v4 each dir carries its file system's total and
usable bytes (``statvfs``: all blocks, and the blocks available to unprivileged users); a
dir that cannot be examined gets KAFKA_STORAGE_ERROR and -1 for both. A dir taken offline
after an I/O error (:mod:`tidelog.storage.manager`) gets KAFKA_STORAGE_ERROR, -1 for both and
no partitions, as in Kafka. v5's ``is_cordoned``
is always false: Tidelog does not cordon log dirs.
"""

from __future__ import annotations

import os
from typing import Any

from tidelog.broker.authorization import access
from tidelog.broker.connection import RequestContext
from tidelog.broker.handlers.registry import handles
from tidelog.broker.handlers.schema import ZERO_THROTTLE, make, response_module
from tidelog.metadata.acls import AclOperation
from tidelog.protocol import ApiKey, ErrorCode


def _wanted(request: Any) -> dict[str, set[int]] | None:
    if request.topics is None:
        return None
    wanted: dict[str, set[int]] = {}
    for topic in request.topics:
        wanted.setdefault(topic.topic, set()).update(int(p) for p in topic.partitions)
    return wanted


def disk_space(path: str) -> tuple[int, int]:
    """(total, usable) bytes of the file system holding ``path``."""
    stats = os.statvfs(path)
    return stats.f_blocks * stats.f_frsize, stats.f_bavail * stats.f_frsize


@handles(ApiKey.DESCRIBE_LOG_DIRS)
async def handle_describe_log_dirs(ctx: RequestContext, request: Any) -> object:
    module = response_module("describe_log_dirs", ctx.api_version)
    denied = access(ctx).cluster_error(AclOperation.DESCRIBE)
    if denied is not None:
        return make(
            module.DescribeLogDirsResponse,
            throttle_time=ZERO_THROTTLE,
            error_code=denied.to_kio(),
            results=(),
        )
    partitions = ctx.broker.partitions
    wanted = _wanted(request)
    # log dir -> topic -> [(partition, size)]
    by_dir: dict[str, dict[str, list[tuple[int, int]]]] = {}
    for partition in partitions:
        if partition.offline:
            continue
        if wanted is not None and partition.index not in wanted.get(partition.topic, ()):
            continue
        log = partition.log
        log_dir = os.path.abspath(log.directory.parent)
        by_dir.setdefault(log_dir, {}).setdefault(partition.topic, []).append(
            (partition.index, log.size_in_bytes)
        )
    results = []
    offline_dirs = partitions.logs.offline_dirs
    for directory in partitions.logs.log_dirs:
        log_dir = os.path.abspath(directory)
        if directory in offline_dirs:
            error, total, usable = ErrorCode.KAFKA_STORAGE_ERROR, -1, -1
        else:
            error = ErrorCode.NONE
            try:
                total, usable = disk_space(log_dir)
            except OSError:
                error, total, usable = ErrorCode.KAFKA_STORAGE_ERROR, -1, -1
        topics = tuple(
            module.DescribeLogDirsTopic(
                name=topic,
                partitions=tuple(
                    module.DescribeLogDirsPartition(
                        partition_index=index,
                        partition_size=size,
                        offset_lag=0,
                        is_future_key=False,
                    )
                    for index, size in sorted(held)
                ),
            )
            for topic, held in sorted(by_dir.get(log_dir, {}).items())
        )
        results.append(
            make(
                module.DescribeLogDirsResult,
                error_code=error.to_kio(),
                log_dir=log_dir,
                topics=topics,
                total_bytes=total,
                usable_bytes=usable,
                is_cordoned=False,
            )
        )
    return make(
        module.DescribeLogDirsResponse,
        throttle_time=ZERO_THROTTLE,
        error_code=ErrorCode.NONE.to_kio(),
        results=tuple(results),
    )
