"""`tidelog perf produce`: producer throughput and latency, like Kafka's producer perf test.

    tidelog perf produce --topic T --num-records N --record-size S --throughput -1 \\
        [--producer-property k=v ...] [--bootstrap-server HOST:PORT]

Every record carries the same random payload of ``--record-size`` bytes and no key.
``--throughput`` caps records per second (-1: as fast as the producer takes them). A record's
latency is the time from ``send()`` to its acknowledgement (its delivery callback). Every
``--reporting-interval`` ms a line gives the window's records/s, MB/s (10^6 bytes of values)
and average / max latency; the last line is the summary over the whole run with latency
percentiles, in the words Kafka's tool uses.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from array import array
from typing import Any, TextIO

from tidelog.cli.output import UsageError, add_bootstrap, guarded, parse_pairs
from tidelog.client import ClientError, Producer, RecordMetadata


def add_parser(commands: Any) -> None:
    perf = commands.add_parser(
        "perf",
        help="measure producer throughput and latency",
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
    produce.add_argument(
        "--producer-property",
        "--producer-props",
        action="append",
        default=[],
        metavar="K=V",
        help="a producer configuration (repeatable)",
    )
    produce.add_argument(
        "--reporting-interval", type=int, default=5000, metavar="MS", help="default 5000"
    )
    produce.set_defaults(run=guarded("perf produce", run_produce))


class Stats:
    """Counts acknowledgements and latencies; fed by delivery callbacks on the producer's
    thread, read by the reporting thread (whole-int updates, safe under the GIL)."""

    def __init__(self, record_size: int, out: TextIO) -> None:
        self.record_size = record_size
        self.out = out
        self.start = time.monotonic()
        self.latencies_ms = array("d")
        self.errors = 0
        self.first_error: ClientError | None = None
        self.window_start = self.start
        self.window_count = 0
        self.window_latency = 0.0
        self.window_max = 0.0

    def callback(self, sent_at: float) -> Any:
        def delivered(error: ClientError | None, _: RecordMetadata | None) -> None:
            if error is not None:
                self.errors += 1
                if self.first_error is None:
                    self.first_error = error
                return
            latency = (time.monotonic() - sent_at) * 1000
            self.latencies_ms.append(latency)
            self.window_count += 1
            self.window_latency += latency
            if latency > self.window_max:
                self.window_max = latency

        return delivered

    def report_window(self) -> None:
        now = time.monotonic()
        elapsed = max(now - self.window_start, 1e-9)
        count = self.window_count
        rate = count / elapsed
        print(
            f"{count} records sent, {rate:.1f} records/sec "
            f"({rate * self.record_size / 1e6:.2f} MB/sec), "
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
        elapsed = max(time.monotonic() - self.start, 1e-9)
        values = sorted(self.latencies_ms)
        count = len(values)
        rate = count / elapsed

        def pct(p: float) -> float:
            return values[min(int(p * count), count - 1)] if count else 0.0

        return (
            f"{count} records sent, {rate:.1f} records/sec "
            f"({rate * self.record_size / 1e6:.2f} MB/sec), "
            f"{sum(values) / count if count else 0.0:.2f} ms avg latency, "
            f"{values[-1] if count else 0.0:.2f} ms max latency, "
            f"{pct(0.5):.0f} ms 50th, {pct(0.95):.0f} ms 95th, {pct(0.99):.0f} ms 99th, "
            f"{pct(0.999):.0f} ms 99.9th."
        )


def run_produce(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    if args.num_records <= 0:
        raise UsageError("--num-records must be positive")
    if args.record_size < 0:
        raise UsageError("--record-size must not be negative")
    if args.reporting_interval <= 0:
        raise UsageError("--reporting-interval must be positive")
    config: dict[str, Any] = {"bootstrap.servers": args.bootstrap_server}
    config.update(parse_pairs(args.producer_property, "--producer-property"))
    rng = random.Random()
    payload = bytes(rng.randrange(65, 91) for _ in range(args.record_size))
    interval = args.reporting_interval / 1000
    stats = Stats(args.record_size, out)
    limit = args.throughput if args.throughput > 0 else None
    topic = args.topic
    with Producer(config) as producer:
        stats.start = stats.window_start = time.monotonic()
        next_report = stats.start + interval
        clock = time.monotonic
        for i in range(args.num_records):
            now = clock()
            if limit is not None:
                due = stats.start + i / limit
                if due > now:
                    time.sleep(due - now)
                    now = clock()
            producer.send(topic, payload, on_delivery=stats.callback(now))
            if now >= next_report:
                stats.report_window()
                next_report = now + interval
        while producer.flush(max(next_report - clock(), 0.01)):
            if clock() >= next_report:
                stats.report_window()
                next_report = clock() + interval
    if stats.window_count:
        stats.report_window()
    print(stats.summary(), file=out, flush=True)
    if stats.errors:
        print(
            f"{stats.errors} records failed; the first: {stats.first_error}",
            file=sys.stderr,
        )
        return 1
    return 0
