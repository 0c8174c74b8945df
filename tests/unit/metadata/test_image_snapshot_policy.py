"""When the controller snapshots: after so many committed record bytes or so much time with
something committed, at the loader's last applied offset; and the whole path on a real
single-voter Raft node on disk (commit, load, snapshot, restart from snapshot plus tail)."""

from __future__ import annotations

import dataclasses
import random
import re
import uuid
from pathlib import Path

import pytest
from test_image_snapshot import RandomHistory

from tidelog.metadata.configs import BrokerConfig, ConfigError
from tidelog.metadata.controller.snapshots import (
    MAX_BYTES_KEY,
    MAX_INTERVAL_KEY,
    SnapshotPolicy,
    SnapshotSettings,
)
from tidelog.metadata.image import MetadataImage
from tidelog.metadata.image_records import image_from_snapshot
from tidelog.metadata.loader import MetadataLoader
from tidelog.metadata.log import MetadataBatch
from tidelog.metadata.quorum_state import FileQuorumStateStore
from tidelog.metadata.raft import Entry, OffsetAndEpoch, RaftConfig, RaftNode, Role
from tidelog.metadata.raft_log import FileRaftLog
from tidelog.metadata.records import (
    RegisterBrokerRecord,
    TopicRecord,
    decode_record,
    encode_record,
)
from tidelog.protocol.error_codes import ErrorCode

HOUR = 3_600_000


def image_at(offset: int, epoch: int = 1) -> MetadataImage:
    """An image holding one topic, built up to ``offset``."""
    image, _ = MetadataImage.empty("c").apply(
        [(offset, TopicRecord("t", uuid.UUID(int=offset + 1)))], epoch=epoch
    )
    return image


def test_the_defaults_and_the_config_keys_are_kafkas() -> None:
    assert SnapshotSettings() == SnapshotSettings(20 * 1024 * 1024, HOUR)
    assert SnapshotSettings.from_config(BrokerConfig({})) == SnapshotSettings()
    config = BrokerConfig(
        {
            "metadata.log.max.record.bytes.between.snapshots": "1000",
            "metadata.log.max.snapshot.interval.ms": "0",
        }
    )
    assert SnapshotSettings.from_config(config) == SnapshotSettings(1000, 0)
    with pytest.raises(ConfigError, match=re.escape(MAX_BYTES_KEY)):
        SnapshotSettings.from_config(
            BrokerConfig({"metadata.log.max.record.bytes.between.snapshots": "0"})
        )
    with pytest.raises(ConfigError, match=re.escape(MAX_INTERVAL_KEY)):
        SnapshotSettings(1, -1)


def test_a_snapshot_is_due_after_enough_committed_bytes() -> None:
    policy = SnapshotPolicy(SnapshotSettings(1000, HOUR), now=0)
    policy.committed(999)
    assert policy.poll(image_at(10), now=1) is None
    policy.committed(1)
    request = policy.poll(image_at(10), now=2)
    assert request is not None
    # At the loader's last applied offset: the snapshot ends just after it.
    assert request.end_offset == 11
    assert image_from_snapshot(request.records, 11, 1, cluster_id="c") == image_at(10)
    assert "1000 record bytes" in request.reason
    # Still due until written; once written, counting starts again from it.
    assert policy.poll(image_at(10), now=3) is not None
    policy.snapshot_done(11, now=3)
    assert (policy.bytes_since_snapshot, policy.last_end_offset) == (0, 11)
    policy.committed(999)
    assert policy.poll(image_at(20), now=4) is None


def test_a_snapshot_is_due_after_the_interval_only_when_something_was_committed() -> None:
    policy = SnapshotPolicy(SnapshotSettings(10**9, HOUR), now=1000)
    # Idle: no deadline and nothing due, however long it stays idle.
    assert policy.next_deadline(now=1000) is None
    assert policy.poll(image_at(5), now=1000 + 10 * HOUR) is None
    policy.committed(1)
    assert policy.next_deadline(now=2000) == 1000 + HOUR
    assert policy.poll(image_at(5), now=1000 + HOUR - 1) is None
    request = policy.poll(image_at(5), now=1000 + HOUR)
    assert request is not None and request.end_offset == 6
    assert f"{HOUR} ms" in request.reason
    policy.snapshot_done(6, now=1000 + HOUR)
    assert policy.next_deadline(now=1000 + HOUR) is None
    policy.committed(1)
    assert policy.next_deadline(now=1000 + HOUR + 5) == 1000 + 2 * HOUR
    # A deadline already passed is now.
    assert policy.next_deadline(now=1000 + 3 * HOUR) == 1000 + 3 * HOUR


def test_an_interval_of_zero_turns_time_based_snapshots_off() -> None:
    policy = SnapshotPolicy(SnapshotSettings(1000, 0), now=0)
    policy.committed(10)
    assert policy.next_deadline(now=0) is None
    assert policy.poll(image_at(3), now=100 * HOUR) is None


def test_no_snapshot_at_or_before_the_last_one() -> None:
    # The node started from a snapshot ending at 50; the loader is there.
    policy = SnapshotPolicy(SnapshotSettings(1, HOUR), now=0, last_end_offset=50)
    policy.committed(100)
    assert policy.poll(image_at(49), now=0) is None
    assert policy.poll(image_at(50), now=0) is not None
    # A snapshot loaded from the leader (later) counts as the last one too; an older one
    # does not move it back.
    policy.snapshot_done(80, now=5)
    policy.snapshot_done(60, now=6)
    assert policy.last_end_offset == 80
    with pytest.raises(ValueError):
        policy.committed(-1)


# -- the whole path on a real Raft node --------------------------------------------------


def as_batch(entry: Entry) -> MetadataBatch:
    """A committed Raft entry as the loader takes it."""
    if entry.control:
        return MetadataBatch(entry.offset, entry.end_offset - 1, entry.epoch, (), True)
    records = tuple(
        (entry.offset + i, decode_record(value)) for i, value in enumerate(entry.records)
    )
    return MetadataBatch(entry.offset, entry.end_offset - 1, entry.epoch, records)


class SingleVoter:
    """Node 1, the only voter, on files under ``root``, with a loader and the snapshot
    policy as a controller's driver would run them; ``now`` is a fake clock (ms)."""

    def __init__(self, root: Path, settings: SnapshotSettings, now: int) -> None:
        self.now = now
        self.log = FileRaftLog.open(root, clock=lambda: self.now)
        self.node = RaftNode(
            1,
            [1],
            RaftConfig(),
            self.log,
            FileQuorumStateStore.open(root, [1]),
            random.Random(1),
            now,
        )
        self.loader = MetadataLoader(MetadataImage.empty("c"))
        snapshot = self.node.latest_snapshot()
        if snapshot is not None:
            self.loader.load_snapshot(snapshot[0].offset, snapshot[0].epoch, snapshot[1])
        self.policy = SnapshotPolicy(
            settings, now, last_end_offset=snapshot[0].offset if snapshot else 0
        )
        self.snapshots = 0
        while self.node.role is not Role.LEADER:
            deadline = self.node.next_deadline()
            assert deadline is not None
            self.now = max(self.now, deadline)
            self.node.tick(self.now)
        self.step()

    def step(self) -> None:
        """Load what committed, and snapshot when the policy says so."""
        self.node.tick(self.now)
        for entry in self.node.read_committed(self.loader.image.offset + 1, 1000):
            self.loader.load(as_batch(entry))
            if not entry.control:
                self.policy.committed(sum(len(value) for value in entry.records))
        request = self.policy.poll(self.loader.image, self.now)
        if request is not None:
            self.node.create_snapshot(request.end_offset, request.records, timestamp=self.now)
            self.policy.snapshot_done(request.end_offset, self.now)
            self.snapshots += 1

    def commit(self, values: list[bytes]) -> None:
        assert self.node.propose(values, self.now).error is ErrorCode.NONE
        self.step()


def test_a_controller_snapshots_its_image_and_restarts_from_it(tmp_path: Path) -> None:
    settings = SnapshotSettings(max_record_bytes=4000, max_interval_ms=HOUR)
    voter = SingleVoter(tmp_path, settings, now=0)
    history = RandomHistory(random.Random(4))
    history.offset = voter.log.end_offset()
    for _ in range(150):
        voter.now += 1000
        values = []
        for record in history.operation():
            if isinstance(record, RegisterBrokerRecord):
                history.brokers[record.broker_id] = history.offset + len(values)
            values.append(encode_record(record))
        if values:
            voter.commit(values)
            history.offset += len(values)
    assert voter.snapshots >= 2, "the byte limit was passed several times"
    snapshot_id = voter.log.latest_snapshot_id()
    # The log below it is gone (the entry just before its end stays, see FileRaftLog).
    assert snapshot_id is not None
    assert voter.log.metadata_log.start_offset == snapshot_id.offset - 1 > 0
    # Something committed after the last snapshot, then an hour with nothing new: the
    # time limit takes a snapshot at the loader's offset.
    voter.commit([encode_record(TopicRecord("before-the-hour", uuid.UUID(int=998)))])
    assert 0 < voter.policy.bytes_since_snapshot < settings.max_record_bytes
    taken = voter.snapshots
    deadline = voter.policy.next_deadline(voter.now)
    assert deadline is not None and deadline > voter.now
    voter.now = deadline - 1
    voter.step()
    assert voter.snapshots == taken
    voter.now = deadline
    voter.step()
    assert voter.snapshots == taken + 1
    assert voter.log.latest_snapshot_id() == OffsetAndEpoch(
        voter.loader.image.offset + 1, voter.loader.image.epoch
    )
    voter.commit([encode_record(TopicRecord("after-snapshot", uuid.UUID(int=999)))])
    final = voter.loader.image
    voter.log.close()

    restarted = SingleVoter(tmp_path, settings, now=voter.now + 1)
    # Started from the snapshot, then loaded the committed tail (and its new epoch's
    # leader change): the same image.
    last_snapshot = voter.log.latest_snapshot_id()
    assert last_snapshot is not None
    assert restarted.policy.last_end_offset == last_snapshot.offset
    image = restarted.loader.image
    assert image.epoch == final.epoch + 1 and image.offset == final.offset + 1
    assert dataclasses.replace(image, offset=final.offset, epoch=final.epoch) == final
    restarted.log.close()
