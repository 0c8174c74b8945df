"""The deterministic simulation of partition replication: many seeds, each checked after every
event (see tidelog.testing.replication_sim), and proof that the checker catches broken rules."""

from __future__ import annotations

import pytest

from tidelog.records import BatchBuilder
from tidelog.replication.replica import Replica, ReplicaConfig
from tidelog.testing.replication_mutants import MUTANTS
from tidelog.testing.replication_sim import SimOptions, _main, run_seed
from tidelog.testing.sim_disk import SimReplicaLog

# At least 500 seeds on every run of the suite; even seeds run 3 brokers, odd ones 5.
SEEDS = range(600)


def test_every_seed_keeps_every_invariant_and_acknowledges_once_faults_stop() -> None:
    failures = []
    shapes = set()
    acknowledged = elections = truncations = isr_changes = 0
    write_errors: set[str] = set()
    for seed in SEEDS:
        result = run_seed(SimOptions.for_seed(seed))
        shapes.add(result.options.brokers)
        if result.failure is not None:
            failures.append(f"{result.failure}\n  replay: {result.options.replay_command()}")
            continue
        # Liveness: a run ends only once an acks=all write to every partition after the
        # faults is acknowledged.
        assert result.acknowledged >= result.options.partitions
        acknowledged += result.acknowledged
        elections += result.elections
        truncations += result.truncations
        isr_changes += result.isr_changes
        write_errors |= set(result.write_errors)
    assert failures == []
    assert shapes == {3, 5}
    # The faults did what they are for: leaders moved, followers truncated diverging logs, the
    # ISR shrank and grew, and waiting writes failed in each way a leader fails them.
    assert elections > len(SEEDS) and truncations > len(SEEDS) // 2
    assert isr_changes > len(SEEDS)
    assert write_errors == {
        "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
        "NOT_LEADER_OR_FOLLOWER",
        "REQUEST_TIMED_OUT",
    }
    assert acknowledged > 10 * len(SEEDS)


def test_a_seed_replays_exactly() -> None:
    options = SimOptions(seed=4242, brokers=5)
    first, second = run_seed(options), run_seed(options)
    assert first.failure is None
    assert first == second


# Each deliberate bug (tidelog.testing.replication_mutants), a seed that catches it, and what
# the checker reports. The seeds were found by running the mutant over seeds 0, 1, 2, ...
CAUGHT = [
    # KIP-101: a follower truncated to its stale high watermark, then led without the
    # committed entries it had dropped.
    ("truncate-to-hw", 24, "lacks committed offset"),
    # KIP-279: after a fast double failover the follower kept a piece of another epoch below
    # the high watermark.
    ("ignore-own-epoch-end", 158, "holds another batch at committed offset"),
    # KIP-966: the last replica standing committed alone.
    ("no-strict-min-isr", 0, "only 1 replicas hold offset"),
    ("unflushed-ack", 0, "only 1 replicas hold offset"),
    ("count-diverging-fetch", 0, "only 1 replicas hold offset"),
    ("hw-skips-silent-isr", 167, "lacks committed offset"),
]


@pytest.mark.parametrize(("mutant", "seed", "report"), CAUGHT)
def test_the_checker_catches_a_broken_rule(mutant: str, seed: int, report: str) -> None:
    result = run_seed(SimOptions.for_seed(seed, mutant))
    assert result.failure is not None and report in result.failure
    # The same seed without the bug passes.
    assert run_seed(SimOptions.for_seed(seed)).failure is None


def test_a_failing_seed_prints_the_command_that_replays_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    mutant, seed, report = CAUGHT[1]
    assert _main(["--seed", str(seed), "--mutant", mutant]) == 1
    out = capsys.readouterr().out
    replay = SimOptions.for_seed(seed, mutant).replay_command()
    assert f"replay: {replay}" in out and report in out
    argv = replay.split()[3:]
    assert _main(argv) == 1
    assert report in capsys.readouterr().out


def test_the_soak_command_reports_a_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert _main(["--seeds", "20", "--start", "5000", "--progress", "10"]) == 0
    out = capsys.readouterr().out
    assert "10 seeds, 0 failed" in out and "summary: 20 seeds, 0 failed" in out


def last_replica_standing(replica_class: type[Replica]) -> tuple[int, int]:
    """KIP-966's scenario in Kafka's acknowledgement mode: the ISR has shrunk to the leader
    alone, which takes writes, loses power and, as the last ISR member, is elected again.
    Returns (the high watermark consumers saw, the new leader's log end offset)."""
    log = SimReplicaLog()
    config = ReplicaConfig(1, min_insync_replicas=2, ack_after_fsync=False)
    leader = replica_class(log, config)
    leader.become_leader(3, 7, (1, 2, 3), (1,), now_ms=0)
    for value in (b"a", b"b"):
        builder = BatchBuilder()
        builder.append(None, value, timestamp=0)
        assert leader.append(builder.close(), acks=1, now_ms=0, timeout_ms=100).token is None
    seen = leader.high_watermark
    log.crash()
    again = replica_class(log, config)
    again.become_leader(4, 8, (1, 2, 3), (1,), now_ms=10)
    return seen, log.log_end_offset


def test_the_last_replica_standing_commits_nothing_it_could_lose_kip_966() -> None:
    # With strict min ISR nothing was committed, so the power loss took nothing committed.
    assert last_replica_standing(Replica) == (0, 0)
    # Without it consumers saw offsets 0-1 as committed, and the re-elected leader lacks them.
    assert last_replica_standing(MUTANTS["no-strict-min-isr"]) == (2, 0)
