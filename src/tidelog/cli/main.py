"""The `tidelog` command: one entry point, one subcommand per tool, like Kafka's scripts."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tidelog import __version__
from tidelog.cli import agent, configs, consume, dump_log, groups, perf, produce, serve, topics


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tidelog", description="Tidelog: a Kafka-compatible event streaming platform."
    )
    parser.add_argument("--version", action="version", version=f"tidelog {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve.add_parser(commands)
    topics.add_parser(commands)
    produce.add_parser(commands)
    consume.add_parser(commands)
    configs.add_parser(commands)
    groups.add_parser(commands)
    dump_log.add_parser(commands)
    perf.add_parser(commands)
    agent.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `tidelog dump-log ... | head` closes our stdout early; that is not an error.
        return 0


if __name__ == "__main__":
    sys.exit(main())
