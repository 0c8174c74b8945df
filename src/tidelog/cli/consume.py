"""`tidelog consume --topic T`: print records, like kafka-console-consumer (no group).

Where to start: the end (default, as Kafka), ``--from-beginning``, ``--offset N`` (with
``--partition P``; also ``earliest``/``latest``) or ``--from-time`` (ISO 8601 or epoch ms).
Stops after ``--max-messages`` records, or once no record arrived for ``--timeout-ms``.
``--format json`` prints one object per line; keys, values and header values that are not
UTF-8 are printed as ``{"base64": "..."}``.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import sys
import time
from typing import Any

from tidelog.cli.output import UsageError, add_bootstrap, guarded
from tidelog.client import Consumer, ConsumerRecord, TopicPartition


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "consume",
        help="print records of a topic",
        description="Print the records of a topic (or one partition) to standard output.",
    )
    add_bootstrap(parser)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partition", type=int, help="default: every partition")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true")
    start.add_argument("--offset", help="N, earliest or latest (needs --partition for N)")
    start.add_argument("--from-time", metavar="ISO8601|MS")
    parser.add_argument("--max-messages", type=int)
    parser.add_argument("--timeout-ms", type=int, help="stop when no record came for this long")
    parser.add_argument("--format", choices=("value", "kv", "json"), default="value")
    parser.add_argument("--key-separator", default="\t", help="for --format kv (default: tab)")
    parser.set_defaults(run=guarded("consume", run))


def parse_time(text: str) -> int:
    """Epoch milliseconds of ``text``: an integer, or an ISO 8601 time (UTC when no zone)."""
    stripped = text.strip()
    if stripped.lstrip("-").isdigit():
        return int(stripped)
    try:
        moment = datetime.datetime.fromisoformat(stripped.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"--from-time {text!r}: expected ISO 8601 or epoch milliseconds") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)


def _text(data: bytes | None) -> Any:
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def _plain(data: bytes | None) -> str:
    return "null" if data is None else data.decode("utf-8", "backslashreplace")


def render(record: ConsumerRecord, fmt: str, key_separator: str = "\t") -> str:
    if fmt == "value":
        return _plain(record.value)
    if fmt == "kv":
        return f"{_plain(record.key)}{key_separator}{_plain(record.value)}"
    return json.dumps(
        {
            "topic": record.topic,
            "partition": record.partition,
            "offset": record.offset,
            "timestamp": record.timestamp,
            "key": _text(record.key),
            "value": _text(record.value),
            "headers": [[k, _text(v)] for k, v in record.headers],
        },
        ensure_ascii=False,
    )


def run(args: argparse.Namespace) -> int:
    offset: int | str | None = None
    if args.offset is not None:
        if args.offset in ("earliest", "latest"):
            offset = args.offset
        elif args.offset.isdigit():
            if args.partition is None:
                raise UsageError("--offset N needs --partition")
            offset = int(args.offset)
        else:
            raise UsageError(f"--offset {args.offset!r}: expected N, earliest or latest")
    from_time = None if args.from_time is None else parse_time(args.from_time)
    reset = "earliest" if args.from_beginning or offset == "earliest" else "latest"
    config = {"bootstrap.servers": args.bootstrap_server, "auto.offset.reset": reset}
    count = 0
    with Consumer(config) as consumer:
        if args.partition is not None:
            partitions = [args.partition]
        else:
            partitions = consumer.partitions_for(args.topic)
        tps = [TopicPartition(args.topic, p) for p in partitions]
        consumer.assign(tps)
        if isinstance(offset, int):
            consumer.seek(tps[0], offset)
        elif from_time is not None:
            consumer.seek_to_timestamp(from_time)
        idle_since = time.monotonic()
        out = sys.stdout
        while args.max_messages is None or count < args.max_messages:
            wait = 0.5
            if args.timeout_ms is not None:
                left = args.timeout_ms / 1000 - (time.monotonic() - idle_since)
                if left <= 0:
                    break
                wait = min(wait, left)
            limit = None if args.max_messages is None else args.max_messages - count
            records = consumer.poll(wait, max_records=limit)
            if records:
                idle_since = time.monotonic()
            for record in records:
                out.write(render(record, args.format, args.key_separator) + "\n")
            count += len(records)
            out.flush()
    print(f"Processed a total of {count} messages", file=sys.stderr)
    return 0
