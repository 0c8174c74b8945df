"""Deterministic simulation of the metadata quorum, checked after every event.

One process runs N production :class:`RaftNode` s (1-5 voters plus observers) with a fake
clock and ONE seeded ``random.Random`` that decides everything: election timeouts, message
delays, drops, duplicates, partitions, crashes and client proposals. Each node has a
:class:`SimRaftLog` and a :class:`SimQuorumStateStore` that lose what was not flushed when it
crashes. The same seed and options replay the same run exactly.

Clients propose operations of 1-4 records; each is one entry (one record batch), so entries
span several offsets, and with a small fetch size (drawn per seed) a Fetch or FetchSnapshot
answer carries few entries or a piece of a snapshot.

A run has a fault phase (crashes of one node, of the leader, of every node at once, leader
failures back to back, partitions that isolate the leader or split the cluster, a lossy network
that also duplicates, delays and so reorders messages) while clients propose entries, then a
calm phase (the network heals and stops losing messages, every node restarts): within
``liveness_ms`` of simulated time a leader must commit a new entry.

After every event the checker verifies:
- at most one leader per epoch, ever;
- a node's epoch never decreases, across restarts too (it is in the quorum-state file);
- a node's high watermark never decreases while it runs. It is not persisted (as in KRaft),
  so a restarted node starts with none and learns it again from its leader; what it then
  exposes as committed is held to the history below, so it cannot expose anything else;
- every entry below a leader's high watermark is held durably (flushed) by a majority of
  voters (by the Log Matching property, checked on the last committed entry);
- a record committed at an offset never changes: every node's records below its high
  watermark match one history of committed (offset -> epoch, record), and every new leader
  holds the whole history;
- an operation commits whole: a node's high watermark never falls between two records of
  one proposal;
- every snapshot ends at a committed offset, with the epoch committed there, and holds the
  state of exactly the committed records below it (a digest chained over them).

Nodes take snapshots at random committed offsets (and the log before them is deleted), so
lagging and restarted nodes catch up through FetchSnapshot.

``python -m tidelog.testing.raft_sim --seed 7 --voters 3`` replays one seed; ``--seeds 100000``
soaks. A failure prints the one-line command that replays it.
"""

from __future__ import annotations

import hashlib
import heapq
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from tidelog.metadata.raft.batches import decode_snapshot
from tidelog.metadata.raft.config import RaftConfig
from tidelog.metadata.raft.messages import Entry, Envelope
from tidelog.metadata.raft.node import Effects, RaftNode, Role
from tidelog.protocol.error_codes import ErrorCode
from tidelog.testing.raft_mutants import MUTANTS
from tidelog.testing.sim_disk import SimQuorumStateStore, SimRaftLog
from tidelog.testing.soak import run_seeds, seeds_of, soak_parser

NodeFactory = Callable[..., RaftNode]


class InvariantViolation(AssertionError):
    """The checker (or a node's own assertion) found a broken rule."""


@dataclass(frozen=True)
class SimOptions:
    seed: int
    voters: int
    observers: int = 0
    mutant: str | None = None
    fault_ms: int = 20000
    liveness_ms: int = 30000

    @staticmethod
    def for_seed(seed: int, mutant: str | None = None) -> SimOptions:
        """The cluster shape a soak uses for ``seed``: 1-5 voters, 0-1 observers."""
        return SimOptions(seed, voters=1 + seed % 5, observers=(seed // 5) % 2, mutant=mutant)

    def replay_command(self) -> str:
        command = (
            f"python -m tidelog.testing.raft_sim --seed {self.seed} --voters {self.voters} "
            f"--observers {self.observers} --fault-ms {self.fault_ms}"
        )
        if self.mutant is not None:
            command += f" --mutant {self.mutant}"
        return command


@dataclass
class SimResult:
    options: SimOptions
    events: int
    proposals: int
    committed: int
    elections: int
    end_ms: int
    snapshots: int
    failure: str | None = None


# Kinds of scheduled events, in the order they run when due at the same time.
_DELIVER, _RESTART, _HEAL, _FAULT, _PROPOSE, _CALM, _SNAPSHOT = range(7)


def apply_record(state: bytes, epoch: int, record: bytes) -> bytes:
    """The simulated state machine: a digest chained over every record applied."""
    return hashlib.sha256(state + epoch.to_bytes(8, "big") + record).digest()


def operation_records(prefix: str, number: int, count: int) -> list[bytes]:
    """The records of one proposed operation; each names its place in it, so that the
    checker sees an operation committed in part."""
    return [f"{prefix}-{number}-{i}/{count}".encode() for i in range(count)]


def ends_operation(entry: Entry, offset: int) -> bool:
    """Whether the record at ``offset`` of ``entry`` is the last of its operation."""
    if entry.control:
        return True
    place = entry.records[offset - entry.offset].rsplit(b"-", 1)[1]
    index, count = place.split(b"/")
    return int(index) + 1 == int(count)


@dataclass
class _Disk:
    log: SimRaftLog = field(default_factory=SimRaftLog)
    store: SimQuorumStateStore = field(default_factory=SimQuorumStateStore)


class RaftSimulation:
    def __init__(self, options: SimOptions, config: RaftConfig | None = None) -> None:
        self.options = options
        self.rng = random.Random(options.seed)
        # A small fetch size splits Fetch answers between entries and snapshots into pieces.
        self.config = config or RaftConfig(fetch_max_bytes=self.rng.choice([150, 1000, 1 << 23]))
        self.factory: NodeFactory = (
            MUTANTS[options.mutant] if options.mutant is not None else RaftNode
        )
        self.voter_ids = list(range(1, options.voters + 1))
        self.node_ids = list(range(1, options.voters + options.observers + 1))
        self.majority = options.voters // 2 + 1
        self.now = 0
        self.disks = {n: _Disk() for n in self.node_ids}
        self.nodes: dict[int, RaftNode | None] = {n: None for n in self.node_ids}
        self._queue: list[tuple[int, int, int, object]] = []
        self._seq = 0
        # The network: links cut by partitions, and how lossy it is.
        self.cut: set[frozenset[int]] = set()
        self.drop_rate = self.rng.choice([0.0, 0.01, 0.05, 0.1])
        self.dup_rate = self.rng.choice([0.0, 0.01, 0.05])
        self.max_delay = self.rng.choice([2, 10, 40])
        self.calm = False
        self.kill_next_leader = False
        # Checker state.
        self.leader_of_epoch: dict[int, int] = {}
        self.max_epoch: dict[int, int] = dict.fromkeys(self.node_ids, 0)
        self.last_hw: dict[int, int] = dict.fromkeys(self.node_ids, 0)
        self.history: dict[int, tuple[int, bytes]] = {}
        # chain[o]: the state after applying the committed records below offset o.
        self.chain: list[bytes] = [b""]
        self.snapshots_taken = 0
        self.snapshot_checked: dict[int, object] = dict.fromkeys(self.node_ids)
        # Epochs whose leader was checked to hold the whole history.
        self._complete_checked: set[int] = set()
        self.events = 0
        self.proposals = 0
        self.marker: bytes | None = None
        self.marker_committed_at: int | None = None

    # ------------------------------------------------------------------ scheduling

    def _schedule(self, at: int, kind: int, data: object) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (at, kind, self._seq, data))

    def _start(self, node_id: int) -> None:
        disk = self.disks[node_id]
        self.nodes[node_id] = self.factory(
            node_id, self.voter_ids, self.config, disk.log, disk.store, self.rng, self.now
        )
        self.last_hw[node_id] = 0

    def _crash(self, node_id: int) -> None:
        if self.nodes[node_id] is None:
            return
        self.nodes[node_id] = None
        self.disks[node_id].log.crash()
        self.disks[node_id].store.crash()

    def _send_all(self, effects: Effects) -> None:
        for envelope in effects.messages:
            self._send(envelope)

    def _send(self, envelope: Envelope) -> None:
        link = frozenset((envelope.source, envelope.destination))
        if link in self.cut or self.rng.random() < self.drop_rate:
            return
        copies = 2 if self.rng.random() < self.dup_rate else 1
        for _ in range(copies):
            self._schedule(self.now + self.rng.randint(1, self.max_delay), _DELIVER, envelope)

    # ------------------------------------------------------------------ the run

    def run(self) -> SimResult:
        failure: str | None = None
        try:
            self._run()
        except AssertionError as error:
            failure = f"{type(error).__name__} at {self.now} ms: {error}"
        committed = len(self.history)
        return SimResult(
            self.options,
            self.events,
            self.proposals,
            committed,
            len(self.leader_of_epoch),
            self.now,
            self.snapshots_taken,
            failure,
        )

    def _run(self) -> None:
        for node_id in self.node_ids:
            self._start(node_id)
        self._schedule(self.rng.randint(100, 1500), _FAULT, None)
        self._schedule(self.rng.randint(10, 100), _PROPOSE, None)
        self._schedule(self.options.fault_ms, _CALM, None)
        self._schedule(self.rng.randint(500, 3000), _SNAPSHOT, None)
        deadline = self.options.fault_ms + self.options.liveness_ms
        while self.marker_committed_at is None:
            at, node_id = self._next_tick()
            if self._queue and (at is None or self._queue[0][0] <= at):
                at, kind, _, data = heapq.heappop(self._queue)
                self.now = max(self.now, at)
                self._handle(kind, data)
            elif at is not None:
                self.now = max(self.now, at)
                node = self.nodes[node_id]
                assert node is not None
                self._send_all(node.tick(self.now))
            else:
                raise InvariantViolation("nothing left to do and no entry committed")
            self.events += 1
            self._check()
            if self.kill_next_leader and (leaders := self._leaders()):
                # The second of two back-to-back leader failures: the next leader to appear
                # (the previous one is down).
                self.kill_next_leader = False
                self._down_for(leaders[0], 500, 4000)
            if self.now > deadline:
                raise InvariantViolation(
                    f"liveness: no new entry committed within {self.options.liveness_ms} ms "
                    f"after the faults stopped (roles: {self._roles()})"
                )

    def _next_tick(self) -> tuple[int | None, int]:
        best: int | None = None
        best_id = 0
        for node_id, node in self.nodes.items():
            if node is None:
                continue
            deadline = node.next_deadline()
            if deadline is not None and (best is None or deadline < best):
                best, best_id = deadline, node_id
        return best, best_id

    def _handle(self, kind: int, data: object) -> None:
        if kind == _DELIVER:
            assert isinstance(data, Envelope)
            node = self.nodes[data.destination]
            if node is not None and frozenset((data.source, data.destination)) not in self.cut:
                self._send_all(node.step(data, self.now))
        elif kind == _RESTART:
            assert isinstance(data, int)
            if self.nodes[data] is None:
                self._start(data)
        elif kind == _HEAL:
            assert isinstance(data, frozenset)
            self.cut -= data
        elif kind == _FAULT:
            if not self.calm:
                self._inject_fault()
                self._schedule(self.now + self.rng.randint(200, 2000), _FAULT, None)
        elif kind == _PROPOSE:
            self._propose()
            self._schedule(self.now + self.rng.randint(5, 100), _PROPOSE, None)
        elif kind == _CALM:
            self._calm_down()
        elif kind == _SNAPSHOT:
            self._take_snapshot()
            self._schedule(self.now + self.rng.randint(200, 3000), _SNAPSHOT, None)

    def _roles(self) -> str:
        return ", ".join(
            f"{n}:{'down' if node is None else f'{node.role.value}@{node.epoch}'}"
            for n, node in self.nodes.items()
        )

    # ------------------------------------------------------------------ faults and clients

    def _leaders(self) -> list[int]:
        return [
            n for n, node in self.nodes.items() if node is not None and node.role is Role.LEADER
        ]

    def _down_for(self, node_id: int, low: int, high: int) -> None:
        self._crash(node_id)
        self._schedule(self.now + self.rng.randint(low, high), _RESTART, node_id)

    def _inject_fault(self) -> None:
        kind = self.rng.randrange(7)
        leaders = self._leaders()
        if kind == 0:
            self._down_for(self.rng.choice(self.node_ids), 50, 3000)
        elif kind == 1 and leaders:
            self._down_for(leaders[0], 50, 3000)
        elif kind == 2:
            # Every node at once, as a power cut would.
            for node_id in self.node_ids:
                self._crash(node_id)
            for node_id in self.node_ids:
                self._schedule(self.now + self.rng.randint(10, 1500), _RESTART, node_id)
        elif kind == 3 and leaders:
            # Back-to-back: the leader now, and the next one as soon as it is elected.
            self._down_for(leaders[0], 500, 4000)
            self.kill_next_leader = True
        elif kind == 4 and leaders:
            self._isolate(leaders[0], self.rng.randint(500, 5000))
        elif kind == 5:
            group = {n for n in self.node_ids if self.rng.random() < 0.5}
            links = {frozenset((a, b)) for a in group for b in self.node_ids if b not in group}
            self.cut |= links
            self._schedule(self.now + self.rng.randint(300, 5000), _HEAL, frozenset(links))
        else:
            self._isolate(self.rng.choice(self.node_ids), self.rng.randint(300, 4000))

    def _isolate(self, node_id: int, duration: int) -> None:
        links = {frozenset((node_id, other)) for other in self.node_ids if other != node_id}
        self.cut |= links
        self._schedule(self.now + duration, _HEAL, frozenset(links))

    def _calm_down(self) -> None:
        self.calm = True
        self.cut.clear()
        self.drop_rate = 0.0
        self.kill_next_leader = False
        for node_id, node in self.nodes.items():
            if node is None:
                self._start(node_id)
        self.marker = f"marker-{self.options.seed}".encode()

    def _take_snapshot(self) -> None:
        live = [n for n, node in self.nodes.items() if node is not None]
        if not live:
            return
        node_id = self.rng.choice(live)
        node = self.nodes[node_id]
        assert node is not None
        log = self.disks[node_id].log
        start, limit = log.start_offset(), node.snapshot_limit()
        if limit <= start:
            return
        entries = [e for e in log.read(start, 1 << 62) if e.end_offset <= limit]
        if not entries:
            return
        end = self.rng.choice(entries).end_offset
        previous = node.latest_snapshot()
        state = previous[1][0] if previous is not None else b""
        for entry in entries:
            if entry.offset >= end:
                break
            for record in entry.records:
                state = apply_record(state, entry.epoch, record)
        node.create_snapshot(end, [state])
        self.snapshots_taken += 1

    def _propose(self) -> None:
        live = [n for n, node in self.nodes.items() if node is not None]
        if not live:
            return
        target = self.nodes[self.rng.choice(live)]
        assert target is not None
        prefix = self.marker.decode() if self.marker is not None else f"op-{self.options.seed}"
        records = operation_records(prefix, self.proposals, self.rng.randint(1, 4))
        result = target.propose(records, self.now)
        if result.error is ErrorCode.NOT_LEADER_OR_FOLLOWER and result.leader_id is not None:
            # A client follows the hint to the leader it names.
            hinted = self.nodes.get(result.leader_id)
            if hinted is not None:
                result = hinted.propose(records, self.now)
        if result.error is ErrorCode.NONE:
            self.proposals += 1

    # ------------------------------------------------------------------ the checker

    def _check(self) -> None:
        for node_id, node in self.nodes.items():
            if node is None:
                continue
            if node.epoch < self.max_epoch[node_id]:
                raise InvariantViolation(
                    f"node {node_id}: epoch went from {self.max_epoch[node_id]} to {node.epoch}"
                )
            self.max_epoch[node_id] = node.epoch
            if node.high_watermark < self.last_hw[node_id]:
                raise InvariantViolation(
                    f"node {node_id}: high watermark went from {self.last_hw[node_id]} "
                    f"to {node.high_watermark}"
                )
            if node.role is Role.LEADER:
                self._check_leader(node_id, node)
            self._check_committed(node_id, node)
            self._check_snapshot(node_id)
            self.last_hw[node_id] = node.high_watermark

    def _check_leader(self, node_id: int, node: RaftNode) -> None:
        known = self.leader_of_epoch.setdefault(node.epoch, node_id)
        if known != node_id:
            raise InvariantViolation(f"epoch {node.epoch} has two leaders: {known} and {node_id}")
        hw = node.high_watermark
        if hw == 0:
            return
        log = self.disks[node_id].log
        if hw - 1 < log.start_offset():
            return
        expected = log.entry(hw - 1)
        holders = 0
        for voter in self.voter_ids:
            voter_log = self.disks[voter].log
            if voter_log.flushed_end_offset() < hw:
                continue
            if hw - 1 < voter_log.start_offset():
                # Summarised by its snapshot, which the snapshot check holds to the history.
                holders += 1
            elif voter_log.entry(hw - 1) == expected:
                holders += 1
        if holders < self.majority:
            raise InvariantViolation(
                f"leader {node_id} (epoch {node.epoch}) has high watermark {hw} but only "
                f"{holders} of {len(self.voter_ids)} voters hold offset {hw - 1} durably"
            )

    def _check_committed(self, node_id: int, node: RaftNode) -> None:
        log = self.disks[node_id].log
        start = self.last_hw[node_id]
        if node.role is Role.LEADER and node.epoch not in self._complete_checked:
            # Leader completeness: a new leader holds every committed entry.
            self._complete_checked.add(node.epoch)
            start = 0
            missing = [o for o in self.history if o >= log.end_offset()]
            if missing:
                raise InvariantViolation(
                    f"leader {node_id} of epoch {node.epoch} lacks committed offsets "
                    f"{min(missing)}..{max(missing)}"
                )
            for offset, (epoch, record) in self.history.items():
                if offset < log.start_offset():
                    continue
                entry = log.entry(offset)
                held = (entry.epoch, entry.records[offset - entry.offset])
                if held != (epoch, record):
                    raise InvariantViolation(
                        f"leader {node_id} of epoch {node.epoch} holds {held} at committed "
                        f"offset {offset}, committed was ({epoch}, {record!r})"
                    )
        hw = node.high_watermark
        for offset in range(max(start, log.start_offset()), hw):
            entry = log.entry(offset)
            held = (entry.epoch, entry.records[offset - entry.offset])
            seen = self.history.setdefault(offset, held)
            if offset == len(self.chain) - 1:
                self.chain.append(apply_record(self.chain[-1], *seen))
            if seen != held:
                raise InvariantViolation(
                    f"node {node_id}: offset {offset} committed as {seen} but holds "
                    f"{held} below its high watermark {hw}"
                )
            if self.marker is not None and held[1].startswith(self.marker):
                self.marker_committed_at = self.now
        if hw > max(self.last_hw[node_id], log.start_offset()) and not ends_operation(
            log.entry(hw - 1), hw - 1
        ):
            raise InvariantViolation(
                f"node {node_id}: high watermark {hw} commits part of an operation "
                f"({log.entry(hw - 1)})"
            )

    def _check_snapshot(self, node_id: int) -> None:
        snapshot = self.disks[node_id].log.read_snapshot()
        if snapshot is None or self.snapshot_checked[node_id] is snapshot:
            return
        self.snapshot_checked[node_id] = snapshot
        snapshot_id, payload = snapshot
        records = decode_snapshot(payload)
        state = records[0] if records else b""
        offset = snapshot_id.offset
        if offset >= len(self.chain) or self.history[offset - 1][0] != snapshot_id.epoch:
            raise InvariantViolation(
                f"node {node_id}: snapshot {snapshot_id} does not end at a committed offset "
                f"(committed up to {len(self.chain) - 1})"
            )
        if state != self.chain[offset]:
            raise InvariantViolation(
                f"node {node_id}: snapshot {snapshot_id} does not hold the committed entries"
            )


def run_seed(options: SimOptions, config: RaftConfig | None = None) -> SimResult:
    return RaftSimulation(options, config).run()


def _main(argv: list[str] | None = None) -> int:
    parser = soak_parser(
        "python -m tidelog.testing.raft_sim",
        "Deterministic simulation of the metadata quorum, checked after every event.",
        fault_ms=SimOptions.fault_ms,
        mutants=MUTANTS,
    )
    parser.add_argument("--voters", type=int, help="voters (1-5); by default from the seed")
    parser.add_argument("--observers", type=int, help="observers; by default from the seed")
    args = parser.parse_args(argv)
    seeds = seeds_of(parser, args)
    if args.voters is not None and not 1 <= args.voters <= 5:
        parser.error("--voters must be between 1 and 5")

    def options_for(seed: int) -> SimOptions:
        base = SimOptions.for_seed(seed, args.mutant)
        return SimOptions(
            seed,
            voters=base.voters if args.voters is None else args.voters,
            observers=base.observers if args.observers is None else args.observers,
            mutant=args.mutant,
            fault_ms=args.fault_ms,
        )

    return run_seeds(
        seeds,
        lambda seed: run_seed(options_for(seed)),
        describe=lambda result: (
            f"{result.events} events, {result.proposals} proposals, "
            f"{result.committed} committed records, {result.elections} epochs with a leader, "
            f"{result.snapshots} snapshots, {result.end_ms} ms simulated"
        ),
        tally=("committed records", lambda result: result.committed),
        progress=args.progress,
    )


if __name__ == "__main__":
    sys.exit(_main())
