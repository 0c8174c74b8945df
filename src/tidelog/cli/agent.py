"""`tidelog agent`: run the reliable event agent as a daemon, or show its queues.

``tidelog agent --bootstrap-server H:P --data-dir DIR --socket PATH [--config FILE]`` serves
the agent on a Unix socket until SIGTERM or SIGINT. The config file holds ``key=value`` lines
(agent and producer keys, see docs/agent.md); flags win over the file.
``tidelog agent status --socket PATH`` prints one row per queue (partition -1: the parked
events of a topic the cluster does not know yet; MOVED counts those moved to partitions).
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path
from typing import Any

from tidelog.cli.output import (
    DEFAULT_BOOTSTRAP,
    UsageError,
    fail,
    guarded,
    parse_pairs,
    print_table,
)
from tidelog.runtime.logs import LOG_FORMATS, configure_logging

_COLUMNS = (
    ("TOPIC", "topic"),
    ("PARTITION", "partition"),
    ("DEPTH", "depth"),
    ("BYTES", "bytes"),
    ("OLDEST(s)", "oldest_age_s"),
    ("APPENDED", "appended"),
    ("DELIVERED", "delivered"),
    ("MOVED", "moved"),
    ("IN-DOUBT", "in_doubt"),
    ("DUPS-AVOIDED", "duplicates_avoided"),
    ("DROPPED", "dropped"),
    ("REJECTED", "rejected"),
    ("RETRIES", "retries"),
    ("DISK", "disk_full"),
    ("LAST-ERROR", "last_error"),
)


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "agent",
        help="run the reliable event agent (or show its status)",
        description="Accept events on a Unix socket, store them durably, deliver them exactly "
        "once. 'tidelog agent status --socket PATH' shows the queues of a running agent.",
    )
    parser.add_argument("action", nargs="?", choices=("run", "status"), default="run")
    parser.add_argument("--bootstrap-server", metavar="HOST:PORT", help=DEFAULT_BOOTSTRAP)
    parser.add_argument("--data-dir", metavar="DIR", help="where the disk queues live")
    parser.add_argument("--socket", metavar="PATH", required=True, help="the Unix socket")
    parser.add_argument("--config", metavar="FILE", help="key=value lines")
    parser.add_argument(
        "--property", action="append", default=[], metavar="K=V", help="a config key (repeatable)"
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    parser.add_argument(
        "--log-format",
        default="text",
        choices=LOG_FORMATS,
        help="text lines, or one JSON object per line (as the broker's log.format)",
    )
    parser.set_defaults(run=guarded("agent", _run_checked))


def _run_checked(args: argparse.Namespace) -> int:
    from tidelog.agent import AgentError

    try:
        return run(args)
    except AgentError as exc:
        return fail("agent", exc)


def _read_config(path: str) -> dict[str, str]:
    values: dict[str, str] = {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    for number, line in enumerate(text.splitlines(), 1):
        text = line.strip()
        if not text or text.startswith(("#", "!")):
            continue
        name, sep, value = text.partition("=")
        if not sep:
            raise UsageError(f"{path}:{number}: expected key=value")
        values[name.strip()] = value.strip()
    return values


def run(args: argparse.Namespace) -> int:
    if args.action == "status":
        return _status(args)
    configure_logging(args.log_level, args.log_format)
    config: dict[str, Any] = _read_config(args.config) if args.config else {}
    config.update(parse_pairs(args.property, "--property"))
    if args.bootstrap_server:
        config["bootstrap.servers"] = args.bootstrap_server
    config.setdefault("bootstrap.servers", DEFAULT_BOOTSTRAP)
    if args.data_dir:
        config["data.dir"] = args.data_dir
    if not config.get("data.dir"):
        raise UsageError("--data-dir (or data.dir in --config) is required")
    from tidelog.agent import Agent, AgentServer

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    agent = Agent(config)
    server = AgentServer(agent, args.socket)
    try:
        server.start()
        logging.getLogger("tidelog.agent").info("agent serving on %s", args.socket)
        # Wake up now and then: a signal handler runs only between bytecodes of this thread.
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
        agent.close()
    return 0


def _status(args: argparse.Namespace) -> int:
    from tidelog.agent import AgentClient

    with AgentClient(args.socket, timeout=10) as client:
        queues = client.status()["queues"]
    print_table([h for h, _ in _COLUMNS], [[_cell(q, k) for _, k in _COLUMNS] for q in queues])
    return 0


def _cell(queue: dict[str, Any], key: str) -> Any:
    value = queue.get(key, "")
    if key == "disk_full":
        return "FULL" if value else "ok"
    return value
