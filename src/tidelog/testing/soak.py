"""The command-line loop both deterministic simulations share: run one seed (and describe
it) or soak many, print every failure with the command that replays it, and a summary."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, TypeVar


class _Options(Protocol):
    def replay_command(self) -> str: ...


class SeedResult(Protocol):
    @property
    def options(self) -> _Options: ...

    @property
    def events(self) -> int: ...

    @property
    def failure(self) -> str | None: ...


R = TypeVar("R", bound=SeedResult)


def soak_parser(
    prog: str, description: str, *, fault_ms: int, mutants: Iterable[str]
) -> argparse.ArgumentParser:
    """The options every simulation takes; the caller adds its cluster shape options."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--seed", type=int, help="run this one seed")
    parser.add_argument("--seeds", type=int, help="run this many seeds (a soak)")
    parser.add_argument("--start", type=int, default=0, help="first seed of a soak")
    parser.add_argument("--fault-ms", type=int, default=fault_ms)
    parser.add_argument("--mutant", choices=sorted(mutants), help="break one rule on purpose")
    parser.add_argument("--progress", type=int, default=1000, help="print progress every N seeds")
    return parser


def seeds_of(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Sequence[int]:
    """The seeds ``--seed`` or ``--seeds``/``--start`` name (exactly one must be given)."""
    if (args.seed is None) == (args.seeds is None):
        parser.error("give exactly one of --seed and --seeds")
    if args.seed is not None:
        return [args.seed]
    return range(args.start, args.start + args.seeds)


def run_seeds(
    seeds: Sequence[int],
    run: Callable[[int], R],
    *,
    describe: Callable[[R], str],
    tally: tuple[str, Callable[[R], int]],
    progress: int,
) -> int:
    """Run ``seeds``; 1 when one failed. A single seed is described when it passes;
    ``tally`` names a count summed over the seeds for the summary."""
    label, count_of = tally
    started = time.monotonic()
    failures = events = counted = 0
    for count, seed in enumerate(seeds, 1):
        result = run(seed)
        events += result.events
        counted += count_of(result)
        if result.failure is not None:
            failures += 1
            print(f"FAIL seed {seed}: {result.failure}")
            print(f"  replay: {result.options.replay_command()}")
        elif len(seeds) == 1:
            print(f"ok seed {seed}: {describe(result)}")
        if len(seeds) > 1 and count % progress == 0:
            elapsed = time.monotonic() - started
            print(
                f"{count} seeds, {failures} failed, {elapsed:.0f} s ({count / elapsed:.1f}/s)",
                flush=True,
            )
    elapsed = time.monotonic() - started
    total = len(seeds)
    print(
        f"summary: {total} seeds, {failures} failed, {events} events, {counted} {label}, "
        f"{elapsed:.1f} s ({total / max(elapsed, 1e-9):.1f} seeds/s)"
    )
    return 1 if failures else 0
