"""`tidelog produce --topic T`: one record per line of stdin, like kafka-console-producer.

Keys: ``--property parse.key=true --property key.separator=:`` (Kafka's way; the separator
defaults to a tab) or simply ``--key-separator :``. A line without the separator is an error
when keys are parsed, as in Kafka. ``--header k=v`` adds headers to every record. At most
``_WINDOW`` records are unacknowledged at once, so memory stays bounded on endless input; a
person watching a terminal sees a progress line on stderr.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import deque
from concurrent.futures import Future
from typing import Any, BinaryIO

from tidelog.cli.output import UsageError, add_bootstrap, guarded, parse_pairs
from tidelog.client import Producer, RecordMetadata

_WINDOW = 10_000
_PROGRESS_EVERY_S = 0.5
_PROPERTIES = ("parse.key", "key.separator", "ignore.error")


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "produce",
        help="send lines of stdin as records",
        description="Send each line of standard input to a topic as one record.",
    )
    add_bootstrap(parser)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partition", type=int, help="default: chosen by the partitioner")
    parser.add_argument(
        "--property",
        action="append",
        default=[],
        metavar="K=V",
        help="parse.key=true, key.separator=SEP",
    )
    parser.add_argument("--key-separator", help="split each line into key SEP value")
    parser.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="K=V",
        help="header added to every record (repeatable)",
    )
    parser.add_argument(
        "--compression", default="none", choices=("none", "gzip", "snappy", "lz4", "zstd")
    )
    parser.add_argument("--acks", default="all", choices=("all", "-1", "0", "1"))
    parser.add_argument("--linger-ms", type=int, default=5)
    parser.add_argument(
        "--producer-property",
        action="append",
        default=[],
        metavar="K=V",
        help="any producer configuration (repeatable)",
    )
    parser.set_defaults(run=guarded("produce", run))


def _key_separator(args: argparse.Namespace) -> bytes | None:
    props = parse_pairs(args.property, "--property")
    unknown = sorted(set(props) - set(_PROPERTIES))
    if unknown:
        raise UsageError(f"--property {unknown[0]}: expected one of {', '.join(_PROPERTIES)}")
    if args.key_separator is not None:
        if not args.key_separator:
            raise UsageError("--key-separator must not be empty")
        return str(args.key_separator).encode()
    if props.get("parse.key", "false").lower() == "true":
        separator = props.get("key.separator", "\t")
        if not separator:
            raise UsageError("key.separator must not be empty")
        return separator.encode()
    return None


def run(args: argparse.Namespace, stdin: BinaryIO | None = None) -> int:
    separator = _key_separator(args)
    headers = [(k, v.encode()) for k, v in parse_pairs(args.header, "--header").items()]
    config: dict[str, Any] = {
        "bootstrap.servers": args.bootstrap_server,
        "compression.type": args.compression,
        "acks": args.acks,
        "linger.ms": args.linger_ms,
    }
    config.update(parse_pairs(args.producer_property, "--producer-property"))
    source = stdin if stdin is not None else sys.stdin.buffer
    progress = sys.stderr.isatty()
    pending: deque[Future[RecordMetadata]] = deque()
    sent = 0
    last_report = time.monotonic()
    with Producer(config) as producer:
        for number, raw in enumerate(source, 1):
            line = raw.rstrip(b"\n").rstrip(b"\r")
            key = None
            if separator is not None:
                key, found, value = line.partition(separator)
                if not found:
                    raise UsageError(f"line {number} has no key separator {separator.decode()!r}")
            else:
                value = line
            pending.append(
                producer.send(args.topic, value, key=key, headers=headers, partition=args.partition)
            )
            while len(pending) > _WINDOW or (pending and pending[0].done()):
                pending.popleft().result()
                sent += 1
            if progress and time.monotonic() - last_report >= _PROGRESS_EVERY_S:
                last_report = time.monotonic()
                print(
                    f"\r{sent} records acknowledged, {len(pending)} in flight",
                    end="",
                    file=sys.stderr,
                    flush=True,
                )
        producer.flush()
        while pending:
            pending.popleft().result()
            sent += 1
    if progress and sent:
        print(f"\r{sent} records acknowledged{' ' * 20}", file=sys.stderr)
    return 0
