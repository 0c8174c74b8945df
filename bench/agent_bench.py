"""Durable-acknowledgement latency and throughput of the agent, with baselines.

    .venv/bin/python bench/agent_bench.py [--events N] [--bootstrap HOST:PORT]

Starts a `tidelog serve` (unless --bootstrap is given) and an agent on temporary directories,
then times 100-byte events:

* in-process ``Agent.send`` with 1 and 8 sending threads (each call returns once durable);
* in-process ``Agent.send_many`` (1000 events per call);
* over the Unix socket to a ``tidelog agent`` daemon process: ``AgentClient.send`` with 1 and
  8 client threads (each connected before the clock starts), and pipelined
  ``AgentClient.submit_many`` calls of 1000 events, four in flight per client, from 1 and 8
  clients (a sample: from a call's submission until its events are acknowledged), and
  ``AsyncAgentClient.send_many`` calls of 1000 events, four in flight on one connection,
  beside ``AsyncAgentClient.send`` of one event, 1000 at a time on one connection;
* in-process ``Agent.send`` with the cluster unreachable (nothing delivered meanwhile);
* baselines: confluent-kafka ``produce()`` + ``flush()`` per event with acks=all against the
  same broker, and ``os.write`` + ``os.fdatasync`` per event on the same disk (measured twice:
  first, and after the agent without delivery).

Latency is per call (per event for one-event calls); p50/p99/p99.9 in microseconds. Events/s
counts the events acknowledged, until the last one is. Each
one-event scenario starts once the agents have delivered what earlier scenarios stored, so
that it runs beside the delivery of its own events only, not of a backlog of 100,000s. The
last line is JSON with every figure. Figures, never pass/fail.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from tidelog.agent import Agent, AgentClient, AgentError, AsyncAgentClient

VALUE = b"v" * 100


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_broker(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    tidelog = str(Path(sys.executable).parent / "tidelog")
    log = (workdir / "broker.log").open("wb")
    proc = subprocess.Popen(
        [tidelog, "serve", "--port", str(port), "--data-dir", str(workdir / "broker")],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc, f"127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("the broker did not start")


def start_daemon(workdir: Path, bootstrap: str) -> subprocess.Popen[bytes]:
    """`tidelog agent` in its own process, as applications would use it."""
    sock = workdir / "agent.sock"
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "tidelog"),
            "agent",
            "--bootstrap-server",
            bootstrap,
            "--data-dir",
            str(workdir / "daemon"),
            "--socket",
            str(sock),
            "--log-level",
            "WARNING",
        ]
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            AgentClient(sock).close()
            return proc
        except AgentError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("the agent daemon did not start")


def percentiles(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {"p50_us": 0.0, "p99_us": 0.0, "p999_us": 0.0}
    ordered = sorted(samples)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e6, 1)

    return {"p50_us": at(0.5), "p99_us": at(0.99), "p999_us": at(0.999)}


def run_threads(
    threads: int,
    work: Callable[[list[float]], int],
    setup: Callable[[], object] | None = None,
) -> tuple[float, list[float]]:
    """Run ``work`` on ``threads`` threads; (events/s, latency samples).

    ``work`` records its samples and returns how many events it had acknowledged, all of
    them by the time it returns: the rate counts events acknowledged, over the time from
    the start until the last thread is done. ``setup`` (a connection of the thread's own)
    runs on each thread before the clock starts."""
    latencies: list[list[float]] = [[] for _ in range(threads)]
    counts = [0] * threads
    ready = threading.Barrier(threads + 1)

    def run(i: int) -> None:
        if setup is not None:
            setup()
        ready.wait()
        counts[i] = work(latencies[i])

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    ready.wait()
    start = time.perf_counter()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - start
    merged = [x for lat in latencies for x in lat]
    return sum(counts) / elapsed, merged


def bench_single_calls(
    name: str,
    threads: int,
    events: int,
    send: Callable[[], object],
    setup: Callable[[], object] | None = None,
) -> dict[str, Any]:
    """One event per call; a sample is one call, which returns once its event is durable."""
    per_thread = events // threads

    def work(lat: list[float]) -> int:
        clock = time.perf_counter
        for _ in range(per_thread):
            t = clock()
            send()
            lat.append(clock() - t)
        return per_thread

    rate, samples = run_threads(threads, work, setup)
    return {"name": name, "threads": threads, "events_per_s": round(rate), **percentiles(samples)}


def bench_batches(
    name: str, threads: int, events: int, batch: int, send_batch: Callable[[int], object]
) -> dict[str, Any]:
    """``batch`` events per call; a sample is one call, which returns once all are durable."""
    calls = max(1, events // threads // batch)

    def work(lat: list[float]) -> int:
        clock = time.perf_counter
        for _ in range(calls):
            t = clock()
            send_batch(batch)
            lat.append(clock() - t)
        return calls * batch

    rate, samples = run_threads(threads, work)
    return {
        "name": name,
        "threads": threads,
        "events_per_s": round(rate),
        "per_call_events": batch,
        **percentiles(samples),
    }


def bench_pipelined(
    name: str,
    threads: int,
    events: int,
    batch: int,
    window: int,
    submit: Callable[[int], Future[Any]],
    setup: Callable[[], object] | None = None,
) -> dict[str, Any]:
    """``batch`` events per call, ``window`` calls in flight per thread (the next ones are
    sent while the oldest waits for its group commit). A sample is one call, from its
    submission until the client learns its events are durable; the clock stops once every
    call is acknowledged."""
    calls = max(1, events // threads // batch)

    def work(lat: list[float]) -> int:
        clock = time.perf_counter
        inflight: collections.deque[Future[Any]] = collections.deque()
        for _ in range(calls):
            t = clock()
            future = submit(batch)

            def acknowledged(_: Future[Any], t: float = t) -> None:
                lat.append(clock() - t)

            future.add_done_callback(acknowledged)
            inflight.append(future)
            while len(inflight) >= window:
                inflight.popleft().result(60)
        while inflight:
            inflight.popleft().result(60)
        return calls * batch

    rate, samples = run_threads(threads, work, setup)
    return {
        "name": name,
        "threads": threads,
        "events_per_s": round(rate),
        "per_call_events": batch,
        **percentiles(samples),
    }


def bench_async_pipelined(
    name: str, sock: Path, topic: str, events: int, batch: int, window: int
) -> dict[str, Any]:
    """``AsyncAgentClient.send_many`` of ``batch`` events from ``window`` tasks on one
    connection (``window`` calls in flight); a sample is one call, from its start until its
    events are acknowledged."""
    calls = max(1, events // window // batch)
    many: list[tuple[bytes | None, bytes | None]] = [(None, VALUE)] * batch

    async def run() -> tuple[float, list[float]]:
        client = await AsyncAgentClient.connect(sock, timeout=60)
        latencies: list[float] = []
        clock = time.perf_counter

        async def task() -> None:
            for _ in range(calls):
                t = clock()
                await client.send_many(topic, many)
                latencies.append(clock() - t)

        try:
            start = clock()
            await asyncio.gather(*(task() for _ in range(window)))
            return calls * window * batch / (clock() - start), latencies
        finally:
            await client.close()

    rate, samples = asyncio.run(run())
    return {
        "name": name,
        "threads": 1,
        "events_per_s": round(rate),
        "per_call_events": batch,
        **percentiles(samples),
    }


def bench_async_concurrent(
    name: str, sock: Path, topic: str, events: int, window: int
) -> dict[str, Any]:
    """``AsyncAgentClient.send`` of one event each, ``window`` at a time on one connection
    (what an asyncio application had before ``send_many``); a sample is one send, from its
    start until its event is acknowledged."""

    async def run() -> tuple[float, list[float]]:
        client = await AsyncAgentClient.connect(sock, timeout=60)
        latencies: list[float] = []
        clock = time.perf_counter

        async def send() -> None:
            t = clock()
            await client.send(topic, VALUE)
            latencies.append(clock() - t)

        try:
            start = clock()
            for _ in range(max(1, events // window)):
                await asyncio.gather(*(send() for _ in range(window)))
            return len(latencies) / (clock() - start), latencies
        finally:
            await client.close()

    rate, samples = asyncio.run(run())
    return {"name": name, "threads": 1, "events_per_s": round(rate), **percentiles(samples)}


def bench_fdatasync(workdir: Path, events: int) -> dict[str, Any]:
    fd = os.open(workdir / "plain.log", os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
    try:

        def send() -> None:
            os.write(fd, VALUE)
            os.fdatasync(fd)

        return bench_single_calls("os.write+fdatasync per event", 1, events, send)
    finally:
        os.close(fd)


def bench_confluent(bootstrap: str, topic: str, events: int) -> dict[str, Any]:
    """The direct way: confluent-kafka ``produce()`` + ``flush()`` per event, acks=all;
    every event must be acknowledged without error, else the figures would time failures."""
    try:
        from confluent_kafka import Producer
    except ImportError:
        raise SystemExit(
            "confluent-kafka is needed for the baseline (make test installs it)"
        ) from None
    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0, "log_level": 0}
    )
    errors: list[object] = []

    def report(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    def send() -> None:
        producer.produce(topic, VALUE, on_delivery=report)
        if producer.flush(30) != 0 or errors:
            raise SystemExit(f"confluent-kafka baseline: not acknowledged: {errors or 'timeout'}")

    send()  # metadata and connection first
    return bench_single_calls("confluent-kafka produce+flush, acks=all", 1, events, send)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--bootstrap", help="use this broker instead of starting one")
    args = parser.parse_args()
    events = args.events
    with tempfile.TemporaryDirectory(prefix="agent-bench-", dir=os.getcwd()) as tmp:
        workdir = Path(tmp)
        broker = None
        bootstrap = args.bootstrap
        if bootstrap is None:
            broker, bootstrap = start_broker(workdir)
        results: list[dict[str, Any]] = [bench_fdatasync(workdir, min(events, 5000))]
        # The same sends with nothing delivered (the cluster unreachable): what the ack costs
        # without the senders, the broker's own fsyncs and their CPU competing with it.
        alone = Agent(
            {"bootstrap.servers": f"127.0.0.1:{free_port()}", "data.dir": str(workdir / "alone")}
        )
        try:
            alone.send("bench", VALUE, partition=0)
            results.append(
                bench_single_calls(
                    "in-process send, nothing delivered",
                    1,
                    events,
                    lambda: alone.send("bench", VALUE, partition=0),
                )
            )
        finally:
            alone.close()
        results.append(bench_fdatasync(workdir, min(events, 5000)))
        try:
            agent = Agent({"bootstrap.servers": bootstrap, "data.dir": str(workdir / "agent")})
            daemon = start_daemon(workdir, bootstrap)
            try:
                topic = "bench"
                agent.send(topic, VALUE)  # metadata and queue warm-up (parked, then moved)
                agent.flush(30)
                results.append(
                    bench_single_calls(
                        "in-process send", 1, events, lambda: agent.send(topic, VALUE)
                    )
                )
                agent.flush(120)
                results.append(
                    bench_single_calls(
                        "in-process send", 8, events, lambda: agent.send(topic, VALUE)
                    )
                )
                many: list[tuple[bytes | None, bytes | None]] = [(None, VALUE)] * 1000
                results.append(
                    bench_batches(
                        "in-process send_many",
                        1,
                        events * 5,
                        1000,
                        lambda n: agent.send_many(topic, many[:n]),
                    )
                )
                results.append(
                    bench_batches(
                        "in-process send_many",
                        8,
                        events * 5,
                        1000,
                        lambda n: agent.send_many(topic, many[:n]),
                    )
                )
                local = threading.local()

                def delivered_so_far() -> None:
                    agent.flush(120)
                    deadline = time.monotonic() + 120
                    while any(q["depth"] for q in client().status()["queues"]):
                        if time.monotonic() > deadline:
                            return
                        time.sleep(0.05)

                def client() -> AgentClient:
                    c: AgentClient | None = getattr(local, "client", None)
                    if c is None:
                        c = AgentClient(workdir / "agent.sock")
                        local.client = c
                    return c

                for threads in (1, 8):
                    delivered_so_far()
                    results.append(
                        bench_single_calls(
                            "socket send",
                            threads,
                            events,
                            lambda: client().send(topic, VALUE),
                            setup=client,
                        )
                    )
                for threads in (1, 8):
                    delivered_so_far()
                    results.append(
                        bench_pipelined(
                            "socket pipelined",
                            threads,
                            events * 5,
                            1000,
                            4,
                            lambda n: client().submit_many(topic, many[:n]),
                            setup=client,
                        )
                    )
                delivered_so_far()
                results.append(
                    bench_async_concurrent(
                        "socket asyncio send, 1000 at a time",
                        workdir / "agent.sock",
                        topic,
                        events,
                        1000,
                    )
                )
                delivered_so_far()
                results.append(
                    bench_async_pipelined(
                        "socket asyncio send_many",
                        workdir / "agent.sock",
                        topic,
                        events * 5,
                        1000,
                        4,
                    )
                )
                drained = agent.flush(120)
                deadline = time.monotonic() + 120
                while any(q["depth"] for q in client().status()["queues"]):
                    if time.monotonic() > deadline:
                        drained = False
                        break
                    time.sleep(0.1)
                status = agent.status() + client().status()["queues"]
            finally:
                daemon.terminate()
                daemon.wait(30)
                agent.close()
            results.append(bench_confluent(bootstrap, "bench-confluent", min(events, 5000)))
        finally:
            if broker is not None:
                broker.terminate()
                broker.wait(30)
    print(
        f"{'scenario':44} {'thr':>3} {'events/s':>10} {'p50 us':>9} {'p99 us':>9} {'p99.9 us':>9}"
    )
    for r in results:
        name = r["name"] + (f" ({r['per_call_events']}/call)" if "per_call_events" in r else "")
        print(
            f"{name:44} {r['threads']:>3} {r['events_per_s']:>10} {r['p50_us']:>9} "
            f"{r['p99_us']:>9} {r['p999_us']:>9}"
        )
    delivered = sum(s["delivered"] for s in status)
    fsyncs = sum(s["fsyncs"] for s in status)
    print(f"agent delivered {delivered} events to the broker (drained: {drained}); {fsyncs} fsyncs")
    print(
        json.dumps(
            {
                "bench": "agent",
                "value_bytes": len(VALUE),
                "results": results,
                "delivered": delivered,
                "fsyncs": fsyncs,
                "cpu_count": os.cpu_count(),
                "python": sys.version.split()[0],
            }
        )
    )


if __name__ == "__main__":
    main()
