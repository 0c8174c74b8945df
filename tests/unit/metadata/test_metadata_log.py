"""The metadata log: durable appends, replay, torn tails, meta.properties."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from metadata_helpers import FakeClock, FsyncCounter

from tidelog.metadata.errors import MetadataRecordError, MetaPropertiesError
from tidelog.metadata.image import MetadataImage
from tidelog.metadata.log import MetadataLog
from tidelog.metadata.meta_properties import (
    META_PROPERTIES,
    MetaProperties,
    ensure_meta_properties,
    generate_cluster_id,
    read_meta_properties,
    write_meta_properties,
)
from tidelog.metadata.records import (
    ConfigRecord,
    MetadataRecord,
    PartitionRecord,
    TopicRecord,
)
from tidelog.records.builder import BatchBuilder


def topic_records(name: str, topic_id: uuid.UUID) -> list[MetadataRecord]:
    return [TopicRecord(name, topic_id), PartitionRecord(topic_id, 0, (1,), (1,), 1)]


def test_append_is_fsynced_and_replays(tmp_path: Path, clock: FakeClock) -> None:
    fsync = FsyncCounter()
    log = MetadataLog.open(tmp_path, clock=clock, fsync=fsync)
    assert log.directory == tmp_path / "__cluster_metadata-0"
    before = fsync.calls
    first = log.append(topic_records("a", uuid.UUID(int=5)))
    assert first == 0 and log.end_offset == 2
    assert fsync.calls > before
    assert log.append([ConfigRecord(2, "a", "retention.ms", "1")]) == 2
    batches = list(log.read_batches())
    assert [[offset for offset, _ in batch] for batch in batches] == [[0, 1], [2]]
    image = log.replay(MetadataImage.empty())
    assert image.offset == 2 and image.topic_config("a") == {"retention.ms": "1"}
    log.close()

    reopened = MetadataLog.open(tmp_path, clock=clock)
    assert reopened.replay(MetadataImage.empty()) == image
    # Reading from inside a batch skips the records before the start offset.
    assert [[o for o, _ in b] for b in reopened.read_batches(1)] == [[1], [2]]
    reopened.close()


def test_many_batches_replay_across_reads(tmp_path: Path, clock: FakeClock) -> None:
    log = MetadataLog.open(tmp_path, clock=clock)
    big = "x" * 200_000
    for i in range(12):
        log.append([ConfigRecord(4, "", f"key{i}", big)])
    image = log.replay(MetadataImage.empty())
    assert len(image.broker_config("")) == 12 and image.offset == 11
    log.close()


def test_torn_tail_is_dropped_on_open(tmp_path: Path, clock: FakeClock) -> None:
    log = MetadataLog.open(tmp_path, clock=clock)
    log.append(topic_records("a", uuid.UUID(int=5)))
    log.append(topic_records("b", uuid.UUID(int=6)))
    segment = log.directory / "00000000000000000000.log"
    log.close()
    size = segment.stat().st_size
    with open(segment, "r+b") as file:
        file.truncate(size - 7)
    reopened = MetadataLog.open(tmp_path, clock=clock)
    assert reopened.recovery_report.bytes_dropped > 0
    image = reopened.replay(MetadataImage.empty())
    # The torn batch goes whole: no topic b, not even without its partition.
    assert image.topic("a") is not None and image.topic("b") is None
    assert reopened.end_offset == 2
    assert reopened.append(topic_records("b", uuid.UUID(int=6))) == 2
    reopened.close()


def test_undecodable_record_in_log_raises_record_error(tmp_path: Path, clock: FakeClock) -> None:
    log = MetadataLog.open(tmp_path, clock=clock)
    builder = BatchBuilder()
    builder.append(None, b"\x02\x00not json", timestamp=0)
    log._log.append(builder.close(), durable=True)
    with pytest.raises(MetadataRecordError):
        log.replay(MetadataImage.empty())
    log.close()


def test_build_batch_needs_records() -> None:
    with pytest.raises(ValueError):
        MetadataLog.build_batch([], 0)


# -- meta.properties ---------------------------------------------------------------------------


def test_meta_properties_written_then_checked(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    cluster_id = ensure_meta_properties(dirs, node_id=1, cluster_id=None)
    assert len(cluster_id) == 22
    for directory in dirs:
        props = read_meta_properties(directory)
        assert props is not None and props.cluster_id == cluster_id and props.node_id == 1
        assert props.directory_id is not None
    assert ensure_meta_properties(dirs, node_id=1, cluster_id=None) == cluster_id
    assert ensure_meta_properties(dirs, node_id=1, cluster_id=cluster_id) == cluster_id
    # A new dir joins with the existing cluster id.
    new = tmp_path / "c"
    assert ensure_meta_properties([*dirs, new], node_id=1, cluster_id=None) == cluster_id
    assert read_meta_properties(new) == MetaProperties(
        cluster_id,
        1,
        read_meta_properties(new).directory_id,  # type: ignore[union-attr]
    )
    with pytest.raises(MetaPropertiesError, match="node"):
        ensure_meta_properties(dirs, node_id=2, cluster_id=None)
    with pytest.raises(MetaPropertiesError, match=r"cluster\.id"):
        ensure_meta_properties(dirs, node_id=1, cluster_id="someOtherCluster")


def test_meta_properties_configured_cluster_id(tmp_path: Path) -> None:
    assert ensure_meta_properties([tmp_path], node_id=3, cluster_id="myCluster") == "myCluster"
    assert read_meta_properties(tmp_path) == MetaProperties(
        "myCluster",
        3,
        read_meta_properties(tmp_path).directory_id,  # type: ignore[union-attr]
    )


def test_meta_properties_dirs_disagree(tmp_path: Path) -> None:
    write_meta_properties(tmp_path / "a", MetaProperties("one", 1))
    write_meta_properties(tmp_path / "b", MetaProperties("two", 1))
    with pytest.raises(MetaPropertiesError, match="two"):
        ensure_meta_properties([tmp_path / "a", tmp_path / "b"], node_id=1, cluster_id=None)


@pytest.mark.parametrize(
    "text",
    [
        b"node.id=1\n",
        b"cluster.id=x\nnode.id=abc\n",
        b"cluster.id=x\nnode.id=1\nversion=0\n",
        b"\xff",
    ],
)
def test_bad_meta_properties(tmp_path: Path, text: bytes) -> None:
    (tmp_path / META_PROPERTIES).write_bytes(text)
    with pytest.raises(MetaPropertiesError):
        read_meta_properties(tmp_path)


def test_generated_cluster_ids_differ() -> None:
    ids = {generate_cluster_id() for _ in range(50)}
    assert len(ids) == 50 and not any(i.startswith("-") for i in ids)
    assert all(os.sep not in i and len(i) == 22 for i in ids)
