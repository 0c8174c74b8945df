"""The cost of transactions: transactional produce against idempotent produce, same broker,
same run (confluent-kafka).

    bench/txn_bench.py                         # starts `tidelog serve` on a free port
    bench/txn_bench.py --bootstrap-server H:P  # an already running broker
    bench/txn_bench.py --quick                 # 20,000 records, one round

Each case sends ``--messages`` values of ``--record-size`` bytes (no key) round-robin to a fresh
topic of ``--partitions`` partitions, with acks=all, linger.ms 5 and batch.size 1 MB:

- ``idempotent``: enable.idempotence, no transaction; the clock stops when ``flush()`` returns;
- ``txn_every_N``: a transactional producer (``init_transactions`` before the clock starts)
  that commits after every N records; the clock stops when the last ``commit_transaction``
  returns. Every commit waits for the records to be acknowledged, the EndTxn round trip to the
  transaction coordinator, and its markers to be written to every partition of the transaction.

Cases alternate for ``--rounds`` rounds and the best round of each is reported. Failed
deliveries are counted in ``on_delivery``; any makes the run exit 1. The last line of output
is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "interop"))
from interop_broker import BrokerProcess

TIMEOUT = 60.0
#: Records per transaction of each transactional case; None is the idempotent baseline.
CASES: dict[str, int | None] = {"idempotent": None, "txn_every_100": 100, "txn_every_10000": 10_000}


def create_topic(bootstrap: str, partitions: int) -> str:
    name = f"txn-bench-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(TIMEOUT)
    return name


def produce(
    bootstrap: str, messages: int, record_size: int, partitions: int, per_txn: int | None
) -> float:
    """Seconds to get `messages` records acknowledged (and, with `per_txn`, committed)."""
    topic = create_topic(bootstrap, partitions)
    configs: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 5,
        "batch.size": 1_000_000,
        "queue.buffering.max.messages": 1_000_000,
    }
    if per_txn is not None:
        configs["transactional.id"] = f"{topic}-txn"
    producer = Producer(configs)
    failed = 0

    def on_delivery(error: object, _message: object) -> None:
        nonlocal failed
        if error is not None:
            failed += 1

    if per_txn is not None:
        producer.init_transactions(TIMEOUT)
    value = b"x" * record_size
    start = time.perf_counter()
    for i in range(messages):
        if per_txn is not None and i % per_txn == 0:
            if i:
                producer.commit_transaction(TIMEOUT)
            producer.begin_transaction()
        producer.produce(topic, value, partition=i % partitions, on_delivery=on_delivery)
        if i % 1000 == 0:
            producer.poll(0)
    if per_txn is not None:
        producer.commit_transaction(TIMEOUT)
    else:
        left = producer.flush(TIMEOUT)
        if left:
            raise RuntimeError(f"{left} records not acknowledged in {TIMEOUT} s")
    elapsed = time.perf_counter() - start
    if failed:
        raise RuntimeError(f"{failed} deliveries failed")
    return elapsed


def run(bootstrap: str, messages: int, record_size: int, partitions: int, rounds: int) -> dict:
    best: dict[str, float] = {}
    for _ in range(rounds):
        for name, per_txn in CASES.items():
            seconds = produce(bootstrap, messages, record_size, partitions, per_txn)
            best[name] = min(best.get(name, seconds), seconds)
    figures: dict[str, Any] = {"messages": messages, "record_size": record_size}
    for name, seconds in best.items():
        figures[name] = {
            "seconds": round(seconds, 3),
            "records_per_s": round(messages / seconds),
            "mb_per_s": round(messages * record_size / seconds / 1e6, 2),
            "vs_idempotent": round(best["idempotent"] / seconds, 3),
        }
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap-server", help="use this broker instead of starting one")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="20,000 records, one round")
    args = parser.parse_args(argv)
    if args.quick:
        args.messages, args.rounds = 20_000, 1
    broker = None
    bootstrap = args.bootstrap_server
    if bootstrap is None:
        broker = BrokerProcess(Path(tempfile.mkdtemp(prefix="txn-bench-")))
        broker.start()
        bootstrap = broker.bootstrap
    try:
        figures = run(bootstrap, args.messages, args.record_size, args.partitions, args.rounds)
    except RuntimeError as exc:
        print(f"txn_bench: {exc}", file=sys.stderr)
        return 1
    finally:
        if broker is not None:
            broker.stop()
    print(f"{args.messages} records of {args.record_size} B, {args.partitions} partitions, "
          f"best of {args.rounds}")  # fmt: skip
    for name in CASES:
        f = figures[name]
        print(f"  {name:<16} {f['records_per_s']:>9} records/s  {f['mb_per_s']:>7} MB/s  "
              f"{f['vs_idempotent']:>6}x idempotent")  # fmt: skip
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
