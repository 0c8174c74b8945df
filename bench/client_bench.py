"""Tidelog's Python client against confluent-kafka (librdkafka), same broker, same run.

    bench/client_bench.py                         # starts `tidelog serve` on a free port
    bench/client_bench.py --bootstrap-server H:P  # an already running broker
    bench/client_bench.py --quick                 # smaller counts

Producer section: each client sends ``--messages`` values of ``--record-size`` bytes (default
100 B, no key) to a fresh topic of ``--partitions`` partitions, as fast as its ``send`` /
``produce`` accepts them, with acks=all, idempotence on, linger.ms 5 and batch.size 1 MB for
both; the clock stops when ``flush()`` returns (the broker acknowledged the last record). The
two clients alternate for ``--rounds`` rounds and the best round of each is reported, so that
neither is judged on a moment when the machine was busy elsewhere. Both count failed
deliveries the same way, in an ``on_delivery`` callback, and keep nothing else per record.
With ``--tidelog-delivery futures`` ours instead keeps every future ``send`` returns and asks
each for its exception after ``flush()`` (work the confluent-kafka side does not do: 300,000
live futures also cost the garbage collector).

Consumer section: one topic of ``--partitions`` partitions is filled once (by
confluent-kafka's producer, ``--messages`` values of ``--record-size`` bytes, no key, no
compression); then each client reads it from the beginning to the end, alternating for
``--rounds`` rounds, best round reported. Neither joins a group: each assigns every partition
at its earliest offset (confluent-kafka needs a ``group.id`` to exist, a fresh one per round,
but with ``assign()`` and no commits no group is joined). Ours is the synchronous
``tidelog.client.Consumer`` calling ``poll(timeout, max_records=10_000)``; confluent-kafka
calls ``consume(num_messages=10_000, timeout=...)``, never asking for more records than
remain. Both count every record and add up the lengths of the values, so that each does the
work of touching every record; the sum must come out at ``messages * record_size``. Fetch
sizes are both clients' defaults (50 MB per fetch, 1 MB per partition); librdkafka's prefetch
queue is made deeper (as in ``broker_bench.py``) so that its one-second backoff on a full queue
does not slow it down. The clock runs from ``assign()`` to the last record.
``consumer_ratio`` = ours / confluent-kafka.

Sections are entries of ``SECTIONS``: a function taking the bench context and returning a
dict of figures. The last line of output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Context:
    bootstrap: str
    messages: int
    record_size: int
    partitions: int
    rounds: int
    errors: list[str] = field(default_factory=list)
    # "futures": ours keeps send()'s futures; "callback": it counts failures in on_delivery.
    tidelog_delivery: str = "callback"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_broker(data_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    tidelog = Path(sys.executable).parent / "tidelog"
    command = [str(tidelog), "serve", "--port", str(port), "--data-dir", str(data_dir)]
    log = (data_dir.parent / "broker.log").open("wb")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    bootstrap = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"tidelog serve exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc, bootstrap
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("tidelog serve did not listen within 30 s")


def create_topic(bootstrap: str, partitions: int) -> str:
    from tidelog.client import Admin, NewTopic

    name = f"client-bench-{uuid.uuid4().hex[:8]}"
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(name, partitions, 1)])
    return name


# -- producer ----------------------------------------------------------------------------------


def produce_tidelog(ctx: Context, topic: str) -> float:
    from tidelog.client import Producer

    value = os.urandom(ctx.record_size)
    config = {
        "bootstrap.servers": ctx.bootstrap,
        "linger.ms": 5,
        "batch.size": 1_000_000,
        "buffer.memory": max(64 << 20, ctx.messages * (ctx.record_size + 64)),
    }
    failed = 0

    def delivered(error: Any, _: Any) -> None:
        nonlocal failed
        if error is not None:
            failed += 1

    with Producer(config) as producer:
        producer.send(topic, b"warm-up").result()  # connections and metadata are ready
        send = producer.send
        start = time.perf_counter()
        if ctx.tidelog_delivery == "callback":
            for _ in range(ctx.messages):
                send(topic, value, on_delivery=delivered)
            futures: list[Any] = []
        else:
            futures = [send(topic, value) for _ in range(ctx.messages)]
        left = producer.flush(120)
        elapsed = time.perf_counter() - start
    failed += left + sum(1 for f in futures if f.exception() is not None)
    if failed:
        ctx.errors.append(f"tidelog producer: {failed} records not delivered")
    return ctx.messages / elapsed


def produce_confluent(ctx: Context, topic: str, *, warm_up: bool = True) -> float:
    from confluent_kafka import Producer

    value = os.urandom(ctx.record_size)
    failed = 0

    def delivered(error: Any, _: Any) -> None:
        nonlocal failed
        if error is not None:
            failed += 1

    producer = Producer(
        {
            "bootstrap.servers": ctx.bootstrap,
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "acks": "all",
            "enable.idempotence": True,
            "queue.buffering.max.messages": max(ctx.messages + 10, 100_000),
            "queue.buffering.max.kbytes": 2_097_151,
            "on_delivery": delivered,
        }
    )
    if warm_up:  # connections and metadata are ready before the clock starts
        producer.produce(topic, b"warm-up")
        producer.flush(30)
    produce = producer.produce
    poll = producer.poll
    start = time.perf_counter()
    for i in range(ctx.messages):
        produce(topic, value)
        if i % 10_000 == 0:
            poll(0)
    left = producer.flush(120)
    elapsed = time.perf_counter() - start
    if left or failed:
        ctx.errors.append(f"confluent-kafka producer: {left + failed} records not delivered")
    return ctx.messages / elapsed


Run = Callable[[Context, str], float]


def compare(
    ctx: Context, what: str, ratio_name: str, runs: dict[str, Run], topic: Callable[[], str]
) -> dict[str, Any]:
    """Best msg/s of each client over the rounds (alternating, on ``topic()``), and the ratio."""
    best = dict.fromkeys(runs, 0.0)
    for round_number in range(1, ctx.rounds + 1):
        for name, run in runs.items():
            rate = run(ctx, topic())
            print(f"  round {round_number} {name:16} {rate:12,.0f} msg/s", flush=True)
            best[name] = max(best[name], rate)
    ratio = best["tidelog"] / best["confluent-kafka"] if best["confluent-kafka"] else 0.0
    mb = ctx.record_size / 1e6
    print(
        f"{what}, {ctx.record_size} B records: tidelog {best['tidelog']:,.0f} msg/s "
        f"({best['tidelog'] * mb:.1f} MB/s), confluent-kafka {best['confluent-kafka']:,.0f} "
        f"msg/s ({best['confluent-kafka'] * mb:.1f} MB/s), {ratio_name} {ratio:.2f}x",
        flush=True,
    )
    return {
        "tidelog_msg_per_s": round(best["tidelog"]),
        "confluent_kafka_msg_per_s": round(best["confluent-kafka"]),
        ratio_name: round(ratio, 3),
        "record_size": ctx.record_size,
        "messages": ctx.messages,
    }


def producer_section(ctx: Context) -> dict[str, Any]:
    runs: dict[str, Run] = {"confluent-kafka": produce_confluent, "tidelog": produce_tidelog}
    figures = compare(
        ctx, "producer", "ratio", runs, lambda: create_topic(ctx.bootstrap, ctx.partitions)
    )
    figures["tidelog_delivery"] = ctx.tidelog_delivery
    return figures


# -- consumer ----------------------------------------------------------------------------------

# Records asked for per poll()/consume() call, the same for both clients.
POLL_RECORDS = 10_000
# A read that sees no record for this long has stalled (an error, not a figure).
STALL_SECONDS = 30.0


def fill_topic(ctx: Context, topic: str) -> None:
    """``ctx.messages`` records into ``topic``, written by confluent-kafka's producer."""
    errors = len(ctx.errors)
    produce_confluent(ctx, topic, warm_up=False)
    if len(ctx.errors) > errors:
        raise RuntimeError(f"filling {topic}: {ctx.errors[-1]}")


def _check_read(ctx: Context, name: str, count: int, total: int) -> None:
    if count != ctx.messages or total != ctx.messages * ctx.record_size:
        ctx.errors.append(
            f"{name} consumer: read {count} records / {total} value bytes, "
            f"expected {ctx.messages} / {ctx.messages * ctx.record_size}"
        )


def consume_tidelog(ctx: Context, topic: str) -> float:
    from tidelog.client import Consumer, TopicPartition

    expected = ctx.messages
    count = total = 0
    config = {"bootstrap.servers": ctx.bootstrap, "auto.offset.reset": "earliest"}
    with Consumer(config) as consumer:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for(topic)]
        poll = consumer.poll
        start = last_progress = time.perf_counter()
        consumer.assign(partitions)
        while count < expected:
            records = poll(1.0, max_records=min(POLL_RECORDS, expected - count))
            for record in records:
                total += len(record.value)
            count += len(records)
            now = time.perf_counter()
            if records:
                last_progress = now
            elif now - last_progress > STALL_SECONDS:
                break
        elapsed = time.perf_counter() - start
    _check_read(ctx, "tidelog", count, total)
    return count / elapsed


def consume_confluent(ctx: Context, topic: str) -> float:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    expected = ctx.messages
    count = total = 0
    consumer = Consumer(
        {
            "bootstrap.servers": ctx.bootstrap,
            "group.id": f"client-bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "queued.min.messages": 1_000_000,
            "queued.max.messages.kbytes": 262_144,
            "fetch.queue.backoff.ms": 10,
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=10)
        partitions = [
            TopicPartition(topic, p, OFFSET_BEGINNING) for p in metadata.topics[topic].partitions
        ]
        consume = consumer.consume
        start = last_progress = time.perf_counter()
        consumer.assign(partitions)
        while count < expected:
            # consume() waits out its timeout for a full batch: never ask for more than remain.
            messages = consume(num_messages=min(POLL_RECORDS, expected - count), timeout=1.0)
            for message in messages:
                if message.error() is not None:
                    ctx.errors.append(f"confluent-kafka consumer: {message.error()}")
                    continue
                count += 1
                total += len(message.value())
            now = time.perf_counter()
            if messages:
                last_progress = now
            elif now - last_progress > STALL_SECONDS:
                break
        elapsed = time.perf_counter() - start
    finally:
        consumer.close()
    _check_read(ctx, "confluent-kafka", count, total)
    return count / elapsed


def consumer_section(ctx: Context) -> dict[str, Any]:
    topic = create_topic(ctx.bootstrap, ctx.partitions)
    fill_topic(ctx, topic)
    runs = {"confluent-kafka": consume_confluent, "tidelog": consume_tidelog}
    return compare(ctx, "consumer", "consumer_ratio", runs, lambda: topic)


SECTIONS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "producer": producer_section,
    "consumer": consumer_section,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap-server", help="use this broker instead of starting one")
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="50,000 messages, one round")
    parser.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated")
    parser.add_argument(
        "--tidelog-delivery",
        choices=["futures", "callback"],
        default="callback",
        help="producer: how ours counts failed deliveries (confluent-kafka: callback)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.messages, args.rounds = 50_000, 1
    workdir: Path | None = None
    broker: subprocess.Popen[bytes] | None = None
    try:
        if args.bootstrap_server:
            bootstrap = args.bootstrap_server
        else:
            workdir = Path(tempfile.mkdtemp(prefix="client-bench-"))
            (workdir / "data").mkdir()
            broker, bootstrap = start_broker(workdir / "data")
        ctx = Context(bootstrap, args.messages, args.record_size, args.partitions, args.rounds)
        ctx.tidelog_delivery = args.tidelog_delivery
        results: dict[str, Any] = {"bootstrap": bootstrap}
        for name in args.sections.split(","):
            if name not in SECTIONS:
                parser.error(f"unknown section {name!r}; known: {', '.join(SECTIONS)}")
            print(f"== {name}", flush=True)
            results[name] = SECTIONS[name](ctx)
        results["errors"] = ctx.errors
        print(json.dumps(results))
        return 1 if ctx.errors else 0
    finally:
        if broker is not None:
            broker.send_signal(signal.SIGTERM)
            try:
                broker.wait(15)
            except subprocess.TimeoutExpired:
                broker.kill()
                broker.wait()
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
