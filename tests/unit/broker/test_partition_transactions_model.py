"""Random histories of transactional appends, markers, rolls, compaction, truncations and
restarts against a partition, checked after every step against a model that reads the history:
open transactions, the last stable offset, the aborted-transaction index and what a
read_committed fetch reports."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tidelog.broker.partitions import Partition, Partitions
from tidelog.records import BatchBuilder, iter_batches, iter_records
from tidelog.storage import Cleaner, LogConfig, LogManager
from tidelog.storage.txn_index import AbortedTxn

PIDS = (11, 12, 13)
NOW = 1_700_000_000_000


@dataclass
class Model:
    """What the history says: one entry per batch, in offset order."""

    #: (first offset, last offset, producer id or -1, kind, values), kind one of "data",
    #: "txn", "commit", "abort"
    batches: list[tuple[int, int, int, str, tuple[bytes, ...]]] = field(default_factory=list)
    #: next sequence per producer (appends as leader are not checked: only recorded)
    sequences: dict[int, int] = field(default_factory=dict)

    def aborted_values(self) -> set[bytes]:
        """The values written by transactions that were aborted."""
        open_values: dict[int, list[bytes]] = {}
        aborted: set[bytes] = set()
        for _, _, pid, kind, values in self.batches:
            if kind == "txn":
                open_values.setdefault(pid, []).extend(values)
            elif kind in ("commit", "abort"):
                ended = open_values.pop(pid, [])
                if kind == "abort":
                    aborted.update(ended)
        return aborted

    def committed_values(self, below: int) -> set[bytes]:
        """The values of committed transactions written below offset ``below``."""
        open_values: dict[int, list[tuple[int, bytes]]] = {}
        committed: set[bytes] = set()
        for first, _, pid, kind, values in self.batches:
            if kind == "txn":
                open_values.setdefault(pid, []).extend((first, v) for v in values)
            elif kind in ("commit", "abort"):
                ended = open_values.pop(pid, [])
                if kind == "commit":
                    committed.update(v for offset, v in ended if offset < below)
        return committed

    def replay(self) -> tuple[dict[int, int], list[AbortedTxn], int]:
        """(open transactions, aborted-index entries, LSO) the history implies."""
        open_txns: dict[int, int] = {}
        aborted: list[AbortedTxn] = []
        end = 0
        for first, last, pid, kind, _ in self.batches:
            end = last + 1
            if kind == "txn":
                open_txns.setdefault(pid, first)
            elif kind in ("commit", "abort") and pid in open_txns:
                start = open_txns.pop(pid)
                if kind == "abort":
                    lso = min(open_txns.values(), default=first + 1)
                    aborted.append(AbortedTxn(pid, start, first, lso))
        return open_txns, aborted, min(open_txns.values(), default=end)


def txn_batch(pid: int, seq: int, n: int) -> bytes:
    builder = BatchBuilder(transactional=True)
    builder.set_producer(pid, 0, seq)
    for i in range(n):
        builder.append(b"k", b"%d-%d" % (pid, seq + i), timestamp=NOW)
    return builder.close()


def control_offsets(partition: Partition) -> set[int]:
    """Offsets of the control batches in the log."""
    log = partition.log
    found: set[int] = set()
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read_bytes(offset, 1 << 30)
        if not data:
            break
        for _, header in iter_batches(data):
            if header.is_control:
                found.add(header.base_offset)
            offset = header.next_offset
    return found


def read_committed(partition: Partition) -> list[bytes]:
    """Every value a read_committed consumer reading from the log start gets, fetch by
    fetch, dropping aborted transactions as clients do."""
    log = partition.log
    lso = partition.last_stable_offset
    offset = log.log_start_offset
    values: list[bytes] = []
    while offset < lso:
        data = log.read_bytes(offset, 1 << 30, max_offset=lso)
        if not data:
            break
        batches = list(iter_batches(data))
        pending = sorted(
            partition.aborted_transactions(batches[0][1].base_offset, lso), key=lambda a: a[1]
        )
        dropping: set[int] = set()
        for position, header in batches:
            pid = header.producer_id
            for aborted_pid, first in list(pending):
                if first <= header.last_offset:
                    pending.remove((aborted_pid, first))
                    dropping.add(aborted_pid)
            if header.is_control:
                dropping.discard(pid)
            elif not (header.is_transactional and pid in dropping):
                values.extend(r.value or b"" for r in iter_records(data, position, header=header))
            offset = header.next_offset
    return values


def plain_batch(n: int) -> bytes:
    builder = BatchBuilder()
    for i in range(n):
        builder.append(b"k", b"p%d" % i, timestamp=NOW)
    return builder.close()


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("txn"), st.sampled_from(PIDS), st.integers(1, 3)),
        st.tuples(st.just("data"), st.just(-1), st.integers(1, 3)),
        st.tuples(st.sampled_from(["commit", "abort"]), st.sampled_from(PIDS), st.just(0)),
        st.tuples(st.just("roll"), st.just(-1), st.just(0)),
        st.tuples(st.just("clean"), st.just(-1), st.just(0)),
        st.tuples(st.just("truncate"), st.just(-1), st.integers(0, 100)),
        st.tuples(
            st.sampled_from(["restart-clean", "restart-crash", "restart-crash-no-snapshots"]),
            st.just(-1),
            st.just(0),
        ),
    ),
    min_size=4,
    max_size=40,
)


class Harness:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.clock = lambda: NOW
        self.logs: LogManager | None = None
        self.partition = self._open()

    def _open(self) -> Partition:
        self.logs = LogManager([self.root], clock=self.clock)
        self.logs.open()
        partitions = Partitions(self.logs)
        self.partitions = partitions
        return partitions.ensure(
            "t",
            0,
            config=LogConfig.from_mapping(
                # delete.retention.ms 0: a marker left without data goes on the next pass.
                {"segment.bytes": 400, "cleanup.policy": "compact", "delete.retention.ms": 0}
            ),
            topic_id=None,
            leader_epoch=0,
        )

    def restart(self, kind: str) -> None:
        assert self.logs is not None
        if kind == "restart-clean":
            self.partitions.close()
        self.logs.close()
        if kind != "restart-clean":
            (self.root / ".clean-shutdown").unlink(missing_ok=True)
        if kind == "restart-crash-no-snapshots":
            for path in (self.root / "t-0").glob("*.snapshot"):
                path.unlink()
        self.partition = self._open()

    def close(self) -> None:
        assert self.logs is not None
        self.logs.close()


@settings(max_examples=150, deadline=None)
@given(OPS)
# An aborted transaction whose data compaction removes entirely: its marker and index
# entry go on the pass after the one that gave the marker its delete horizon.
@example(
    [
        ("txn", 11, 2),
        ("abort", 11, 0),
        ("txn", 11, 1),
        ("commit", 11, 0),
        ("data", -1, 1),
        ("roll", -1, 0),
        ("clean", -1, 0),
        ("clean", -1, 0),
        ("restart-crash-no-snapshots", -1, 0),
    ]
)
# Compaction of committed and aborted transactions, then replay of the cleaned log.
@example(
    [
        ("txn", 11, 2),
        ("txn", 12, 1),
        ("commit", 11, 0),
        ("abort", 12, 0),
        ("data", -1, 1),
        ("roll", -1, 0),
        ("clean", -1, 0),
        ("restart-crash-no-snapshots", -1, 0),
        ("clean", -1, 0),
        ("restart-crash-no-snapshots", -1, 0),
    ]
)
def test_partition_follows_the_model(ops: list[tuple[str, int, int]]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        harness = Harness(Path(directory))
        model = Model()
        try:
            for kind, pid, arg in ops:
                partition = harness.partition
                if kind in ("txn", "data"):
                    if kind == "txn":
                        seq = model.sequences.get(pid, 0)
                        data = txn_batch(pid, seq, arg)
                        model.sequences[pid] = seq + arg
                        values = tuple(b"%d-%d" % (pid, seq + i) for i in range(arg))
                    else:
                        data = plain_batch(arg)
                        values = ()
                    info = partition.append(bytearray(data), now_ms=NOW)
                    model.batches.append((info.first_offset, info.last_offset, pid, kind, values))
                elif kind in ("commit", "abort"):
                    offset = partition.append_txn_marker(pid, 0, 0, kind == "commit", NOW)
                    model.batches.append((offset, offset, pid, kind, ()))
                elif kind == "roll":
                    partition.log.roll()
                elif kind == "clean":
                    Cleaner().clean_log(partition.log, NOW, force=True)
                elif kind == "truncate":
                    if not model.batches:
                        continue
                    index = arg % len(model.batches)
                    partition.truncate_to(model.batches[index][0])
                    # Truncation keeps whole batches: when compaction removed the batches
                    # just below the offset, the log ends before it.
                    end = partition.log.log_end_offset
                    model.batches = [b for b in model.batches[:index] if b[0] < end]
                else:
                    harness.restart(kind)
                partition = harness.partition
                open_txns, aborted, lso = model.replay()
                assert partition.producers.ongoing == open_txns
                assert partition.last_stable_offset == lso
                # Compaction drops a marker once no batch of its transaction is left, and
                # its entry with it: the index lists the aborted markers still in the log.
                markers = control_offsets(partition)
                aborted = [e for e in aborted if e.last_offset in markers]
                entries = [e for s in partition.log.segments for e in s.txn_index.entries]
                assert entries == aborted
                # A read from 0 covers at most the first segment, and stops at the LSO.
                bases = [segment.base_offset for segment in partition.log.segments]
                upper = min(lso, bases[1] if len(bases) > 1 else partition.log.log_end_offset)
                assert partition.aborted_transactions(0, lso) == [
                    (e.producer_id, e.first_offset) for e in aborted if e.first_offset < upper
                ]
                # No record of an aborted transaction is ever read committed (G1a).
                visible = set(read_committed(partition))
                assert not visible & model.aborted_values()
                # Committed transactional batches are never compacted away.
                assert model.committed_values(lso) <= visible
        finally:
            harness.close()
