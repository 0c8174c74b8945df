"""When a controller snapshots the metadata image (sans-io, as Kafka's SnapshotGenerator).

A controller writes a snapshot (KIP-630) so that its log can be deleted below it and a
restart or a lagging node starts from the snapshot instead of offset 0. It writes one when
either limit is reached since the last snapshot (written or loaded):

* ``metadata.log.max.record.bytes.between.snapshots`` (default 20 MiB) bytes of committed
  records have been applied;
* ``metadata.log.max.snapshot.interval.ms`` (default one hour; 0 turns it off) have passed
  and at least one record was committed meanwhile (an idle cluster writes no snapshots).

The snapshot is taken at the last committed offset the loader has applied: it states the
loader's image (:func:`~tidelog.metadata.image_records.snapshot_records`) and ends just
after that image's offset, which is an entry boundary (the loader applies whole batches)
at or below the high watermark. :class:`SnapshotPolicy` only decides: its owner (the
driver of the Raft node) tells it what was committed and when a snapshot was written, and
writes the snapshot it asks for with ``RaftNode.create_snapshot``. Time is passed in (ms),
never read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from tidelog.metadata.configs import BrokerConfig, ConfigError
from tidelog.metadata.image import MetadataImage
from tidelog.metadata.image_records import snapshot_records

__all__ = [
    "MAX_BYTES_KEY",
    "MAX_INTERVAL_KEY",
    "SnapshotPolicy",
    "SnapshotRequest",
    "SnapshotSettings",
]

MAX_BYTES_KEY: Final = "metadata.log.max.record.bytes.between.snapshots"
MAX_INTERVAL_KEY: Final = "metadata.log.max.snapshot.interval.ms"


@dataclass(frozen=True)
class SnapshotSettings:
    #: Committed record bytes after which a snapshot is due.
    max_record_bytes: int = 20 * 1024 * 1024
    #: Time (ms) after which a snapshot is due if anything was committed; 0: never by time.
    max_interval_ms: int = 60 * 60 * 1000

    def __post_init__(self) -> None:
        if self.max_record_bytes < 1:
            raise ConfigError(MAX_BYTES_KEY, str(self.max_record_bytes), "must be at least 1")
        if self.max_interval_ms < 0:
            raise ConfigError(MAX_INTERVAL_KEY, str(self.max_interval_ms), "must be at least 0")

    @classmethod
    def from_config(cls, config: BrokerConfig) -> SnapshotSettings:
        return cls(config.get_int(MAX_BYTES_KEY), config.get_int(MAX_INTERVAL_KEY))


@dataclass(frozen=True)
class SnapshotRequest:
    """A snapshot to write now: ``records`` state the image up to ``end_offset`` (exclusive)."""

    end_offset: int
    records: Sequence[bytes]
    #: Why now (for the log line): which limit was reached.
    reason: str


class SnapshotPolicy:
    """Counts what was committed since the last snapshot and says when the next is due."""

    def __init__(self, settings: SnapshotSettings, now: int, *, last_end_offset: int = 0) -> None:
        """``last_end_offset``: the end of the snapshot the node started from (0: none);
        ``now``: the start counts as the last snapshot's time."""
        self._settings = settings
        self._last_end = last_end_offset
        self._last_time = now
        self._bytes = 0

    @property
    def bytes_since_snapshot(self) -> int:
        return self._bytes

    @property
    def last_end_offset(self) -> int:
        return self._last_end

    def committed(self, record_bytes: int) -> None:
        """The loader applied committed records of ``record_bytes`` bytes (the sum of their
        values, as the log holds them; control records count nothing)."""
        if record_bytes < 0:
            raise ValueError(f"committed {record_bytes} bytes")
        self._bytes += record_bytes

    def poll(self, image: MetadataImage, now: int) -> SnapshotRequest | None:
        """The snapshot to write now of ``image`` (the loader's), or None when none is due
        or the image holds nothing after the last snapshot."""
        end = image.offset + 1
        if end <= self._last_end or self._bytes == 0:
            return None
        settings = self._settings
        if self._bytes >= settings.max_record_bytes:
            reason = f"{self._bytes} record bytes committed since the last snapshot"
        elif settings.max_interval_ms and now - self._last_time >= settings.max_interval_ms:
            reason = f"{now - self._last_time} ms since the last snapshot"
        else:
            return None
        return SnapshotRequest(end, snapshot_records(image), reason)

    def snapshot_done(self, end_offset: int, now: int) -> None:
        """A snapshot ending at ``end_offset`` was written (or loaded): count from it. Bytes
        committed after it that were already counted are forgotten too, which only delays
        the next snapshot by as much."""
        if end_offset > self._last_end:
            self._last_end = end_offset
            self._bytes = 0
            self._last_time = now

    def next_deadline(self, now: int) -> int | None:
        """When :meth:`poll` may next be due by time alone (None: not by time)."""
        if not self._settings.max_interval_ms or self._bytes == 0:
            return None
        return max(now, self._last_time + self._settings.max_interval_ms)
