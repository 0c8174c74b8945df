"""`tidelog serve`: run a single-node broker (controller and broker in one process)."""

from __future__ import annotations

import argparse
import faulthandler
import logging
import signal
import sys
from typing import Any

from tidelog.metadata.configs import BrokerConfig
from tidelog.metadata.errors import ConfigError
from tidelog.runtime.logs import configure_logging, set_log_format


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "serve",
        help="start a single-node broker",
        description=(
            "Start a single-node broker: controller and broker in one process, "
            "listening on 127.0.0.1:9092 with data under ./tidelog-data unless told otherwise."
        ),
    )
    parser.add_argument("--config", metavar="FILE", help="a server.properties-style file")
    parser.add_argument("--data-dir", metavar="DIR", help="where the logs live (log.dirs)")
    parser.add_argument("--host", default=None, help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="port to listen on (default 9092)")
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a broker config, e.g. --override num.partitions=3 (repeatable)",
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    parser.set_defaults(run=run)


def _flags(args: argparse.Namespace) -> dict[str, str | None]:
    flags: dict[str, str | None] = {"log.dirs": args.data_dir}
    if args.port is not None or args.host is not None:
        if args.port is not None and not 0 < args.port < 65536:
            raise ConfigError("--port", args.port, "must be between 1 and 65535")
        host = args.host or "127.0.0.1"
        port = args.port if args.port is not None else 9092
        bracketed = f"[{host}]" if ":" in host else host
        flags["listeners"] = f"PLAINTEXT://{bracketed}:{port}"
    return flags


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    # `kill -USR1 <pid>` writes every thread's stack to stderr: how to see what a stuck
    # broker waits on (where a JVM broker's operator would take a jstack).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        config = BrokerConfig.load(args.config, args.override, _flags(args))
    except (ConfigError, OSError) as exc:
        print(f"tidelog serve: {exc}", file=sys.stderr)
        return 2
    set_log_format(config.get_str("log.format") or "text")
    for warning in config.warnings:
        logging.getLogger("tidelog.serve").warning("%s", warning)
    from tidelog.broker.app import StartupError, StopError, run_broker

    try:
        run_broker(config)
    except StartupError as exc:
        # One line, after whatever the start had opened was closed again.
        print(f"tidelog serve: cannot start: {exc}", file=sys.stderr)
        return 1
    except StopError as exc:
        print(f"tidelog serve: {exc}", file=sys.stderr)
        return 1
    return 0
