"""Start-up time of a metadata log: replaying it from offset 0 against a snapshot plus tail.

The log: ``--topics`` topics (default 10,000), each committed as one operation (one Raft
entry) of a TopicRecord, ``--partitions`` PartitionRecords (default 8) and one
ConfigRecord: 100,000 metadata records by default, written with the real
:class:`~tidelog.metadata.raft_log.FileRaftLog` into a temporary directory on disk, in
segments of ``--segment-bytes`` (``metadata.log.segment.bytes``; default 1 MiB, so that a
snapshot deletes the segments below it as it would in a log that has lived a while).

Two copies of it:

- ``replay``: the log alone. Start-up = open the FileRaftLog (storage recovery reads every
  batch and checks its CRC) + load every batch from offset 0 through the MetadataLoader.
- ``snapshot``: the same log with a snapshot of the image at ``--tail`` (default 10%) of the
  operations before the end, written as the controller would (``snapshot_records`` of the
  loader's image, ``FileRaftLog.write_snapshot``, which deletes the log below it).
  Start-up = open the FileRaftLog (it reads and checks the snapshot file and what is left
  of the log) + ``load_snapshot`` + load the batches after it.

Both images are compared (the run fails if they differ). Each start-up is timed over
``--rounds`` rounds, alternating which goes first, page cache warm; the best round is the
figure and every round is printed. Also printed: the time to write the snapshot, and the
sizes on disk. The last line is one JSON object with the figures (seconds, bytes).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

from tidelog.metadata.image import TOPIC_RESOURCE, MetadataImage
from tidelog.metadata.image_records import snapshot_records
from tidelog.metadata.loader import MetadataLoader
from tidelog.metadata.raft.batches import decode_snapshot, encode_leader_change, encode_snapshot
from tidelog.metadata.raft.messages import Entry, OffsetAndEpoch
from tidelog.metadata.raft_log import FileRaftLog
from tidelog.metadata.records import (
    BrokerEndpoint,
    ConfigRecord,
    MetadataRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
    encode_record,
)

EPOCH = 1
CLUSTER_ID = "bench-cluster"


def _clock() -> int:
    return time.time_ns() // 1_000_000


def operations(topics: int, partitions: int) -> list[list[MetadataRecord]]:
    """Three broker registrations, then one CreateTopics operation per topic."""
    ops: list[list[MetadataRecord]] = [
        [
            RegisterBrokerRecord(
                broker,
                uuid.UUID(int=broker),
                (BrokerEndpoint("PLAINTEXT", f"broker{broker}", 9092, "PLAINTEXT"),),
                fenced=False,
            )
        ]
        for broker in (1, 2, 3)
    ]
    for index in range(topics):
        topic_id = uuid.UUID(int=(1 << 64) + index)
        name = f"topic-{index:06d}"
        records: list[MetadataRecord] = [TopicRecord(name, topic_id)]
        for p in range(partitions):
            replicas = tuple(1 + (index + p + r) % 3 for r in range(3))
            records.append(PartitionRecord(topic_id, p, replicas, replicas, replicas[0]))
        records.append(ConfigRecord(TOPIC_RESOURCE, name, "retention.ms", "604800000"))
        ops.append(records)
    return ops


def write_log(directory: Path, ops: list[list[MetadataRecord]], segment_bytes: int) -> None:
    """The log as a single voter writes it: its LeaderChange, then one entry per op."""
    log = FileRaftLog.open(directory, clock=_clock, segment_bytes=segment_bytes)
    try:
        log.append([Entry(0, EPOCH, (encode_leader_change(1, [1], [1]),), control=True)])
        chunk: list[Entry] = []
        offset = 1
        for records in ops:
            chunk.append(Entry(offset, EPOCH, tuple(encode_record(r) for r in records)))
            offset += len(records)
            if len(chunk) == 500:
                log.append(chunk)
                chunk = []
        log.append(chunk)
        log.flush()
    finally:
        log.close()


def write_snapshot(directory: Path, segment_bytes: int, entries_in_tail: int) -> tuple[int, float]:
    """Snapshot the image before the last ``entries_in_tail`` entries, as the controller
    would: (snapshot end offset, seconds to state the image and write the file)."""
    log = FileRaftLog.open(directory, clock=_clock, segment_bytes=segment_bytes)
    try:
        batches = list(log.metadata_log.batches(0))
        boundary = batches[len(batches) - entries_in_tail].base_offset
        loader = MetadataLoader(MetadataImage.empty(CLUSTER_ID))
        loader.replay(b for b in batches if b.base_offset < boundary)
        start = time.perf_counter()
        snapshot_id = OffsetAndEpoch(boundary, log.entry_epoch(boundary - 1))
        payload = encode_snapshot(snapshot_id, snapshot_records(loader.image))
        log.write_snapshot(snapshot_id, payload)
        return boundary, time.perf_counter() - start
    finally:
        log.close()


def start_by_replay(directory: Path, segment_bytes: int) -> tuple[MetadataImage, float]:
    start = time.perf_counter()
    log = FileRaftLog.open(directory, clock=_clock, segment_bytes=segment_bytes)
    try:
        loader = MetadataLoader(MetadataImage.empty(CLUSTER_ID))
        loader.replay(log.metadata_log.batches(0))
        return loader.image, time.perf_counter() - start
    finally:
        log.close()


def start_from_snapshot(directory: Path, segment_bytes: int) -> tuple[MetadataImage, float]:
    start = time.perf_counter()
    log = FileRaftLog.open(directory, clock=_clock, segment_bytes=segment_bytes)
    try:
        stored = log.read_snapshot()
        assert stored is not None, "the snapshot copy has a snapshot"
        snapshot_id, payload = stored
        loader = MetadataLoader(MetadataImage.empty(CLUSTER_ID))
        loader.load_snapshot(snapshot_id.offset, snapshot_id.epoch, decode_snapshot(payload))
        loader.replay(log.metadata_log.batches(snapshot_id.offset))
        return loader.image, time.perf_counter() - start
    finally:
        log.close()


def size_of(directory: Path, suffix: str) -> int:
    return sum(p.stat().st_size for p in directory.rglob(f"*{suffix}") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=10_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument(
        "--tail", type=float, default=0.10, help="share of operations after the snapshot"
    )
    parser.add_argument("--segment-bytes", type=int, default=1 << 20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--dir", type=Path, default=None, help="parent of the temporary directory (default: .)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the logs")
    args = parser.parse_args(argv)

    ops = operations(args.topics, args.partitions)
    record_count = sum(len(records) for records in ops)
    root = Path(tempfile.mkdtemp(prefix="metadata-bench-", dir=args.dir or Path.cwd()))
    replay_dir, snapshot_dir = root / "replay", root / "snapshot"
    try:
        start = time.perf_counter()
        write_log(replay_dir, ops, args.segment_bytes)
        print(
            f"log: {record_count} records in {len(ops)} operations, "
            f"written in {time.perf_counter() - start:.2f} s, under {root}"
        )
        shutil.copytree(replay_dir, snapshot_dir)
        tail_entries = max(1, int(len(ops) * args.tail))
        boundary, snapshot_write_s = write_snapshot(snapshot_dir, args.segment_bytes, tail_entries)
        tail_records = sum(len(records) for records in ops[-tail_entries:])
        log_bytes = size_of(replay_dir, ".log")
        snapshot_bytes = size_of(snapshot_dir, ".checkpoint")
        kept_bytes = size_of(snapshot_dir, ".log")
        print(
            f"snapshot at offset {boundary}: {snapshot_bytes} bytes, written in "
            f"{snapshot_write_s:.2f} s; tail {tail_records} records in {tail_entries} operations"
        )
        print(f"on disk: full log {log_bytes} bytes; snapshot copy keeps {kept_bytes} bytes of log")

        rounds: dict[str, list[float]] = {"replay_s": [], "snapshot_s": []}
        images: dict[str, MetadataImage] = {}
        for round_number in range(args.rounds):
            cases = [
                ("replay_s", replay_dir, start_by_replay),
                ("snapshot_s", snapshot_dir, start_from_snapshot),
            ]
            if round_number % 2:
                cases.reverse()
            for key, directory, start_up in cases:
                image, elapsed = start_up(directory, args.segment_bytes)
                rounds[key].append(elapsed)
                images[key] = image
        if images["replay_s"] != images["snapshot_s"]:
            print("FAILED: the image from the snapshot plus tail differs from the replay")
            return 1
        best = {key: min(values) for key, values in rounds.items()}
        for key, label in (("replay_s", "replay from offset 0"), ("snapshot_s", "snapshot + tail")):
            shown = ", ".join(f"{v:.2f}" for v in rounds[key])
            print(f"{label:<24}{best[key]:8.2f} s   rounds: {shown}")
        print(
            f"speed-up {best['replay_s'] / best['snapshot_s']:.1f}x; "
            f"images equal ({len(images['replay_s'].topics_by_name)} topics)"
        )
        figures = {
            "records": record_count,
            "tail_records": tail_records,
            "replay_s": round(best["replay_s"], 3),
            "snapshot_s": round(best["snapshot_s"], 3),
            "snapshot_write_s": round(snapshot_write_s, 3),
            "snapshot_bytes": snapshot_bytes,
            "log_bytes": log_bytes,
        }
        print(json.dumps(figures))
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
