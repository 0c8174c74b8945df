"""Throughput of building and decoding RecordBatch v2, per value size and codec.

Prints one line per case and, last, a JSON object with every figure. Records carry a
16-byte key and a value of partly compressible text (about 2:1 with gzip), with
current-time timestamps, as producers write them. ``--seconds`` sets the time spent
per case (default 0.4 s, about 20 s in all).

Values of one size make uniform batches, which the reader checks and decodes by runs
(tidelog/records/runs.py); the ``check`` column is the broker's produce-time check of every
record. The ``variable`` cases give each value a size of its own (size - 7 .. size), so that
every record is read one by one: the cost without runs, and of looking for them.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable
from functools import partial

from tidelog.records import (
    BatchBuilder,
    Compression,
    check_records,
    decode_records,
    iter_batches,
)

VALUE_SIZES = (100, 1024)
# About 100 KiB of records per batch, the order of a producer's batch.size defaults.
RECORDS_PER_BATCH = {100: 800, 1024: 100}


def make_values(size: int, count: int, rng: random.Random) -> list[bytes]:
    words = [
        bytes(rng.choices(b"abcdefghijklmnopqrstuvwxyz", k=rng.randint(3, 9))) for _ in range(500)
    ]
    values = []
    for _ in range(count):
        out = bytearray()
        while len(out) < size:
            out += rng.choice(words) + b" "
            if rng.random() < 0.2:
                out += rng.randbytes(4)
        values.append(bytes(out[:size]))
    return values


def build(codec: Compression, keys: list[bytes], values: list[bytes], ts: int) -> bytes:
    builder = BatchBuilder(compression=codec)
    append = builder.append
    for key, value in zip(keys, values, strict=True):
        append(key, value, timestamp=ts)
    return builder.close()


def measure(fn: Callable[[], object], seconds: float) -> float:
    """Seconds per call, the best of a few rounds filling ``seconds``."""
    fn()
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed > seconds / 4:
            break
        calls *= 2
    best = elapsed / calls
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=0.4, help="time per case")
    args = parser.parse_args()
    rng = random.Random(1)
    ts = 1_700_000_000_000
    results: dict[str, dict[str, float]] = {}
    cases = [(size, codec, False) for size in VALUE_SIZES for codec in Compression]
    cases += [(size, Compression.NONE, True) for size in VALUE_SIZES]
    for size, codec, variable in cases:
        count = RECORDS_PER_BATCH[size]
        keys = [rng.randbytes(16) for _ in range(count)]
        values = make_values(size, count, rng)
        if variable:
            values = [v[: size - i % 8] for i, v in enumerate(values)]
        payload = sum(len(k) + len(v) for k, v in zip(keys, values, strict=True))
        name = f"{size}B/{codec.name.lower()}{'/variable' if variable else ''}"
        batch = build(codec, keys, values, ts)
        assert len(decode_records(batch)) == count
        assert [h.record_count for _, h in iter_batches(batch)] == [count]
        build_s = measure(partial(build, codec, keys, values, ts), args.seconds)
        decode_s = measure(partial(decode_records, batch), args.seconds)
        check_s = measure(partial(check_records, batch), args.seconds)
        figures = {
            "records_per_batch": count,
            "batch_bytes": len(batch),
            "build_records_per_s": round(count / build_s),
            "build_mb_per_s": round(payload / build_s / 1e6, 1),
            "decode_records_per_s": round(count / decode_s),
            "decode_mb_per_s": round(payload / decode_s / 1e6, 1),
            "check_records_per_s": round(count / check_s),
        }
        results[name] = figures
        print(
            f"{name:23} batch {len(batch):7d} B  "
            f"build {figures['build_records_per_s']:>10,} rec/s {figures['build_mb_per_s']:7.1f} MB/s  "
            f"decode {figures['decode_records_per_s']:>10,} rec/s {figures['decode_mb_per_s']:7.1f} MB/s  "
            f"check {figures['check_records_per_s']:>11,} rec/s"
        )
    print(json.dumps(results, sort_keys=True))


if __name__ == "__main__":
    main()
