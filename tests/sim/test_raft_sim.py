"""The deterministic simulation of the metadata quorum: many seeds, each checked after every
event (see tidelog.testing.raft_sim), and proof that the checker catches broken rules."""

from __future__ import annotations

import pytest

from tidelog.testing.raft_sim import SimOptions, _main, run_seed

# At least 500 seeds on every run of the suite; the shapes cycle through 1-5 voters with and
# without an observer (SimOptions.for_seed).
SEEDS = range(1000)


def test_every_seed_keeps_every_invariant_and_commits_once_faults_stop() -> None:
    failures = []
    shapes = set()
    snapshots = 0
    for seed in SEEDS:
        result = run_seed(SimOptions.for_seed(seed))
        shapes.add((result.options.voters, result.options.observers))
        if result.failure is not None:
            failures.append(f"{result.failure}\n  replay: {result.options.replay_command()}")
        else:
            # Liveness: the run ends only when an entry proposed after the faults commits.
            assert result.committed > 0
            snapshots += result.snapshots
    assert failures == []
    assert shapes == {(v, o) for v in range(1, 6) for o in (0, 1)}
    assert snapshots > 0


def test_a_seed_replays_exactly() -> None:
    options = SimOptions(seed=4242, voters=5, observers=1)
    first, second = run_seed(options), run_seed(options)
    assert first.failure is None
    assert (first.events, first.proposals, first.committed, first.elections, first.end_ms) == (
        second.events,
        second.proposals,
        second.committed,
        second.elections,
        second.end_ms,
    )


# Each deliberate bug (tidelog.testing.raft_mutants), the seed that catches it, and what the
# checker reports. The seeds were found by running the mutant over seeds 0, 1, 2, ...
CAUGHT = [
    ("double-vote", 23, "has two leaders"),
    ("vote-for-stale-log", 3, "lacks committed offsets"),
    ("unflushed-fetch", 1, "voters hold offset"),
    ("unflushed-vote", 0, "epoch went from 1 to 0"),
    ("snapshot-past-commit", 1, "does not end at a committed offset"),
    ("split-operation", 1, "commits part of an operation"),
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
    mutant, seed, report = CAUGHT[0]
    assert _main(["--seed", str(seed), "--mutant", mutant]) == 1
    out = capsys.readouterr().out
    replay = SimOptions.for_seed(seed, mutant).replay_command()
    assert f"replay: {replay}" in out and report in out
    # The printed command, run again, fails the same way.
    argv = replay.split()[3:]
    assert _main(argv) == 1
    assert report in capsys.readouterr().out


def test_the_soak_command_reports_a_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert _main(["--seeds", "20", "--start", "5000", "--progress", "10"]) == 0
    out = capsys.readouterr().out
    assert "10 seeds, 0 failed" in out and "summary: 20 seeds, 0 failed" in out
