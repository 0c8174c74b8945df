"""Child process of the kill tests: appends to a log until it is killed.

Usage: ``crash_writer.py DIR SEED WRITERS {durable,buffered} {log,manager} CONFIG_JSON``

Opens the log of partition ``crash-0`` (directly with :meth:`Log.open`, or through a
:class:`LogManager` that another thread checkpoints every few milliseconds), prints
``READY``, then ``WRITERS`` threads append batches in a loop: varied record counts and
value sizes, some batches compressed, every record built from ``(writer, seq)`` by
``crash_helpers``. After each append returns (with ``durable``: after its fsync) the
thread prints ``A <writer> <first seq> <last seq> <first offset> <last offset>`` with
one ``write`` (atomic on a pipe), so the parent knows exactly what was acknowledged.
Any error is printed to stderr and ends the process with status 3.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
import traceback
from pathlib import Path

from crash_helpers import record_key, record_timestamp, record_value

from tidelog.records import BatchBuilder, Compression
from tidelog.storage import Log, LogConfig, LogManager

TOPIC = "crash"
CODECS = (Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD)


def _fail() -> None:
    sys.stderr.write(traceback.format_exc())
    sys.stderr.flush()
    os._exit(3)


def _batch(writer: int, seq: int, rng: random.Random) -> tuple[bytes, int]:
    roll = rng.random()
    if roll < 0.05:
        count = rng.randint(100, 300)  # now and then a batch larger than a segment
    elif roll < 0.5:
        count = 1
    else:
        count = rng.randint(2, 30)
    codec = rng.choice(CODECS) if rng.random() < 0.4 else Compression.NONE
    builder = BatchBuilder(compression=codec)
    for item in range(seq, seq + count):
        builder.append(
            record_key(writer, item),
            record_value(writer, item),
            timestamp=record_timestamp(writer, item),
        )
    return builder.close(), count


def _write_loop(log: Log, writer: int, seed: int, durable: bool) -> None:
    try:
        rng = random.Random(seed * 1000 + writer)
        seq = 0
        while True:
            batch, count = _batch(writer, seq, rng)
            info = log.append(batch, durable=durable)
            last = seq + count - 1
            line = f"A {writer} {seq} {last} {info.first_offset} {info.last_offset}\n"
            os.write(1, line.encode())
            seq = last + 1
    except BaseException:
        _fail()


def _checkpoint_loop(manager: LogManager) -> None:
    try:
        while True:
            manager.checkpoint()
            time.sleep(0.005)
    except BaseException:
        _fail()


def main() -> None:
    directory = Path(sys.argv[1])
    seed = int(sys.argv[2])
    writers = int(sys.argv[3])
    durable = sys.argv[4] == "durable"
    mode = sys.argv[5]
    config = LogConfig.from_mapping(json.loads(sys.argv[6]))

    def clock() -> int:
        return time.time_ns() // 1_000_000

    if mode == "manager":
        manager = LogManager([directory], clock=clock, default_config=config)
        manager.open()
        log = manager.get_or_create_log(TOPIC, 0)
        threading.Thread(target=_checkpoint_loop, args=(manager,), daemon=True).start()
    else:
        log = Log.open(directory / f"{TOPIC}-0", config, topic=TOPIC, partition=0, clock=clock)
    threads = [
        threading.Thread(target=_write_loop, args=(log, writer, seed, durable), daemon=True)
        for writer in range(writers)
    ]
    os.write(1, b"READY\n")
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    main()
