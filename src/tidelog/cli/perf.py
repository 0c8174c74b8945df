"""`tidelog perf produce|consume`: client throughput (and producer latency), like Kafka's
perf-test tools.

    tidelog perf produce --topic T --num-records N --record-size S --throughput -1 \\
        [--producer-property k=v ...] [--bootstrap-server HOST:PORT]
    tidelog perf consume --topic T --messages N [--group G] [--consumer-property k=v ...] \\
        [--timeout MS] [--from-latest] [--show-detailed-stats] [--hide-header]

produce: every record carries the same random payload of ``--record-size`` bytes and no key.
``--throughput`` caps records per second (-1: as fast as the producer takes them). A record's
latency is the time from ``send()`` to its acknowledgement (its delivery callback); ``send()``
blocks while ``buffer.memory`` is full, as Kafka's does, so at full speed the latency is about
the time the broker takes to work off that buffer. As in Kafka's tool, the acknowledgements
drive the progress lines: the first one to come ``--reporting-interval`` ms or more after the
window began prints the window's records acknowledged, records/s, MB/s (10^6 bytes of values)
and average / max latency. The last line is the summary over the whole run with latency
percentiles, in the words Kafka's tool uses.

consume: reads exactly ``--messages`` records of the topic, from the beginning (or, with
``--from-latest``, only records produced after it started). Without ``--group`` it assigns
every partition itself (no group, rebalance time 0); with ``--group`` it subscribes as a member
of that group and starts where the group committed. Bytes are those of keys and values; MB
here is 2^20 bytes, as in Kafka's tool, so that figures compare. While it runs, a progress line
goes to standard error every ``--reporting-interval`` ms (window records/s and MB/s, and the
total so far); with ``--show-detailed-stats`` each window is instead a row of Kafka's detailed
columns on standard output. Last, on standard output, a header (unless ``--hide-header``) and
one summary row, as Kafka's tool prints them::

    start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec,
    rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec

Times are ``yyyy-MM-dd HH:mm:ss:SSS`` local time; the run ends when the last record arrives;
rebalance time is from subscribing to the first assignment, fetch time the rest of the run,
and fetch.* rates are over the fetch time. When no record arrives for ``--timeout`` ms (default
10000, as Kafka's tool) before all ``--messages`` have, the summary is printed and the command
fails (exit 1) saying how many arrived.
"""

from __future__ import annotations

import argparse
import datetime
import random
import sys
import time
from array import array
from collections.abc import Sequence
from functools import partial
from operator import attrgetter
from typing import Any, TextIO

from tidelog.cli.output import UsageError, add_bootstrap, fail, guarded, parse_pairs
from tidelog.client import (
    ClientError,
    Consumer,
    ConsumerRecord,
    Producer,
    RebalanceListener,
    RecordMetadata,
    TopicPartition,
)
from tidelog.client.aio.producer import DeliveryCallback
from tidelog.client.config import parse_config

MIB = 1024 * 1024
SUMMARY_COLUMNS = (
    "start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, "
    "rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec"
)
DETAILED_COLUMNS = (
    "time, threadId, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, "
    "rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec"
)


def add_parser(commands: Any) -> None:
    perf = commands.add_parser(
        "perf",
        help="measure producer and consumer throughput",
        description="Performance tests, like Kafka's perf-test tools.",
    )
    tests = perf.add_subparsers(dest="perf_command", metavar="TEST", required=True)
    produce = tests.add_parser(
        "produce",
        help="produce fixed-size records as fast as allowed",
        description="Produce --num-records records of --record-size bytes and report "
        "throughput and latency.",
    )
    add_bootstrap(produce)
    produce.add_argument("--topic", required=True)
    produce.add_argument("--num-records", type=int, required=True)
    produce.add_argument("--record-size", type=int, required=True, help="bytes per value")
    produce.add_argument(
        "--throughput",
        type=float,
        required=True,
        help="records per second at most; -1 for no limit",
    )
    _add_properties(produce, "producer")
    _add_reporting_interval(produce)
    produce.set_defaults(run=guarded("perf produce", run_produce))

    consume = tests.add_parser(
        "consume",
        help="consume a number of records as fast as they come",
        description="Consume --messages records of a topic and report throughput.",
    )
    add_bootstrap(consume)
    consume.add_argument("--topic", required=True)
    consume.add_argument("--messages", type=int, required=True, help="records to consume")
    consume.add_argument("--group", help="consume as a member of this group (default: no group)")
    _add_properties(consume, "consumer")
    _add_reporting_interval(consume)
    consume.add_argument(
        "--timeout",
        type=int,
        default=10_000,
        metavar="MS",
        help="give up when no record came for this long (default 10000)",
    )
    consume.add_argument(
        "--from-latest",
        action="store_true",
        help="only records produced after the start (default: from the beginning)",
    )
    consume.add_argument(
        "--show-detailed-stats",
        action="store_true",
        help="a row of statistics per reporting interval on standard output",
    )
    consume.add_argument("--hide-header", action="store_true", help="no column header lines")
    consume.set_defaults(run=guarded("perf consume", run_consume))


def _add_properties(parser: argparse.ArgumentParser, kind: str) -> None:
    parser.add_argument(
        f"--{kind}-property",
        f"--{kind}-props",
        action="append",
        default=[],
        metavar="K=V",
        help=f"a {kind} configuration (repeatable)",
    )


def _add_reporting_interval(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--reporting-interval", type=int, default=5000, metavar="MS", help="default 5000"
    )


def _check_positive(**values: int) -> None:
    for flag, value in values.items():
        if value <= 0:
            raise UsageError(f"--{flag.replace('_', '-')} must be positive")


def _client_config(args: argparse.Namespace, properties: list[str], flag: str) -> dict[str, Any]:
    config: dict[str, Any] = {"bootstrap.servers": args.bootstrap_server}
    config.update(parse_pairs(properties, flag))
    return config


def throughput(count: int, nbytes: float, seconds: float, mb: float = 1e6) -> str:
    """``"<n> records/sec (<m> MB/sec)"`` for ``count`` records of ``nbytes`` in ``seconds``."""
    seconds = max(seconds, 1e-9)
    return f"{count / seconds:.1f} records/sec ({nbytes / mb / seconds:.2f} MB/sec)"


class Ticker:
    """Tells when the next reporting interval is due."""

    def __init__(self, interval_ms: int, now: float) -> None:
        self.interval = interval_ms / 1000
        self.next = now + self.interval

    def due(self, now: float) -> bool:
        if now < self.next:
            return False
        self.next = now + self.interval
        return True

    def left(self, now: float) -> float:
        return max(self.next - now, 0.0)


# -- produce -----------------------------------------------------------------------------------


class Stats:
    """Counts acknowledgements and latencies, and prints a window's line when an
    acknowledgement ends it (Kafka's tool does the same in its callback). Fed by delivery
    callbacks on the producer's thread only, until the producer is closed."""

    def __init__(self, record_size: int, out: TextIO, interval_ms: int) -> None:
        self.record_size = record_size
        self.out = out
        self.interval = interval_ms / 1000
        self.start = time.monotonic()
        self.latencies_ms = array("d")
        self.errors = 0
        self.first_error: ClientError | None = None
        self.window_start = self.start
        self.window_count = 0
        self.window_latency = 0.0
        self.window_max = 0.0
        self._delivered = self.delivered  # bound once: see callback()

    def callback(self, sent_at: float) -> DeliveryCallback:
        """The ``on_delivery`` of a record sent at ``sent_at``: a partial of one shared
        bound method, not a closure. Up to ``buffer.memory`` worth of these are alive at
        once, and the garbage collector's full collections walk them all: a partial is
        one object it tracks, a closure four (function, cell tuple, two cells)."""
        return partial(self._delivered, sent_at)

    def delivered(
        self, sent_at: float, error: ClientError | None, _: RecordMetadata | None
    ) -> None:
        if error is not None:
            self.errors += 1
            if self.first_error is None:
                self.first_error = error
            return
        now = time.monotonic()
        latency = (now - sent_at) * 1000
        self.latencies_ms.append(latency)
        self.window_count += 1
        self.window_latency += latency
        if latency > self.window_max:
            self.window_max = latency
        if now - self.window_start >= self.interval:
            self.report_window(now)

    def report_window(self, now: float) -> None:
        count = self.window_count
        print(
            f"{count} records sent, "
            f"{throughput(count, count * self.record_size, now - self.window_start)}, "
            f"{self.window_latency / count if count else 0.0:.1f} ms avg latency, "
            f"{self.window_max:.1f} ms max latency.",
            file=self.out,
            flush=True,
        )
        self.window_start = now
        self.window_count = 0
        self.window_latency = 0.0
        self.window_max = 0.0

    def summary(self) -> str:
        elapsed = time.monotonic() - self.start
        values = sorted(self.latencies_ms)
        count = len(values)

        def pct(p: float) -> float:
            return values[min(int(p * count), count - 1)] if count else 0.0

        return (
            f"{count} records sent, {throughput(count, count * self.record_size, elapsed)}, "
            f"{sum(values) / count if count else 0.0:.2f} ms avg latency, "
            f"{values[-1] if count else 0.0:.2f} ms max latency, "
            f"{pct(0.5):.0f} ms 50th, {pct(0.95):.0f} ms 95th, {pct(0.99):.0f} ms 99th, "
            f"{pct(0.999):.0f} ms 99.9th."
        )


def run_produce(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    _check_positive(num_records=args.num_records, reporting_interval=args.reporting_interval)
    if args.record_size < 0:
        raise UsageError("--record-size must not be negative")
    config = _client_config(args, args.producer_property, "--producer-property")
    rng = random.Random()
    payload = bytes(rng.randrange(65, 91) for _ in range(args.record_size))
    stats = Stats(args.record_size, out, args.reporting_interval)
    limit = args.throughput if args.throughput > 0 else None
    topic = args.topic
    with Producer(config) as producer:
        stats.start = stats.window_start = time.monotonic()
        clock = time.monotonic
        send = producer.send
        callback_for = stats.callback
        for i in range(args.num_records):
            now = clock()
            if limit is not None:
                due = stats.start + i / limit
                if due > now:
                    time.sleep(due - now)
                    now = clock()
            send(topic, payload, on_delivery=callback_for(now))
        # Every record ends acknowledged or failed (delivery.timeout.ms bounds the wait).
        producer.flush()
    if stats.window_count:
        stats.report_window(time.monotonic())
    print(stats.summary(), file=out, flush=True)
    if stats.errors:
        print(
            f"{stats.errors} records failed; the first: {stats.first_error}",
            file=sys.stderr,
        )
        return 1
    return 0


# -- consume -----------------------------------------------------------------------------------

_key_of = attrgetter("key")
_value_of = attrgetter("value")


def record_bytes(records: Sequence[ConsumerRecord]) -> int:
    """Bytes of the keys and values of ``records`` (None counts as nothing)."""
    return sum(map(len, filter(None, map(_key_of, records)))) + sum(
        map(len, filter(None, map(_value_of, records)))
    )


class FirstAssignment(RebalanceListener):
    """Notes when the group first gave this member partitions."""

    def __init__(self) -> None:
        self.at: float | None = None

    def on_assigned(self, partitions: list[TopicPartition]) -> None:
        if self.at is None:
            self.at = time.monotonic()


def _wall(moment: float, start_monotonic: float, start_wall: float) -> str:
    when = datetime.datetime.fromtimestamp(start_wall + (moment - start_monotonic))
    return when.strftime("%Y-%m-%d %H:%M:%S:") + f"{when.microsecond // 1000:03d}"


class ConsumeStats:
    """What was consumed so far, as a whole and in the current reporting window; the
    rebalance is the span from subscribing until the first assignment."""

    def __init__(self, now: float) -> None:
        self.start = self.window_start = self.last_record = now
        self.start_wall = time.time()
        self.rebalance_end = now
        self.count = self.nbytes = 0
        self.window_count = self.window_bytes = 0

    def add(self, records: Sequence[ConsumerRecord], now: float) -> None:
        if not records:
            return
        size = record_bytes(records)
        self.count += len(records)
        self.nbytes += size
        self.window_count += len(records)
        self.window_bytes += size
        self.last_record = now

    def _columns(
        self, count: int, nbytes: int, begin: float, end: float
    ) -> tuple[float, float, float, float]:
        """MB/s, records/s, rebalance ms and fetch ms of [begin, end]."""
        seconds = max(end - begin, 1e-9)
        rebalance = max(min(self.rebalance_end, end) - begin, 0.0)
        return nbytes / MIB / seconds, count / seconds, rebalance * 1000, (seconds - rebalance)

    def progress_line(self, now: float, total: int) -> str:
        return (
            f"{self.window_count} records consumed, "
            f"{throughput(self.window_count, self.window_bytes, now - self.window_start, MIB)}, "
            f"{self.count} of {total} in total."
        )

    def detailed_row(self, now: float) -> str:
        mb_s, n_s, rebalance_ms, fetch_s = self._columns(
            self.window_count, self.window_bytes, self.window_start, now
        )
        fetch = max(fetch_s, 1e-9)
        return (
            f"{_wall(now, self.start, self.start_wall)}, 0, {self.nbytes / MIB:.4f}, "
            f"{mb_s:.4f}, {self.count}, {n_s:.4f}, {rebalance_ms:.0f}, {fetch_s * 1000:.0f}, "
            f"{self.window_bytes / MIB / fetch:.4f}, {self.window_count / fetch:.4f}"
        )

    def end_window(self, now: float) -> None:
        self.window_start = now
        self.window_count = self.window_bytes = 0

    def summary_row(self) -> str:
        end = self.last_record
        mb_s, n_s, rebalance_ms, fetch_s = self._columns(self.count, self.nbytes, self.start, end)
        fetch = max(fetch_s, 1e-9)
        return (
            f"{_wall(self.start, self.start, self.start_wall)}, "
            f"{_wall(end, self.start, self.start_wall)}, {self.nbytes / MIB:.4f}, {mb_s:.4f}, "
            f"{self.count}, {n_s:.4f}, {rebalance_ms:.0f}, {fetch_s * 1000:.0f}, "
            f"{self.nbytes / MIB / fetch:.4f}, {self.count / fetch:.4f}"
        )


def _consume_config(args: argparse.Namespace) -> tuple[dict[str, Any], int]:
    config = _client_config(args, args.consumer_property, "--consumer-property")
    # As in Kafka's tool, the flag decides where a partition without a position starts.
    config["auto.offset.reset"] = "latest" if args.from_latest else "earliest"
    if args.group is not None:
        config["group.id"] = args.group
    # Checked here, before connecting; the poll size honours max.poll.records as Kafka's does.
    max_poll = int(parse_config("consumer", config)["max.poll.records"])
    return config, max_poll


def run_consume(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    _check_positive(
        messages=args.messages, reporting_interval=args.reporting_interval, timeout=args.timeout
    )
    config, max_poll = _consume_config(args)
    with Consumer(config) as consumer:
        partitions = consumer.partitions_for(args.topic)  # a missing topic fails here
        stats = ConsumeStats(time.monotonic())
        if args.group is None:
            consumer.assign([TopicPartition(args.topic, p) for p in partitions])
            listener = None
        else:
            listener = FirstAssignment()
            consumer.subscribe([args.topic], listener=listener)
        ticker = Ticker(args.reporting_interval, stats.start)
        if args.show_detailed_stats and not args.hide_header:
            print(DETAILED_COLUMNS, file=out, flush=True)
        idle_limit = args.timeout / 1000
        clock = time.monotonic
        now = stats.start
        while stats.count < args.messages:
            idle_left = stats.last_record + idle_limit - now
            if idle_left <= 0:
                break
            wanted = min(max_poll, args.messages - stats.count)
            records = consumer.poll(min(idle_left, ticker.left(now) + 0.001), max_records=wanted)
            now = clock()
            stats.add(records, now)
            if listener is not None:
                # Until the first assignment the whole run so far is rebalance time.
                stats.rebalance_end = now if listener.at is None else listener.at
            if ticker.due(now):
                _report(stats, now, args, out)
    if listener is not None and listener.at is not None:
        stats.rebalance_end = listener.at
    if stats.window_count:
        _report(stats, stats.last_record, args, out)
    if not args.hide_header:
        print(SUMMARY_COLUMNS, file=out)
    print(stats.summary_row(), file=out, flush=True)
    if stats.count < args.messages:
        return fail(
            "perf consume",
            f"only {stats.count} of {args.messages} records arrived: none came for "
            f"{args.timeout} ms (--timeout)",
        )
    return 0


def _report(stats: ConsumeStats, now: float, args: argparse.Namespace, out: TextIO) -> None:
    if args.show_detailed_stats:
        print(stats.detailed_row(now), file=out, flush=True)
    else:
        print(stats.progress_line(now, args.messages), file=sys.stderr, flush=True)
    stats.end_window(now)
