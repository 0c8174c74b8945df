"""The loader starting from a snapshot: the image replaced whole, publishers told that
everything changed, the log's batches continuing from the snapshot's end; and on disk,
a FileRaftLog reopened from its snapshot plus tail gives the image a full replay gives."""

from __future__ import annotations

import dataclasses
import random
import uuid
from pathlib import Path

import pytest
from test_image_snapshot import RandomHistory, random_image

from tidelog.metadata.errors import MetadataReplayError
from tidelog.metadata.image import TOPIC_RESOURCE, MetadataDelta, MetadataImage
from tidelog.metadata.image_records import snapshot_records
from tidelog.metadata.loader import MetadataLoader
from tidelog.metadata.log import MetadataBatch
from tidelog.metadata.raft.batches import decode_snapshot, encode_snapshot
from tidelog.metadata.raft.messages import Entry, OffsetAndEpoch
from tidelog.metadata.raft_log import FileRaftLog
from tidelog.metadata.records import (
    ConfigRecord,
    FeatureLevelRecord,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RemoveTopicRecord,
    TopicRecord,
    encode_record,
)

A, B, C = (uuid.UUID(int=n) for n in (1, 2, 3))


def topic(name: str, topic_id: uuid.UUID, partitions: int) -> list[MetadataRecord]:
    return [
        TopicRecord(name, topic_id),
        *(PartitionRecord(topic_id, p, (1,), (1,), 1) for p in range(partitions)),
    ]


def loaded(records: list[MetadataRecord], epoch: int = 1) -> MetadataLoader:
    loader = MetadataLoader(MetadataImage.empty("cid"))
    entries = tuple(enumerate(records))
    loader.load(MetadataBatch(0, len(records) - 1, epoch, entries))
    return loader


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[MetadataImage, MetadataDelta]] = []

    def __call__(self, image: MetadataImage, delta: MetadataDelta) -> None:
        self.calls.append((image, delta))


def test_a_fresh_loader_starts_from_a_snapshot_then_continues_with_the_log() -> None:
    source, _ = random_image(5, 150)
    snapshot = snapshot_records(source)
    loader = MetadataLoader(MetadataImage.empty("cluster-x"))
    seen = Recorder()
    loader.add_publisher(seen)
    end = source.offset + 1
    delta = loader.load_snapshot(end, source.epoch, snapshot)
    assert loader.image == source
    assert (loader.image.offset, loader.image.epoch) == (end - 1, source.epoch)
    # Told once, with the whole image as new.
    assert seen.calls == [(source, delta)]
    assert {t.topic_id for t in delta.created_topics} == set(source.topics_by_id)
    assert not delta.deleted_topics and not delta.changed_partitions
    assert len(delta.created_partitions) == sum(
        t.num_partitions for t in source.topics_by_id.values()
    )
    assert set(delta.registered_brokers) == set(source.brokers)
    assert delta.changed_topic_configs == {n for n in source.topic_configs if source.topic(n)}
    assert delta.changed_broker_configs == set(source.broker_configs)
    assert delta.producer_ids_changed and delta.features_changed
    assert delta.changed_scram_users == {user for user, _ in source.scram_credentials}

    # The log carries on at the snapshot's end, in the snapshot's epoch or later.
    batch = MetadataBatch(end, end, source.epoch + 1, ((end, TopicRecord("after", C)),))
    later = loader.load(batch)
    assert later is not None and [t.name for t in later.created_topics] == ["after"]
    assert loader.image.offset == end and loader.image.topic("after") is not None
    # A batch from before the snapshot's end no longer applies.
    with pytest.raises(MetadataReplayError):
        loader.load(
            MetadataBatch(end - 1, end - 1, source.epoch + 1, ((end - 1, TopicRecord("x", A)),))
        )


def test_a_lagging_loader_is_told_what_the_snapshot_deleted_and_changed() -> None:
    loader = loaded(
        [
            *topic("kept", A, 2),
            *topic("gone", B, 1),
            ConfigRecord(TOPIC_RESOURCE, "kept", "retention.ms", "1"),
        ]
    )
    seen = Recorder()
    loader.add_publisher(seen)
    old = loader.image
    # Meanwhile the leader deleted "gone", grew and moved "kept", created "new".
    leader_image, _ = old.apply(
        [
            (10, PartitionRecord(A, 2, (1,), (1,), 1)),
            (11, PartitionChangeRecord(A, 0, leader=-1)),
            (12, TopicRecord("new", C)),
            (13, PartitionRecord(C, 0, (1,), (1,), 1)),
            (14, ConfigRecord(TOPIC_RESOURCE, "kept", "retention.ms", None)),
            (15, FeatureLevelRecord("metadata.version", 2)),
        ],
        epoch=3,
    )
    leader_image, _ = leader_image.apply([(16, RemoveTopicRecord(B))])
    delta = loader.load_snapshot(20, 3, snapshot_records(leader_image))
    assert loader.image == dataclasses.replace(leader_image, offset=19, epoch=3)
    assert [t.name for t in delta.deleted_topics] == ["gone"]
    assert [t.name for t in delta.created_topics] == ["new"]
    assert sorted(delta.created_partitions) == [("kept", 2), ("new", 0)]
    assert sorted(delta.changed_partitions) == [("kept", 0), ("kept", 1)]
    # "kept" lost its override: the publisher must hear of it although none is left.
    assert delta.changed_topic_configs == {"kept"}
    assert seen.calls == [(loader.image, delta)]


def test_a_snapshot_that_goes_back_or_does_not_replay_leaves_the_image() -> None:
    loader = loaded(topic("a", A, 1), epoch=4)
    image = loader.image
    snapshot = snapshot_records(image)
    seen = Recorder()
    loader.add_publisher(seen)
    with pytest.raises(MetadataReplayError, match="does not follow"):
        loader.load_snapshot(image.offset + 1, 4, snapshot)
    with pytest.raises(MetadataReplayError, match="later epoch"):
        loader.load_snapshot(image.offset + 5, 3, snapshot)
    with pytest.raises(MetadataReplayError, match="unknown topic"):
        loader.load_snapshot(image.offset + 5, 4, snapshot[1:])
    assert loader.image is image and seen.calls == []


def test_a_publisher_that_fails_does_not_stop_the_snapshot_load() -> None:
    source, _ = random_image(9)
    loader = MetadataLoader(MetadataImage.empty("cluster-x"))
    seen = Recorder()

    def broken(image: MetadataImage, delta: MetadataDelta) -> None:
        raise RuntimeError("publisher bug")

    loader.add_publisher(broken)
    loader.add_publisher(seen)
    loader.load_snapshot(source.offset + 1, source.epoch, snapshot_records(source))
    assert loader.image == source and len(seen.calls) == 1


# -- on disk -------------------------------------------------------------------------------


def write_history(raft_log: FileRaftLog, seed: int, batches: int) -> None:
    """Append a random history to ``raft_log`` as Raft entries (one per batch) and flush."""
    history = RandomHistory(random.Random(seed))
    for epoch, entries in history.batches(batches):
        offset = entries[0][0]
        if offset != raft_log.end_offset():
            # The history skipped an offset for a control batch: write it as Raft would.
            raft_log.append([Entry(raft_log.end_offset(), epoch, (b"\x00\x00",), control=True)])
        raft_log.append([Entry(offset, epoch, tuple(encode_record(r) for _, r in entries))])
    raft_log.flush()


def replayed(raft_log: FileRaftLog, loader: MetadataLoader, start: int) -> MetadataImage:
    return loader.replay(raft_log.metadata_log.batches(start))


def test_a_log_on_disk_restarts_from_its_snapshot_plus_tail(tmp_path: Path) -> None:
    clock = lambda: 1_700_000_000_000  # noqa: E731
    raft_log = FileRaftLog.open(tmp_path, clock=clock)
    write_history(raft_log, seed=21, batches=120)
    full = replayed(raft_log, MetadataLoader(MetadataImage.empty("c")), 0)

    # Snapshot at an entry boundary in the middle: the image of the log before it.
    boundary = raft_log.entry_start(raft_log.end_offset() // 2)
    head = MetadataLoader(MetadataImage.empty("c"))
    for batch in raft_log.metadata_log.batches(0):
        if batch.base_offset >= boundary:
            break
        head.load(batch)
    snapshot_id = OffsetAndEpoch(boundary, raft_log.entry_epoch(boundary - 1))
    assert head.image.offset == boundary - 1
    raft_log.write_snapshot(snapshot_id, encode_snapshot(snapshot_id, snapshot_records(head.image)))
    raft_log.close()

    reopened = FileRaftLog.open(tmp_path, clock=clock)
    try:
        assert reopened.latest_snapshot_id() == snapshot_id
        assert reopened.start_offset() == boundary
        stored = reopened.read_snapshot()
        assert stored is not None
        loader = MetadataLoader(MetadataImage.empty("c"))
        loader.load_snapshot(snapshot_id.offset, snapshot_id.epoch, decode_snapshot(stored[1]))
        assert replayed(reopened, loader, snapshot_id.offset) == full
    finally:
        reopened.close()
