"""The `tidelog` command: one entry point, one subcommand per tool, like Kafka's scripts."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

from tidelog import __version__
from tidelog.cli import (
    acls,
    agent,
    cluster,
    configs,
    console,
    consume,
    dump_log,
    groups,
    leader_election,
    metadata_quorum,
    perf,
    produce,
    reassign_partitions,
    serve,
    storage,
    topics,
    transactions,
)

_NEGATIVE_NUMBER = re.compile(r"-\d+(\.\d*)?|-\.\d+")


class SubcommandParser(argparse.ArgumentParser):
    """The parser of one subcommand: it refuses options it does not know itself.

    argparse lets a subparser hand its unknown arguments back to the parser above
    (``parse_known_args``), which reports them with the top-level usage, and only after it
    has complained about any missing required option: ``tidelog consume --topik x`` said
    "usage: tidelog [-h] ..." or "--topic is required". Checking the options first, here,
    prints the subcommand's own usage and "unrecognized arguments", as Kafka's per-tool
    scripts do. Nested actions (``groups describe``) inherit this class; a parser that has
    subcommands stops looking at its first positional argument (the subcommand's name), so
    the innermost parser that owns an argument is the one that judges it."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        given = sys.argv[1:] if args is None else list(args)
        unknown = self._unknown_options(given)
        if unknown:
            self.error(f"unrecognized arguments: {' '.join(unknown)}")
        parsed, extras = super().parse_known_args(given, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras

    def _knows(self, arg: str) -> bool:
        name = arg.split("=", 1)[0]
        known = self._option_string_actions
        if name in known:
            return True
        if arg.startswith("--"):
            return self.allow_abbrev and any(o.startswith(name) for o in known)
        return arg[:2] in known  # -n5 style: a short option with its value attached

    def _unknown_options(self, args: list[str]) -> list[str]:
        has_subcommands = self._subparsers is not None
        unknown = []
        for arg in args:
            if arg == "--":
                break
            if not arg.startswith("-") or arg == "-" or _NEGATIVE_NUMBER.fullmatch(arg):
                if has_subcommands:
                    break
                continue
            if not self._knows(arg):
                unknown.append(arg)
        return unknown


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tidelog", description="Tidelog: a Kafka-compatible event streaming platform."
    )
    parser.add_argument("--version", action="version", version=f"tidelog {__version__}")
    commands: Any = parser.add_subparsers(
        dest="command", metavar="COMMAND", parser_class=SubcommandParser
    )

    serve.add_parser(commands)
    storage.add_parser(commands)
    cluster.add_parser(commands)
    metadata_quorum.add_parser(commands)
    topics.add_parser(commands)
    reassign_partitions.add_parser(commands)
    leader_election.add_parser(commands)
    produce.add_parser(commands)
    consume.add_parser(commands)
    configs.add_parser(commands)
    acls.add_parser(commands)
    groups.add_parser(commands)
    transactions.add_parser(commands)
    dump_log.add_parser(commands)
    perf.add_parser(commands)
    agent.add_parser(commands)
    console.add_parser(commands)
    return parser


def _stop_writing_stdout() -> None:
    """Point stdout at /dev/null once its reader has gone.

    Python ignores SIGPIPE, so a write to a closed pipe raises BrokenPipeError; that is what
    lets a command still close its clients (a group member commits and leaves) instead of
    dying mid-write. What is left in stdout's buffer would fail again when the interpreter
    flushes it at exit ("Exception ignored ... BrokenPipeError", status 120), so the buffer
    is sent to /dev/null instead."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help(sys.stderr)
        return 2
    try:
        status = int(args.run(args))
        # Output still buffered must reach the pipe here, where a closed reader is handled.
        sys.stdout.flush()
        return status
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `tidelog ... | head` closed our stdout early: Kafka's tools end quietly then.
        _stop_writing_stdout()
        return 0


if __name__ == "__main__":
    sys.exit(main())
