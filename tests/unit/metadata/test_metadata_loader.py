"""The metadata loader: committed batches to images, deltas and publishers; control
batches skipped; the image's (offset, epoch)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from metadata_helpers import FakeClock

from tidelog.metadata.errors import MetadataReplayError
from tidelog.metadata.image import MetadataDelta, MetadataImage
from tidelog.metadata.loader import MetadataLoader
from tidelog.metadata.log import MetadataBatch, MetadataLog
from tidelog.metadata.records import ConfigRecord, PartitionRecord, TopicRecord
from tidelog.records.builder import BatchBuilder
from tidelog.records.control import ControlRecordType, encode_control_key

T1 = uuid.UUID(int=100)


def leader_change_batch(base_offset: int, epoch: int, timestamp: int) -> bytes:
    """A Raft control batch as a quorum writes it (its value is not read by the loader)."""
    builder = BatchBuilder(base_offset=base_offset, partition_leader_epoch=epoch, control=True)
    builder.append(
        encode_control_key(ControlRecordType.LEADER_CHANGE), b"\x00\x00", timestamp=timestamp
    )
    return builder.close()


def test_loader_publishes_in_order_and_image_knows_offset_and_epoch() -> None:
    loader = MetadataLoader(MetadataImage.empty("cid"))
    seen: list[tuple[str, MetadataImage, MetadataDelta]] = []
    loader.add_publisher(lambda image, delta: seen.append(("first", image, delta)))
    loader.add_publisher(lambda image, delta: seen.append(("second", image, delta)))
    batch = MetadataBatch(
        0, 1, 3, ((0, TopicRecord("a", T1)), (1, PartitionRecord(T1, 0, (1,), (1,), 1)))
    )
    delta = loader.load(batch)
    assert delta is not None and delta.created_partitions == (("a", 0),)
    assert (loader.image.offset, loader.image.epoch) == (1, 3)
    assert [name for name, _, _ in seen] == ["first", "second"]
    assert all(image is loader.image and d is delta for _, image, d in seen)


def test_loader_skips_control_batches_without_publishing() -> None:
    loader = MetadataLoader(MetadataImage.empty())
    seen: list[MetadataDelta] = []
    loader.add_publisher(lambda image, delta: seen.append(delta))
    loader.load(MetadataBatch(0, 0, 1, ((0, TopicRecord("a", T1)),)))
    before = loader.image
    assert loader.load(MetadataBatch(1, 1, 2, (), is_control=True)) is None
    assert len(seen) == 1
    assert (loader.image.offset, loader.image.epoch) == (1, 2)
    assert loader.image.topics_by_name == before.topics_by_name
    # The next record batch must follow the control batch's offset.
    with pytest.raises(MetadataReplayError):
        loader.load(MetadataBatch(1, 1, 2, ((1, TopicRecord("b", uuid.UUID(int=7))),)))
    assert loader.image.topic("b") is None


def test_loader_refuses_an_epoch_going_back() -> None:
    loader = MetadataLoader(MetadataImage.empty())
    loader.load(MetadataBatch(0, 0, 5, ((0, TopicRecord("a", T1)),)))
    with pytest.raises(MetadataReplayError):
        loader.load(MetadataBatch(1, 1, 4, ((1, ConfigRecord(2, "a", "retention.ms", "1")),)))
    with pytest.raises(MetadataReplayError):
        loader.load(MetadataBatch(1, 1, 4, (), is_control=True))
    assert (loader.image.offset, loader.image.epoch) == (0, 5)


def test_failing_publisher_does_not_stop_the_others() -> None:
    loader = MetadataLoader(MetadataImage.empty())

    def broken(image: MetadataImage, delta: MetadataDelta) -> None:
        raise RuntimeError("boom")

    seen: list[MetadataImage] = []
    loader.add_publisher(broken)
    loader.add_publisher(lambda image, delta: seen.append(image))
    loader.load(MetadataBatch(0, 0, 0, ((0, TopicRecord("a", T1)),)))
    assert seen == [loader.image] and loader.image.topic("a") is not None


def test_log_yields_control_batches_and_replay_steps_over_them(
    tmp_path: Path, clock: FakeClock
) -> None:
    log = MetadataLog.open(tmp_path, clock=clock)
    log.append([TopicRecord("a", T1), PartitionRecord(T1, 0, (1,), (1,), 1)], leader_epoch=1)
    log.append_batches_as_follower(leader_change_batch(log.end_offset, 2, clock()))
    log.append([ConfigRecord(2, "a", "retention.ms", "9")], leader_epoch=2)
    batches = list(log.batches())
    assert [(b.base_offset, b.last_offset, b.epoch, b.is_control) for b in batches] == [
        (0, 1, 1, False),
        (2, 2, 2, True),
        (3, 3, 2, False),
    ]
    assert batches[1].records == ()
    # The record view leaves control batches out.
    assert [[o for o, _ in b] for b in log.read_batches()] == [[0, 1], [3]]
    loader = MetadataLoader(MetadataImage.empty())
    published: list[MetadataDelta] = []
    loader.add_publisher(lambda image, delta: published.append(delta))
    image = loader.replay(log.batches())
    assert (image.offset, image.epoch) == (3, 2)
    assert image.topic_config("a") == {"retention.ms": "9"}
    # Replay at start is one change: the topic of the first batch and the config of the
    # last, in one delta, published once (the control batch holds nothing to publish).
    [delta] = published
    assert [t.name for t in delta.created_topics] == ["a"]
    assert delta.changed_topic_configs == frozenset({"a"})
    assert log.replay(MetadataImage.empty()) == image
    log.close()
