"""`tidelog consume --topic T`: print records, like kafka-console-consumer.

Without ``--group`` it reads every partition (or ``--partition P``) itself and commits nothing.
Where to start then: the end (default, as Kafka), ``--from-beginning``, ``--offset N`` (with
``--partition P``; also ``earliest``/``latest``) or ``--from-time`` (ISO 8601 or epoch ms).

With ``--group G`` it joins the group as a member (the group assigns the partitions), commits
what it printed as Kafka's console consumer does (auto commit every
``auto.commit.interval.ms``, and once more when it stops), and starts where the group
committed. ``--from-beginning`` then only matters for partitions the group has no committed
offset for (``auto.offset.reset=earliest``).

``--isolation-level read_committed`` prints only the records of committed transactions
(and stops at the last stable offset), as Kafka's console consumer does.

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

from tidelog.cli.output import UsageError, add_bootstrap, guarded, parse_pairs
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
    parser.add_argument(
        "--group", help="consume as a member of this group, committing offsets (default: none)"
    )
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true")
    start.add_argument("--offset", help="N, earliest or latest (needs --partition for N)")
    start.add_argument("--from-time", metavar="ISO8601|MS")
    parser.add_argument(
        "--isolation-level",
        choices=("read_uncommitted", "read_committed"),
        help="read_committed: only committed transactions' records, up to the last stable "
        "offset (default: read_uncommitted)",
    )
    parser.add_argument("--max-messages", type=int)
    parser.add_argument("--timeout-ms", type=int, help="stop when no record came for this long")
    parser.add_argument("--format", choices=("value", "kv", "json"), default="value")
    parser.add_argument("--key-separator", default="\t", help="for --format kv (default: tab)")
    parser.add_argument(
        "--consumer-property",
        action="append",
        default=[],
        metavar="K=V",
        help="any consumer configuration (repeatable)",
    )
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


def _check_group_flags(args: argparse.Namespace) -> None:
    if args.group is None:
        return
    chosen = [
        flag
        for flag, value in (
            ("--partition", args.partition),
            ("--offset", args.offset),
            ("--from-time", args.from_time),
        )
        if value is not None
    ]
    if chosen:
        raise UsageError(
            f"{chosen[0]} cannot be used with --group: the group assigns the partitions and "
            "they start at its committed offsets"
        )


def run(args: argparse.Namespace) -> int:
    _check_group_flags(args)
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
    config: dict[str, Any] = {"bootstrap.servers": args.bootstrap_server}
    config.update(parse_pairs(args.consumer_property, "--consumer-property"))
    # As in Kafka's console consumer, the flag decides auto.offset.reset; with a group it
    # applies only where the group has committed nothing.
    config["auto.offset.reset"] = (
        "earliest" if args.from_beginning or offset == "earliest" else "latest"
    )
    if args.group is not None:
        config["group.id"] = args.group
    if args.isolation_level is not None:
        config["isolation.level"] = args.isolation_level
    count = 0
    # Closing the consumer (also on --max-messages, --timeout-ms, Ctrl-C or a closed pipe)
    # commits what was handed out with auto commit, then leaves the group.
    with Consumer(config) as consumer:
        if args.partition is not None:
            partitions = [args.partition]
        else:
            partitions = consumer.partitions_for(args.topic)  # a missing topic fails here
        if args.group is not None:
            consumer.subscribe([args.topic])
        else:
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
