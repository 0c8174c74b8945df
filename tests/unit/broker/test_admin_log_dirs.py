"""DescribeLogDirs handler: dirs, the partitions in each, sizes, disk space."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tidelog.protocol import ApiKey, ErrorCode

from .admin_fixtures import call, create_topic, edge_versions, schema, versions
from .conftest import make_batch, produce_request


def describe_log_dirs(broker: Any, version: int, topics: dict[str, list[int]] | None) -> Any:
    module = schema("describe_log_dirs", version)
    request = module.DescribeLogDirsRequest(
        topics=None
        if topics is None
        else tuple(
            module.DescribableLogDirTopic(topic=name, partitions=tuple(parts))
            for name, parts in topics.items()
        )
    )
    return call(broker, ApiKey.DESCRIBE_LOG_DIRS, version, request)


def held(result: Any) -> dict[tuple[str, int], Any]:
    return {(t.name, p.partition_index): p for t in result.topics for p in t.partitions}


@pytest.mark.parametrize("version", versions(ApiKey.DESCRIBE_LOG_DIRS))
def test_describe_log_dirs_every_version(admin_broker: Any, tmp_path: Path, version: int) -> None:
    create_topic(admin_broker, "a", partitions=2)
    create_topic(admin_broker, "b")
    request = produce_request(9, {"a": {1: make_batch([b"x" * 100])}}, acks=1)
    assert call(admin_broker, ApiKey.PRODUCE, 9, request).responses[0].partition_responses[0]
    response = describe_log_dirs(admin_broker, version, None)
    if version >= 3:
        assert response.error_code == 0
    (result,) = response.results
    assert result.error_code == 0
    assert result.log_dir == os.path.abspath(tmp_path / "data")
    partitions = held(result)
    assert sorted(partitions) == [("a", 0), ("a", 1), ("b", 0)]
    assert partitions[("a", 0)].partition_size == 0
    assert (
        partitions[("a", 1)].partition_size == admin_broker.partitions.get("a", 1).log.size_in_bytes
    )
    assert partitions[("a", 1)].partition_size > 100
    assert all(p.offset_lag == 0 and p.is_future_key is False for p in partitions.values())
    if version >= 4:
        stats = os.statvfs(tmp_path)
        assert result.total_bytes == stats.f_blocks * stats.f_frsize
        assert 0 <= result.usable_bytes <= result.total_bytes
    if version >= 5:
        assert result.is_cordoned is False


@pytest.mark.parametrize("version", edge_versions(ApiKey.DESCRIBE_LOG_DIRS))
def test_describe_log_dirs_filters_topics(admin_broker: Any, version: int) -> None:
    create_topic(admin_broker, "a", partitions=3)
    create_topic(admin_broker, "b")
    response = describe_log_dirs(admin_broker, version, {"a": [2, 0, 9], "missing": [0]})
    assert sorted(held(response.results[0])) == [("a", 0), ("a", 2)]
    none = describe_log_dirs(admin_broker, version, {})
    assert none.results[0].topics == ()


def test_describe_log_dirs_reports_each_dir(start_admin_broker: Any, tmp_path: Path) -> None:
    dirs = [tmp_path / "d1", tmp_path / "d2"]
    broker = start_admin_broker({"log.dirs": ",".join(str(d) for d in dirs)})
    create_topic(broker, "spread", partitions=4)
    results = describe_log_dirs(broker, 5, None).results
    assert [r.log_dir for r in results] == [os.path.abspath(d) for d in dirs]
    seen: list[tuple[str, int]] = []
    for result in results:
        for key in held(result):
            log_dir = broker.partitions.get(*key).log.directory.parent
            assert os.path.abspath(log_dir) == result.log_dir
            seen.append(key)
    assert sorted(seen) == [("spread", i) for i in range(4)]


def test_describe_log_dirs_unreadable_dir_is_a_storage_error(
    admin_broker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tidelog.broker.handlers import log_dirs

    def broken(path: str) -> tuple[int, int]:
        raise OSError("disk gone")

    monkeypatch.setattr(log_dirs, "disk_space", broken)
    (result,) = describe_log_dirs(admin_broker, 4, None).results
    assert result.error_code == ErrorCode.KAFKA_STORAGE_ERROR
    assert (result.total_bytes, result.usable_bytes) == (-1, -1)
