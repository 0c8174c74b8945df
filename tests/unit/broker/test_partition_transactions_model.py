"""Random histories of transactional appends, markers, rolls, compaction, truncations and
restarts against a partition, checked after every step against a model that reads the history:
open transactions, the last stable offset, the aborted-transaction index and what a
read_committed fetch reports. The model also learns what compaction removed from aborted
transactions: a truncation that later removes their ABORT marker cannot bring it back."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tidelog.broker.partitions import Partition, Partitions
from tidelog.records import BatchBuilder, BatchHeader, iter_batches, iter_records
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
    #: first offset -> (offset of its ABORT marker, removed whole) of each batch of an
    #: aborted transaction that compaction emptied or removed; its values are gone from
    #: ``batches``: nothing brings them back, not even a truncation that removes the marker
    cleaned: dict[int, tuple[int, bool]] = field(default_factory=dict)
    #: first offsets of cleaned batches whose ABORT marker a truncation then removed: their
    #: transaction is open again, with batches missing (see :meth:`replay`)
    reopened: set[int] = field(default_factory=set)

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

    def aborted_batches(self) -> dict[int, int]:
        """First offset -> ABORT marker offset of every batch of an aborted transaction."""
        open_batches: dict[int, list[int]] = {}
        found: dict[int, int] = {}
        for first, _, pid, kind, _ in self.batches:
            if kind == "txn":
                open_batches.setdefault(pid, []).append(first)
            elif kind in ("commit", "abort"):
                ended = open_batches.pop(pid, [])
                if kind == "abort":
                    found.update(dict.fromkeys(ended, first))
        return found

    def after_clean(self, records_left: dict[int, int]) -> None:
        """Note what a clean pass did to aborted transactions (``records_left``: base
        offset -> record count of every batch in the log). Only their batches are looked
        up: compaction emptying any other batch stays a failure."""
        for first, marker in self.aborted_batches().items():
            left = records_left.get(first)
            if not left:
                self.cleaned[first] = (marker, left is None)
        self.batches = [
            (first, last, pid, kind, () if first in self.cleaned else values)
            for first, last, pid, kind, values in self.batches
        ]

    def after_truncation(self, end: int) -> None:
        """The log now ends at ``end``: an ABORT marker at or above it is gone, so its
        transaction, emptied by compaction, is open again."""
        for first, (marker, _) in list(self.cleaned.items()):
            if first >= end:
                del self.cleaned[first]
                self.reopened.discard(first)
            elif marker >= end:
                self.reopened.add(first)

    def replay(self, from_log: bool = False) -> tuple[dict[int, int], list[AbortedTxn], int]:
        """(open transactions, aborted-index entries, LSO) the history implies.

        A transaction reopened by a truncation after compaction removed some of its
        batches whole has two answers, both Kafka's (the truncation of an unclean leader
        election, the only one below the high watermark, hence below what compaction
        touched). A producer state loaded from a snapshot taken before the clean has it
        start at its first batch, the default here; one rebuilt from the log (``from_log``)
        at its first batch compaction left, and not open at all when none is left.
        """
        open_txns: dict[int, int] = {}
        aborted: list[AbortedTxn] = []
        end = 0
        for first, last, pid, kind, _ in self.batches:
            end = last + 1
            if kind == "txn":
                if from_log and first in self.reopened and self.cleaned[first][1]:
                    continue
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


def log_batches(partition: Partition) -> list[BatchHeader]:
    """The headers of the batches in the log."""
    log = partition.log
    found: list[BatchHeader] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read_bytes(offset, 1 << 30)
        if not data:
            break
        for _, header in iter_batches(data):
            found.append(header)
            offset = header.next_offset
    return found


def control_offsets(partition: Partition) -> set[int]:
    """Offsets of the control batches in the log."""
    return {header.base_offset for header in log_batches(partition) if header.is_control}


def check_reopened(
    partition: Partition,
    history: tuple[dict[int, int], list[AbortedTxn], int],
    from_log: tuple[dict[int, int], list[AbortedTxn], int],
    entries: list[AbortedTxn],
) -> int:
    """Check a partition with a transaction reopened after compaction (see
    :meth:`Model.replay`): each first offset lies between the history's and the log's,
    and is missing only when the log holds none. Returns the LSO."""
    ongoing = partition.producers.ongoing
    end = partition.log.log_end_offset
    for pid in set(history[0]) | set(ongoing):
        low, high, actual = history[0].get(pid), from_log[0].get(pid), ongoing.get(pid)
        assert low is not None, f"producer {pid} has a transaction the history never opened"
        if actual is None:
            assert high is None, f"producer {pid}'s transaction has batches left, yet is closed"
        else:
            assert low <= actual <= (end if high is None else high)
    lso = partition.last_stable_offset
    assert lso == min([*ongoing.values(), end])
    assert history[2] <= lso <= from_log[2]
    markers = control_offsets(partition)
    lows = {e.last_offset: e for e in history[1] if e.last_offset in markers}
    highs = {e.last_offset: e for e in from_log[1] if e.last_offset in markers}
    assert [e.last_offset for e in entries] == sorted({e.last_offset for e in entries})
    for entry in entries:
        earliest = lows.get(entry.last_offset)
        assert earliest is not None, f"an entry for the marker at {entry.last_offset}, no abort"
        latest = highs.get(entry.last_offset, entry._replace(first_offset=entry.last_offset))
        assert entry.producer_id == earliest.producer_id
        assert earliest.first_offset <= entry.first_offset <= latest.first_offset
        assert earliest.last_stable_offset <= entry.last_stable_offset <= entry.last_offset + 1
    # An abort indexes nothing only when, rebuilt from the log, it ended nothing.
    assert not highs.keys() - {e.last_offset for e in entries}
    return lso


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
# A truncation removes the ABORT marker of a transaction compaction emptied (Kafka's unclean
# truncation): the transaction is open again and its next marker commits it, but the
# records compaction removed stay removed.
@example(
    [
        ("txn", 12, 1),
        ("roll", -1, 0),
        ("abort", 12, 0),
        ("clean", -1, 0),
        ("truncate", -1, 1),
        ("commit", 12, 0),
    ]
)
# The same, where compaction removed the transaction's first batch whole: rebuilt from the
# log, the reopened transaction starts at the batch compaction left.
@example(
    [
        ("txn", 12, 1),
        ("txn", 12, 1),
        ("abort", 12, 0),
        ("roll", -1, 0),
        ("clean", -1, 0),
        ("truncate", -1, 2),
    ]
)
# The same, where compaction left no batch of it: rebuilt from the log, nothing is open.
@example(
    [
        ("txn", 12, 1),
        ("data", -1, 1),
        ("abort", 12, 0),
        ("txn", 12, 1),
        ("commit", 12, 0),
        ("roll", -1, 0),
        ("clean", -1, 0),
        ("truncate", -1, 2),
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
                    model.after_clean(
                        {h.base_offset: h.record_count for h in log_batches(partition)}
                    )
                elif kind == "truncate":
                    if not model.batches:
                        continue
                    index = arg % len(model.batches)
                    partition.truncate_to(model.batches[index][0])
                    # Truncation keeps whole batches: when compaction removed the batches
                    # just below the offset, the log ends before it.
                    end = partition.log.log_end_offset
                    model.batches = [b for b in model.batches[:index] if b[0] < end]
                    model.after_truncation(end)
                else:
                    harness.restart(kind)
                partition = harness.partition
                entries = [e for s in partition.log.segments for e in s.txn_index.entries]
                history, from_log = model.replay(), model.replay(from_log=True)
                if history == from_log:
                    open_txns, aborted, lso = history
                    assert partition.producers.ongoing == open_txns
                    assert partition.last_stable_offset == lso
                    # Compaction drops a marker once no batch of its transaction is left, and
                    # its entry with it: the index lists the aborted markers still in the log.
                    markers = control_offsets(partition)
                    assert entries == [e for e in aborted if e.last_offset in markers]
                else:
                    lso = check_reopened(partition, history, from_log, entries)
                # A read from 0 covers at most the first segment, and stops at the LSO.
                bases = [segment.base_offset for segment in partition.log.segments]
                upper = min(lso, bases[1] if len(bases) > 1 else partition.log.log_end_offset)
                assert partition.aborted_transactions(0, lso) == [
                    (e.producer_id, e.first_offset) for e in entries if e.first_offset < upper
                ]
                # No record of an aborted transaction is ever read committed (G1a).
                visible = set(read_committed(partition))
                assert not visible & model.aborted_values()
                # Committed transactional batches are never compacted away.
                assert model.committed_values(lso) <= visible
        finally:
            harness.close()
