"""Deterministic simulation of partition replication, checked after every event.

One process runs 3 or 5 brokers, each with the production
:class:`~tidelog.replication.replica.Replica` for every partition it holds (a few partitions,
three replicas each, ``min.insync.replicas=2``), a simple controller, producers and
consumers, with a fake clock and ONE seeded ``random.Random`` that decides everything:
message delays, drops, network partitions, crashes, restarts and client requests. Every
replica has a :class:`~tidelog.testing.sim_disk.SimReplicaLog` that loses what was not fsynced
when its broker crashes. The same seed and options replay the same run exactly.

The controller model (it does not crash; the metadata quorum has its own simulation) fences a
broker it has not heard from for the session timeout or that registers again after a restart:
the broker leaves every ISR it is in (unless it is the last member) and the leadership it held
moves to another live ISR member, with a new leader epoch. It unfences a broker it hears from
again and elects it where it is the only live ISR member of a leaderless partition. It applies
AlterPartition with Kafka's fencing (FENCED_LEADER_EPOCH, INVALID_UPDATE_VERSION for a stale
partition epoch, INELIGIBLE_REPLICA for a fenced broker joining the ISR) and publishes every
partition state to the brokers over the network; a broker applies only newer states. Unclean
election is never used. (The real controller's AlterPartition is
``tidelog.metadata.controller.isr``; the model answers as it does.) Everything the controller does goes through :class:`SimController`, so
the real controller can replace it later.

Producers send acks=all writes (and some acks=1 ones, which are never fsynced by the leader
on their own) to the leader the controller names; consumers read each partition from the
leader up to its high watermark. A run has a fault phase (crashes of a broker or of a leader,
of every broker at once, back-to-back leader failures, partitions that isolate a broker or a
leader, a lossy and slow network), then a calm phase (everything restarts and heals): an
acks=all write to every partition must then be acknowledged within ``liveness_ms``.

After every event the checker verifies:
- two replicas holding a batch at the same offset and leader epoch hold the same batch;
- a committed entry never changes: every replica's batches below its high watermark match one
  history of committed (offset -> batch), and what a consumer reads matches it too;
- every new leader holds the whole committed history;
- a leader's high watermark never goes backwards within its epoch;
- every entry below a leader's high watermark is fsynced on at least
  ``min.insync.replicas`` replicas (the promise of ``ack_after_fsync``; in Kafka's mode, which
  every fourth seed runs, held in memory);
- every acknowledged acks=all write is in the committed history at the acknowledged offset,
  so, with the two rules above, it is never lost.

``python -m tidelog.testing.replication_sim --seed 7`` replays one seed; ``--seeds 20000``
soaks. A failure prints the one-line command that replays it.
"""

from __future__ import annotations

import heapq
import random
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from tidelog.protocol.error_codes import ErrorCode
from tidelog.records.builder import BatchBuilder
from tidelog.replication.replica import (
    NO_LEADER,
    AlterPartitionIntent,
    FetchAnswer,
    FetchRequest,
    Replica,
    ReplicaConfig,
    Role,
)
from tidelog.testing.replication_mutants import MUTANTS
from tidelog.testing.sim_disk import SimReplicaLog
from tidelog.testing.soak import run_seeds, seeds_of, soak_parser

CONTROLLER = 0
ReplicaFactory = Callable[[SimReplicaLog, ReplicaConfig], Replica]


class InvariantViolation(AssertionError):
    """The checker (or a replica's own assertion) found a broken rule."""


@dataclass(frozen=True)
class SimOptions:
    seed: int
    brokers: int
    partitions: int = 2
    min_insync_replicas: int = 2
    mutant: str | None = None
    fault_ms: int = 4000
    liveness_ms: int = 20000
    #: Kafka's acknowledgement (replicated to memory, ``ack_after_fsync`` off). Its crashes
    #: are process kills that keep the page cache: it makes no promise against power loss.
    kafka_acks: bool = False

    @staticmethod
    def for_seed(seed: int, mutant: str | None = None) -> SimOptions:
        """The cluster a soak uses for ``seed``: 3 or 5 brokers, every fourth seed in Kafka's
        acknowledgement mode."""
        return SimOptions(
            seed, brokers=3 if seed % 2 == 0 else 5, mutant=mutant, kafka_acks=seed % 4 == 3
        )

    def replay_command(self) -> str:
        command = (
            f"python -m tidelog.testing.replication_sim --seed {self.seed} "
            f"--brokers {self.brokers} --fault-ms {self.fault_ms}"
        )
        if self.mutant is not None:
            command += f" --mutant {self.mutant}"
        if self.kafka_acks:
            command += " --kafka-acks"
        return command


@dataclass
class SimResult:
    options: SimOptions
    events: int
    acknowledged: int
    committed: int
    elections: int
    truncations: int
    end_ms: int
    failure: str | None = None
    #: ISR changes the controller accepted from leaders.
    isr_changes: int = 0
    #: How waiting acks=all writes ended other than acknowledged, by error name.
    write_errors: dict[str, int] = field(default_factory=dict)


@dataclass
class PartitionState:
    leader: int
    leader_epoch: int
    partition_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@dataclass(frozen=True)
class Message:
    kind: str  # fetch, fetch-answer, alter, alter-answer, state
    source: int
    destination: int
    partition: int
    body: object


@dataclass(frozen=True)
class _FetchExchange:
    request: FetchRequest
    answer: FetchAnswer


@dataclass(frozen=True)
class _AlterAnswer:
    intent: AlterPartitionIntent
    error: ErrorCode
    state: PartitionState


class SimController:
    """The controller model: fencing, clean elections from the ISR, AlterPartition."""

    def __init__(self, rng: random.Random, states: dict[int, PartitionState]) -> None:
        self.rng = rng
        self.states = states
        self.fenced: set[int] = set()
        self.elections = 0
        self.isr_changes = 0

    def _elect(self, state: PartitionState) -> None:
        live = [r for r in state.isr if r not in self.fenced]
        state.leader = self.rng.choice(live) if live else NO_LEADER
        state.leader_epoch += 1
        if state.leader != NO_LEADER:
            self.elections += 1

    def fence(self, broker: int) -> list[int]:
        """Fence ``broker``; returns the partitions whose state changed."""
        self.fenced.add(broker)
        changed = []
        for partition, state in self.states.items():
            touched = False
            if broker in state.isr and len(state.isr) > 1:
                state.isr = tuple(r for r in state.isr if r != broker)
                touched = True
            if state.leader == broker:
                self._elect(state)
                touched = True
            if touched:
                state.partition_epoch += 1
                changed.append(partition)
        return changed

    def unfence(self, broker: int) -> list[int]:
        self.fenced.discard(broker)
        changed = []
        for partition, state in self.states.items():
            if state.leader == NO_LEADER and broker in state.isr:
                self._elect(state)
                state.partition_epoch += 1
                changed.append(partition)
        return changed

    def alter_partition(self, partition: int, intent: AlterPartitionIntent) -> ErrorCode:
        """The checks of tidelog.metadata.controller.isr, in Kafka's order."""
        state = self.states[partition]
        if intent.broker_id != state.leader:
            return ErrorCode.INVALID_REQUEST
        if intent.leader_epoch != state.leader_epoch:
            return ErrorCode.FENCED_LEADER_EPOCH
        if intent.partition_epoch != state.partition_epoch:
            return ErrorCode.INVALID_UPDATE_VERSION
        if intent.broker_id not in intent.new_isr or not set(intent.new_isr) <= set(state.replicas):
            return ErrorCode.INVALID_REQUEST
        joining = set(intent.new_isr) - set(state.isr)
        if joining & self.fenced:
            return ErrorCode.INELIGIBLE_REPLICA
        state.isr = intent.new_isr
        state.partition_epoch += 1
        self.isr_changes += 1
        return ErrorCode.NONE


@dataclass
class _Broker:
    broker_id: int
    logs: dict[int, SimReplicaLog]
    up: bool = False
    replicas: dict[int, Replica] = field(default_factory=dict)
    inflight_fetch: dict[int, tuple[FetchRequest, int]] = field(default_factory=dict)
    alter_sent: dict[int, tuple[AlterPartitionIntent, int]] = field(default_factory=dict)
    last_flush: int = 0


# Kinds of scheduled events, in the order they run when due at the same time.
_DELIVER, _RESTART, _HEAL, _TICK, _CONTROL, _FAULT, _PRODUCE, _CONSUME, _CALM = range(9)

_FETCH_TIMEOUT_MS = 300
_ALTER_RETRY_MS = 500
_PRODUCE_TIMEOUT_MS = 3000


def batch_identity(batch: bytes) -> bytes:
    """A batch without its base offset, length and leader epoch: what the producer wrote."""
    return batch[16:]


class ReplicationSimulation:
    def __init__(self, options: SimOptions) -> None:
        self.options = options
        self.rng = random.Random(options.seed)
        self.factory: ReplicaFactory = (
            MUTANTS[options.mutant] if options.mutant is not None else Replica
        )
        self.broker_ids = list(range(1, options.brokers + 1))
        self.now = 0
        self.lag_max_ms = self.rng.choice([200, 500, 1500])
        self.session_timeout_ms = self.rng.choice([400, 900])
        self.fetch_max_bytes = self.rng.choice([200, 2000, 1 << 20])
        self.flush_ms = {b: self.rng.choice([50, 300, 2000]) for b in self.broker_ids}
        self.tick_ms = {b: self.rng.randint(15, 40) for b in self.broker_ids}
        states: dict[int, PartitionState] = {}
        for partition in range(options.partitions):
            replicas = tuple(self.rng.sample(self.broker_ids, 3))
            states[partition] = PartitionState(replicas[0], 0, 0, replicas, replicas)
        self.controller = SimController(self.rng, states)
        self.brokers = {
            b: _Broker(b, {p: self._new_log(b, p) for p, s in states.items() if b in s.replicas})
            for b in self.broker_ids
        }
        self.last_contact = dict.fromkeys(self.broker_ids, 0)
        self._queue: list[tuple[int, int, int, object]] = []
        self._seq = 0
        self.cut: set[frozenset[int]] = set()
        self.drop_rate = self.rng.choice([0.0, 0.02, 0.1])
        self.max_delay = self.rng.choice([2, 10, 50])
        self.calm = False
        self.kill_next_leader = False
        # Checker state.
        self.batches_seen: dict[tuple[int, int, int], bytes] = {}
        self.history: dict[int, dict[int, bytes]] = {p: {} for p in states}
        self.verified: dict[tuple[int, int], int] = {}
        self.leader_hw: dict[tuple[int, int], tuple[int, int]] = {}
        self.complete_checked: set[tuple[int, int]] = set()
        self.consumed: dict[int, int] = dict.fromkeys(states, 0)
        self.writes = 0
        self.pending: dict[tuple[int, int, int], tuple[bytes, int]] = {}
        self.acknowledged = 0
        self.truncations = 0
        self.write_errors: dict[str, int] = {}
        self.markers: dict[int, bytes] = {}
        self.markers_acked: set[int] = set()
        self.events = 0

    # ------------------------------------------------------------------ disks and brokers

    def _new_log(self, broker: int, partition: int) -> SimReplicaLog:
        log = SimReplicaLog()

        def on_append(base: int, epoch: int, batch: bytes) -> None:
            key = (partition, base, epoch)
            ident = batch_identity(batch)
            seen = self.batches_seen.setdefault(key, ident)
            if seen != ident:
                raise InvariantViolation(
                    f"partition {partition}: broker {broker} wrote a batch at offset {base} in "
                    f"leader epoch {epoch} that differs from another replica's"
                )

        log.on_append = on_append
        return log

    def _config(self, broker: int) -> ReplicaConfig:
        return ReplicaConfig(
            broker_id=broker,
            min_insync_replicas=self.options.min_insync_replicas,
            replica_lag_time_max_ms=self.lag_max_ms,
            replica_fetch_max_bytes=self.fetch_max_bytes,
            ack_after_fsync=not self.options.kafka_acks,
        )

    def _start(self, broker_id: int, *, again: bool = True) -> None:
        broker = self.brokers[broker_id]
        broker.up = True
        broker.replicas = {
            p: self.factory(log, self._config(broker_id)) for p, log in broker.logs.items()
        }
        broker.inflight_fetch.clear()
        broker.alter_sent.clear()
        broker.last_flush = self.now
        for key in [k for k in self.verified if k[0] == broker_id]:
            del self.verified[key]
        # Registering again fences the previous incarnation: its leaderships move away and it
        # leaves the ISRs, as its unflushed data may be gone.
        changed = []
        if again:
            changed = self.controller.fence(broker_id) + self.controller.unfence(broker_id)
        self.last_contact[broker_id] = self.now
        for partition, state in self.controller.states.items():
            if partition in broker.replicas:
                self._apply_state(broker_id, partition, state)
        self._publish(sorted(set(changed)))
        self._schedule(self.now + self.tick_ms[broker_id], _TICK, broker_id)

    def _crash(self, broker_id: int) -> None:
        broker = self.brokers[broker_id]
        if not broker.up:
            return
        broker.up = False
        broker.replicas = {}
        for log in broker.logs.values():
            log.crash(lose_unflushed=not self.options.kafka_acks)
        self.pending = {k: v for k, v in self.pending.items() if k[0] != broker_id}

    def _apply_state(self, broker_id: int, partition: int, state: PartitionState) -> None:
        replica = self.brokers[broker_id].replicas.get(partition)
        if replica is None:
            return
        replica.apply_partition_state(
            state.leader,
            state.leader_epoch,
            state.partition_epoch,
            state.replicas,
            state.isr,
            self.now,
        )
        self._after(broker_id, partition)

    # ------------------------------------------------------------------ network

    def _schedule(self, at: int, kind: int, data: object) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (at, kind, self._seq, data))

    def _send(self, message: Message) -> None:
        link = frozenset((message.source, message.destination))
        if link in self.cut or self.rng.random() < self.drop_rate:
            return
        self._schedule(self.now + self.rng.randint(1, self.max_delay), _DELIVER, message)

    def _publish(self, partitions: list[int]) -> None:
        for partition in partitions:
            state = self.controller.states[partition]
            snapshot = PartitionState(
                state.leader, state.leader_epoch, state.partition_epoch, state.replicas, state.isr
            )
            for broker_id in snapshot.replicas:
                self._send(Message("state", CONTROLLER, broker_id, partition, snapshot))

    def _deliver(self, message: Message) -> None:
        if frozenset((message.source, message.destination)) in self.cut:
            return
        if message.destination == CONTROLLER:
            self._controller_receive(message)
            return
        broker = self.brokers[message.destination]
        if not broker.up:
            return
        replica = broker.replicas.get(message.partition)
        if replica is None:
            return
        partition = message.partition
        if message.kind == "state":
            assert isinstance(message.body, PartitionState)
            self._apply_state(broker.broker_id, partition, message.body)
        elif message.kind == "fetch":
            assert isinstance(message.body, FetchRequest)
            answer = replica.on_follower_fetch(message.body, self.now)
            self._send(
                Message(
                    "fetch-answer",
                    broker.broker_id,
                    message.source,
                    partition,
                    _FetchExchange(message.body, answer),
                )
            )
            self._after(broker.broker_id, partition)
        elif message.kind == "fetch-answer":
            assert isinstance(message.body, _FetchExchange)
            request, answer = message.body.request, message.body.answer
            inflight = broker.inflight_fetch.get(partition)
            if inflight is None or inflight[0] is not request:
                return
            del broker.inflight_fetch[partition]
            before = replica.log.log_end_offset
            applied = replica.on_fetch_answer(request, answer)
            if applied and replica.log.log_end_offset < before:
                self.truncations += 1
            self._after(broker.broker_id, partition)
            if applied and (answer.records or answer.diverging is not None):
                self._fetch(broker, partition, replica)
        elif message.kind == "alter-answer":
            reply = message.body
            assert isinstance(reply, _AlterAnswer)
            if replica.alter_partition_in_flight != reply.intent:
                return  # the answer to an earlier request, or to another incarnation
            if reply.error is ErrorCode.NONE:
                broker.alter_sent.pop(partition, None)
                self._apply_state(broker.broker_id, partition, reply.state)
            else:
                # A change still pending after a refusal waits for the next partition state;
                # the broker only asks again after the retry interval.
                broker.alter_sent[partition] = (reply.intent, self.now)
                replica.on_alter_partition_error(reply.intent, reply.error)

    def _controller_receive(self, message: Message) -> None:
        assert message.kind == "alter" and isinstance(message.body, AlterPartitionIntent)
        partition = message.partition
        error = self.controller.alter_partition(partition, message.body)
        state = self.controller.states[partition]
        snapshot = PartitionState(
            state.leader, state.leader_epoch, state.partition_epoch, state.replicas, state.isr
        )
        self._send(
            Message(
                "alter-answer",
                CONTROLLER,
                message.source,
                partition,
                _AlterAnswer(message.body, error, snapshot),
            )
        )
        if error is ErrorCode.NONE:
            self._publish([partition])

    def _fetch(self, broker: _Broker, partition: int, replica: Replica) -> None:
        request = replica.next_fetch()
        if request is None:
            return
        broker.inflight_fetch[partition] = (request, self.now)
        self._send(Message("fetch", broker.broker_id, request.leader_id, partition, request))

    def _tick(self, broker_id: int) -> None:
        broker = self.brokers[broker_id]
        if not broker.up:
            return
        flush = self.now - broker.last_flush >= self.flush_ms[broker_id]
        if flush:
            broker.last_flush = self.now
        for partition, replica in broker.replicas.items():
            if flush:
                broker.logs[partition].flush()
                replica.on_log_flushed()
            inflight = broker.inflight_fetch.get(partition)
            if replica.role is Role.FOLLOWER and (
                inflight is None or self.now - inflight[1] >= _FETCH_TIMEOUT_MS
            ):
                self._fetch(broker, partition, replica)
            self._after(broker_id, partition)
            # AlterPartition is retried until answered (requests and answers get lost).
            intent = replica.alter_partition_in_flight
            sent = broker.alter_sent.get(partition)
            if intent is not None and (
                sent is None or sent[0] != intent or self.now - sent[1] >= _ALTER_RETRY_MS
            ):
                broker.alter_sent[partition] = (intent, self.now)
                self._send(Message("alter", broker_id, CONTROLLER, partition, intent))
        self._schedule(self.now + self.tick_ms[broker_id], _TICK, broker_id)

    def _after(self, broker_id: int, partition: int) -> None:
        """Carry out what a replica asks for after an event, then check it."""
        broker = self.brokers[broker_id]
        replica = broker.replicas[partition]
        effects = replica.poll(self.now)
        # History first: a completion is checked against the entries it was committed with.
        self._check_replica(broker_id, partition, replica)
        if effects.alter_partition is not None:
            broker.alter_sent[partition] = (effects.alter_partition, self.now)
            self._send(Message("alter", broker_id, CONTROLLER, partition, effects.alter_partition))
        for completion in effects.completions:
            pending = self.pending.pop((broker_id, partition, completion.token), None)
            if pending is not None and completion.error is ErrorCode.NONE:
                self._acknowledged(partition, *pending)
            elif pending is not None:
                name = completion.error.name
                self.write_errors[name] = self.write_errors.get(name, 0) + 1

    def _control(self) -> None:
        """The controller's heartbeat bookkeeping: fence the silent, unfence the back."""
        changed: list[int] = []
        for broker_id, broker in self.brokers.items():
            reachable = broker.up and frozenset((broker_id, CONTROLLER)) not in self.cut
            if reachable:
                self.last_contact[broker_id] = self.now
                if broker_id in self.controller.fenced:
                    changed += self.controller.unfence(broker_id)
            elif (
                broker_id not in self.controller.fenced
                and self.now - self.last_contact[broker_id] > self.session_timeout_ms
            ):
                changed += self.controller.fence(broker_id)
        # Brokers catch up with the metadata log: every state, again, to every replica.
        self._publish(list(self.controller.states))
        self._schedule(self.now + 100, _CONTROL, None)

    # ------------------------------------------------------------------ clients

    def _produce(self) -> None:
        partition = self.rng.randrange(self.options.partitions)
        state = self.controller.states[partition]
        broker = self.brokers.get(state.leader)
        if broker is None or not broker.up:
            return
        replica = broker.replicas[partition]
        acks = -1 if self.calm or self.rng.random() < 0.8 else 1
        if self.calm and partition in self.markers_acked:
            return
        self.writes += 1
        value = f"{self.options.seed}-{partition}-{self.writes}".encode()
        builder = BatchBuilder()
        builder.append(None, value, timestamp=self.now)
        batch = builder.close()
        outcome = replica.append(batch, acks, self.now, _PRODUCE_TIMEOUT_MS)
        if outcome.token is not None:
            ident = batch_identity(batch)
            self.pending[(broker.broker_id, partition, outcome.token)] = (
                ident,
                outcome.end_offset - 1,
            )
            if self.calm:
                self.markers[partition] = ident
        self._after(broker.broker_id, partition)

    def _acknowledged(self, partition: int, ident: bytes, offset: int) -> None:
        self.acknowledged += 1
        committed = self.history[partition].get(offset)
        if committed != ident:
            raise InvariantViolation(
                f"partition {partition}: write acknowledged at offset {offset} is not the "
                f"committed batch there ({'none' if committed is None else 'another'})"
            )
        if self.markers.get(partition) == ident:
            self.markers_acked.add(partition)

    def _consume(self) -> None:
        for partition, state in self.controller.states.items():
            broker = self.brokers.get(state.leader)
            if broker is None or not broker.up:
                continue
            replica = broker.replicas[partition]
            if replica.role is not Role.LEADER:
                continue
            position = self.consumed[partition]
            hw = replica.high_watermark
            if position >= hw:
                continue
            offset = position
            for base, end, ident in self._batches_below(broker.broker_id, partition, position, hw):
                if self.history[partition].get(base) != ident:
                    raise InvariantViolation(
                        f"partition {partition}: a consumer read offset {base} from leader "
                        f"{broker.broker_id} and it is not the committed batch"
                    )
                offset = end
            self.consumed[partition] = offset

    # ------------------------------------------------------------------ faults

    def _leaders(self) -> list[int]:
        return sorted(
            {
                s.leader
                for s in self.controller.states.values()
                if s.leader != NO_LEADER and self.brokers[s.leader].up
            }
        )

    def _down_for(self, broker_id: int, low: int, high: int) -> None:
        self._crash(broker_id)
        self._schedule(self.now + self.rng.randint(low, high), _RESTART, broker_id)

    def _isolate(self, node: int, duration: int) -> None:
        nodes = [CONTROLLER, *self.broker_ids]
        links = {frozenset((node, other)) for other in nodes if other != node}
        self.cut |= links
        self._schedule(self.now + duration, _HEAL, frozenset(links))

    def _inject_fault(self) -> None:
        kind = self.rng.randrange(7)
        leaders = self._leaders()
        if kind == 0:
            self._down_for(self.rng.choice(self.broker_ids), 50, 2000)
        elif kind == 1 and leaders:
            self._down_for(self.rng.choice(leaders), 50, 2000)
        elif kind == 2:
            for broker_id in self.broker_ids:
                self._crash(broker_id)
            for broker_id in self.broker_ids:
                self._schedule(self.now + self.rng.randint(10, 1000), _RESTART, broker_id)
        elif kind == 3 and leaders:
            self._down_for(self.rng.choice(leaders), 300, 3000)
            self.kill_next_leader = True
        elif kind == 4 and leaders:
            self._isolate(self.rng.choice(leaders), self.rng.randint(300, 3000))
        elif kind == 5:
            nodes = [CONTROLLER, *self.broker_ids]
            group = {n for n in nodes if self.rng.random() < 0.5}
            links = {frozenset((a, b)) for a in group for b in nodes if b not in group}
            self.cut |= links
            self._schedule(self.now + self.rng.randint(300, 3000), _HEAL, frozenset(links))
        else:
            self._isolate(self.rng.choice(self.broker_ids), self.rng.randint(300, 3000))

    def _calm_down(self) -> None:
        self.calm = True
        self.cut.clear()
        self.drop_rate = 0.0
        self.kill_next_leader = False
        for broker_id, broker in self.brokers.items():
            if not broker.up:
                self._start(broker_id)

    # ------------------------------------------------------------------ the run

    def run(self) -> SimResult:
        failure: str | None = None
        try:
            self._run()
        except AssertionError as error:
            failure = f"{type(error).__name__} at {self.now} ms: {error}"
        return SimResult(
            self.options,
            self.events,
            self.acknowledged,
            sum(len(h) for h in self.history.values()),
            self.controller.elections,
            self.truncations,
            self.now,
            failure,
            self.controller.isr_changes,
            self.write_errors,
        )

    def _run(self) -> None:
        for broker_id in self.broker_ids:
            self._start(broker_id, again=False)
        self._schedule(100, _CONTROL, None)
        self._schedule(self.rng.randint(100, 1000), _FAULT, None)
        self._schedule(self.rng.randint(5, 50), _PRODUCE, None)
        self._schedule(self.rng.randint(5, 50), _CONSUME, None)
        self._schedule(self.options.fault_ms, _CALM, None)
        deadline = self.options.fault_ms + self.options.liveness_ms
        while len(self.markers_acked) < self.options.partitions:
            at, kind, _, data = heapq.heappop(self._queue)
            self.now = max(self.now, at)
            self._handle(kind, data)
            self.events += 1
            if self.kill_next_leader and (leaders := self._leaders()):
                self.kill_next_leader = False
                self._down_for(leaders[0], 300, 3000)
            if self.now > deadline:
                raise InvariantViolation(
                    f"liveness: no acks=all write acknowledged on every partition within "
                    f"{self.options.liveness_ms} ms after the faults stopped "
                    f"(states: {self.controller.states})"
                )

    def _handle(self, kind: int, data: object) -> None:
        if kind == _DELIVER:
            assert isinstance(data, Message)
            self._deliver(data)
        elif kind == _TICK:
            assert isinstance(data, int)
            self._tick(data)
        elif kind == _CONTROL:
            self._control()
        elif kind == _RESTART:
            assert isinstance(data, int)
            if not self.brokers[data].up:
                self._start(data)
        elif kind == _HEAL:
            assert isinstance(data, frozenset)
            self.cut -= data
        elif kind == _FAULT:
            if not self.calm:
                self._inject_fault()
                self._schedule(self.now + self.rng.randint(200, 1500), _FAULT, None)
        elif kind == _PRODUCE:
            self._produce()
            self._schedule(self.now + self.rng.randint(5, 60), _PRODUCE, None)
        elif kind == _CONSUME:
            self._consume()
            self._schedule(self.now + self.rng.randint(20, 100), _CONSUME, None)
        elif kind == _CALM:
            self._calm_down()

    # ------------------------------------------------------------------ the checker

    def _check_replica(self, broker_id: int, partition: int, replica: Replica) -> None:
        log = self.brokers[broker_id].logs[partition]
        history = self.history[partition]
        key = (broker_id, partition)
        if replica.role is Role.LEADER:
            self._check_leader(broker_id, partition, replica, log)
        # Committed entries never change: below its high watermark a replica holds exactly
        # the history (extended by the first replica to commit an offset).
        start = min(self.verified.get(key, 0), log.log_end_offset)
        hw = replica.high_watermark
        for base, _, ident in self._batches_below(broker_id, partition, start, hw):
            if history.setdefault(base, ident) != ident:
                raise InvariantViolation(
                    f"partition {partition}: broker {broker_id} holds another batch at "
                    f"committed offset {base} (below its high watermark {hw})"
                )
        self.verified[key] = max(start, hw)

    def _batches_below(
        self, broker_id: int, partition: int, start: int, hw: int
    ) -> Iterator[tuple[int, int, bytes]]:
        """``(base, next offset, identity)`` of a replica's batches from ``start`` up to its
        high watermark ``hw``; every offset below it must be held."""
        log = self.brokers[broker_id].logs[partition]
        offset = start
        while offset < hw:
            found = log.batch_at(offset)
            if found is None:
                raise InvariantViolation(
                    f"partition {partition}: broker {broker_id} has no batch at {offset} below "
                    f"its high watermark {hw}"
                )
            base, end, _, batch = found
            if end > hw:
                return
            yield base, end, batch_identity(batch)
            offset = end

    def _check_leader(
        self, broker_id: int, partition: int, replica: Replica, log: SimReplicaLog
    ) -> None:
        epoch = replica.leader_epoch
        term = (partition, epoch)
        if term not in self.complete_checked:
            # Leader completeness: a new leader holds every committed entry.
            self.complete_checked.add(term)
            for offset, ident in self.history[partition].items():
                found = log.batch_at(offset)
                if found is None or batch_identity(found[3]) != ident:
                    raise InvariantViolation(
                        f"partition {partition}: leader {broker_id} of epoch {epoch} lacks "
                        f"committed offset {offset}"
                    )
        key = (broker_id, partition)
        hw = replica.high_watermark
        previous = self.leader_hw.get(key)
        if previous is not None and previous[0] == epoch and hw < previous[1]:
            raise InvariantViolation(
                f"partition {partition}: leader {broker_id} high watermark went from "
                f"{previous[1]} to {hw} in epoch {epoch}"
            )
        if (previous is None or previous != (epoch, hw)) and hw > 0:
            self._check_durable(broker_id, partition, log, hw)
        self.leader_hw[key] = (epoch, hw)

    def _check_durable(self, broker_id: int, partition: int, log: SimReplicaLog, hw: int) -> None:
        found = log.batch_at(hw - 1)
        assert found is not None
        ident = batch_identity(found[3])
        holders = 0
        for broker in self.brokers.values():
            other = broker.logs.get(partition)
            if other is None:
                continue
            kept = other.log_end_offset if self.options.kafka_acks else other.recovery_point
            if kept < hw:
                continue
            held = other.batch_at(hw - 1)
            if held is not None and batch_identity(held[3]) == ident:
                holders += 1
        if holders < self.options.min_insync_replicas:
            raise InvariantViolation(
                f"partition {partition}: leader {broker_id} has high watermark {hw} but only "
                f"{holders} replicas hold offset {hw - 1} fsynced "
                f"(min.insync.replicas={self.options.min_insync_replicas})"
            )


def run_seed(options: SimOptions) -> SimResult:
    return ReplicationSimulation(options).run()


def _main(argv: list[str] | None = None) -> int:
    parser = soak_parser(
        "python -m tidelog.testing.replication_sim",
        "Deterministic simulation of partition replication, checked after every event.",
        fault_ms=SimOptions.fault_ms,
        mutants=MUTANTS,
    )
    parser.add_argument("--brokers", type=int, choices=(3, 5), help="by default from the seed")
    parser.add_argument(
        "--kafka-acks",
        action="store_true",
        default=None,
        help="Kafka's acknowledgement (no fsync); by default from the seed",
    )
    args = parser.parse_args(argv)
    seeds = seeds_of(parser, args)

    def options_for(seed: int) -> SimOptions:
        base = SimOptions.for_seed(seed, args.mutant)
        return SimOptions(
            seed,
            brokers=base.brokers if args.brokers is None else args.brokers,
            mutant=args.mutant,
            fault_ms=args.fault_ms,
            kafka_acks=base.kafka_acks if args.kafka_acks is None else args.kafka_acks,
        )

    return run_seeds(
        seeds,
        lambda seed: run_seed(options_for(seed)),
        describe=lambda result: (
            f"{result.events} events, {result.acknowledged} acknowledged writes, "
            f"{result.committed} committed batches, {result.elections} elections, "
            f"{result.truncations} truncations, {result.isr_changes} ISR changes, "
            f"acks=all failures {result.write_errors}, {result.end_ms} ms simulated"
        ),
        tally=("acknowledged writes", lambda result: result.acknowledged),
        progress=args.progress,
    )


if __name__ == "__main__":
    sys.exit(_main())
