"""The metadata quorum's cost and its failover, on real `tidelog serve` processes (reported,
not asserted).

1. **CreateTopics latency**: ``--creates`` topics (default 200), created one after another
   (one partition each, replication factor 1), each timed from the request written to its
   response read, on a 3-voter cluster (three combined nodes on loopback, the cluster test
   kit's tests/cluster/cluster_harness.py, quorum timers at Kafka's defaults) and on a
   single node (`tidelog serve` with no quorum configured), in the same run, alternating
   which one creates the next topic. Creates go to a node's broker listener: on the
   cluster, to the active controller's node (the cost of the quorum itself) and, as a
   second figure, to a follower's node (which forwards to the active controller).
2. **Failover**: ``--kills`` times (default 10), SIGKILL the active controller and time
   until a survivor answers DescribeQuorum as the leader of a newer epoch; the killed node
   is started again and the cluster waits until every node lists the three brokers before
   the next round.

The last line is one JSON object with the figures (milliseconds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
for _path in (_ROOT / "tests" / "cluster", _ROOT / "tests" / "interop"):
    sys.path.insert(0, str(_path))

from cluster_harness import Cluster, create_topic  # noqa: E402
from interop_broker import BrokerProcess  # noqa: E402

# Kafka's defaults, not the test kit's short timers: the failover figure is what a user gets.
KAFKA_QUORUM_TIMERS = {
    "controller.quorum.election.timeout.ms": "1000",
    "controller.quorum.fetch.timeout.ms": "2000",
    "controller.quorum.request.timeout.ms": "2000",
    "broker.heartbeat.interval.ms": "2000",
    "broker.session.timeout.ms": "9000",
}


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def _timed_create(port: int, name: str) -> float:
    started = time.perf_counter()
    outcome, error = create_topic(port, name)
    elapsed = (time.perf_counter() - started) * 1000
    if outcome != "ok":
        raise RuntimeError(f"create {name} on port {port}: {outcome} {error}")
    return elapsed


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(_percentile(values, 0.50), 2),
        "p99_ms": round(_percentile(values, 0.99), 2),
        "mean_ms": round(statistics.fmean(values), 2),
    }


def bench_creates(cluster: Cluster, single: BrokerProcess, creates: int) -> dict[str, object]:
    leader = cluster.wait_leader()
    follower = next(n for n in cluster.nodes if n != leader)
    latencies: dict[str, list[float]] = {"single": [], "quorum_leader": [], "quorum_follower": []}
    ports = {
        "single": single.port,
        "quorum_leader": cluster.nodes[leader].port,
        "quorum_follower": cluster.nodes[follower].port,
    }
    for i in range(creates):
        kinds = list(latencies) if i % 2 == 0 else list(reversed(latencies))
        for kind in kinds:
            latencies[kind].append(_timed_create(ports[kind], f"bench-{kind}-{i:05d}"))
    figures: dict[str, object] = {kind: _summary(values) for kind, values in latencies.items()}
    for kind, summary in figures.items():
        print(f"CreateTopics {kind:<16} {summary}")
    return figures


def bench_failover(cluster: Cluster, kills: int) -> dict[str, object]:
    times: list[float] = []
    for round_ in range(kills):
        quorum = cluster.leader()
        assert quorum is not None
        victim = quorum.leader_id
        survivors = [n for n in cluster.nodes if n != victim]
        killed_at = time.monotonic()
        cluster.nodes[victim].kill()
        new_leader = cluster.wait_leader(survivors, after_epoch=quorum.epoch)
        elapsed = (time.monotonic() - killed_at) * 1000
        times.append(elapsed)
        print(
            f"kill {round_ + 1}: leader {victim} (epoch {quorum.epoch}) -> {new_leader} "
            f"in {elapsed:.0f} ms"
        )
        cluster.nodes[victim].spawn()
        cluster.wait_ready()
    figures = {
        "median_ms": round(statistics.median(times), 1),
        "max_ms": round(max(times), 1),
        "min_ms": round(min(times), 1),
    }
    print(f"new controller after SIGKILL: {figures}")
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--creates", type=int, default=200)
    parser.add_argument("--kills", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="quorum-bench-") as tmp:
        root = Path(tmp)
        cluster = Cluster(root / "cluster", overrides=KAFKA_QUORUM_TIMERS)
        single = BrokerProcess(root / "single", "tidelog")
        try:
            cluster.start()
            single.start()
            creates = bench_creates(cluster, single, args.creates)
            failover = bench_failover(cluster, args.kills)
        finally:
            single.stop()
            cluster.close()
    print(
        json.dumps(
            {
                "creates": args.creates,
                "create_topics": creates,
                "kills": args.kills,
                "failover": failover,
                "timers": KAFKA_QUORUM_TIMERS,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
