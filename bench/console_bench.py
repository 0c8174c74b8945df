"""How fast the console pages and searches a large topic.

Fills a topic with N records (default 1,000,000, ~100-byte JSON values with a header each;
written with confluent-kafka, which is not what is measured), then times, through the
console application itself (Starlette's TestClient, so template rendering counts):

- a full search for a value substring found in one record near the end (every record read;
  batches without the text are passed over undecoded);
- the same by header value;
- the worst case: a text present in every batch (in keys) but searched in values, so every
  batch is decoded and nothing is found;
- a search that matches nothing in an empty partition (must end at once, not at its budget);
- a page of 100 records from the beginning, from an offset in the middle, and the newest 100;
- the admin pages (cluster, a topic of ``--wide-partitions`` partitions, transactions, ACLs,
  users), each a fixed number of batched requests whatever the number of partitions.

    .venv/bin/python bench/console_bench.py                        # starts tidelog serve
    .venv/bin/python bench/console_bench.py --records 200000       # smaller
    .venv/bin/python bench/console_bench.py --bootstrap-server 127.0.0.1:9092
    .venv/bin/python bench/console_bench.py --pages-only --wide-partitions 2000

Figures are printed, then one line of JSON; nothing passes or fails on timing.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from starlette.testclient import TestClient

sys.path.insert(0, str(Path(__file__).parent))

from broker_bench import StartedBroker, data_root
from tidelog.console.app import ConsoleConfig, create_app

PARTITIONS = 3


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """A broker just started may not be registered yet (INVALID_REPLICATION_FACTOR): ask
    again for a while."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + 30
    while True:
        try:
            for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
                future.result()
            return
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def fill(bootstrap: str, topic: str, records: int) -> tuple[float, str, str]:
    """Writes the records; returns seconds taken and the needle of a value and of a header."""
    # One partition more than is written to: it stays empty.
    create_topic(bootstrap, topic, PARTITIONS + 1)
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 512_000, "log_level": 0}
    )
    value_needle = f"value-needle-{uuid.uuid4().hex[:8]}"
    header_needle = f"header-needle-{uuid.uuid4().hex[:8]}"
    special = records - 10
    started = time.perf_counter()
    for i in range(records):
        note = value_needle if i == special else "x" * 16
        value = f'{{"order": {i}, "customer": "c-{i % 977}", "note": "{note}"}}'
        trace = header_needle if i == special - 5 else f"t-{i}"
        while True:
            try:
                producer.produce(
                    topic, value.encode(), key=f"k{i % 977}", headers=[("trace", trace)],
                    partition=i % PARTITIONS,
                )  # fmt: skip
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    producer.flush()
    return time.perf_counter() - started, value_needle, header_needle


def timed_get(client: TestClient, url: str, params: dict[str, str]) -> tuple[float, str]:
    started = time.perf_counter()
    response = client.get(url, params=params)
    elapsed = time.perf_counter() - started
    if response.status_code != 200:
        raise SystemExit(f"console_bench: {url} {params} answered {response.status_code}")
    return elapsed, response.text


def scanned(page: str) -> int:
    found = re.search(r"in (\d+) records scanned", page)
    return int(found.group(1)) if found else -1


def run(bootstrap: str, records: int) -> dict[str, Any]:
    topic = f"console-bench-{uuid.uuid4().hex[:6]}"
    fill_s, value_needle, header_needle = fill(bootstrap, topic, records)
    print(f"filled {topic}: {records:,} records in {fill_s:.1f} s")
    out: dict[str, Any] = {"records": records, "fill_seconds": round(fill_s, 1)}
    url = f"/topics/{topic}/messages"
    budget = {"max_records": str(records + 1), "max_seconds": "120"}
    with TestClient(create_app(ConsoleConfig(bootstrap))) as client:
        client.get(url, params={"limit": "1"})  # connections and metadata warm
        for name, params in (
            ("search_value", {"q": value_needle, "in": "value", **budget}),
            ("search_header", {"q": header_needle, "in": "headers", **budget}),
            # The worst case: the text is in every batch (in keys), so every batch is
            # decoded, but never in a value, so nothing is found.
            ("search_decoding_all", {"q": "k976", "in": "value", **budget}),
        ):
            seconds, page = timed_get(client, url, params)
            count = scanned(page)
            complete = "the whole range was scanned" in page
            found = complete and ("1</b> found" in page or name == "search_decoding_all")
            out[name] = {
                "seconds": round(seconds, 2),
                "scanned": count,
                "records_per_second": round(count / seconds) if seconds else None,
                "found": found,
            }
            print(
                f"{name}: {count:,} records scanned in {seconds:.2f} s "
                f"({count / seconds:,.0f}/s), found: {found}"
            )
        seconds, page = timed_get(
            client, url, {"partition": str(PARTITIONS), "q": "nothing", "max_seconds": "120"}
        )
        out["search_empty_partition_seconds"] = round(seconds, 3)
        print(f"search of the empty partition: {seconds * 1000:.0f} ms")
        middle = str(records // PARTITIONS // 2)
        for name, params in (
            ("page_oldest", {"partition": "0"}),
            ("page_offset_middle", {"partition": "0", "mode": "offset", "offset": middle}),
            ("page_newest_all", {"partition": "all", "mode": "newest"}),
        ):
            times = []
            for _ in range(5):
                seconds, _page = timed_get(client, url, params)
                times.append(seconds)
            best = min(times)
            out[name + "_ms"] = round(best * 1000, 1)
            print(f"{name}: {best * 1000:.0f} ms (best of 5)")
    return out


def admin_pages(bootstrap: str, partitions: int) -> dict[str, Any]:
    """Best of 5 of each admin page, with a topic of ``partitions`` partitions there."""
    topic = f"console-wide-{uuid.uuid4().hex[:6]}"
    started = time.perf_counter()
    create_topic(bootstrap, topic, partitions)
    print(
        f"created {topic} with {partitions:,} partitions in {time.perf_counter() - started:.1f} s"
    )
    out: dict[str, Any] = {"wide_partitions": partitions}
    with TestClient(create_app(ConsoleConfig(bootstrap))) as client:
        for name, url in (
            ("cluster", "/cluster"),
            ("topic_wide", f"/topics/{topic}"),
            ("transactions", "/transactions"),
            ("acls", "/acls"),
            ("users", "/users"),
        ):
            times = []
            for _ in range(5):
                seconds, _page = timed_get(client, url, {})
                times.append(seconds)
            best = min(times)
            out[f"page_{name}_ms"] = round(best * 1000, 1)
            print(f"page {url}: {best * 1000:.0f} ms (best of 5)")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-server", help="an existing broker (default: start one)")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--data-root", help="where a started broker keeps its data")
    parser.add_argument("--wide-partitions", type=int, default=1000)
    parser.add_argument("--pages-only", action="store_true", help="skip the record searches")
    args = parser.parse_args()

    def measure(bootstrap: str) -> dict[str, Any]:
        found = {} if args.pages_only else run(bootstrap, args.records)
        return {**found, **admin_pages(bootstrap, args.wide_partitions)}

    if args.bootstrap_server:
        result = measure(args.bootstrap_server)
    else:
        broker = StartedBroker("tidelog", data_root(args.data_root))
        try:
            broker.wait_ready()
            result = measure(broker.bootstrap)
        finally:
            broker.stop(keep=False)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
