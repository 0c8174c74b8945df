"""Child process of the transaction crash test: writes transactions until it is killed.

Usage: ``txn_crash_writer.py DIR SEED``

Opens partition ``txn-0`` through a :class:`LogManager` and the broker's
:class:`Partitions` (small segments, so rolls take producer snapshots), prints ``READY``,
then loops: a transactional batch of one of five producers, a plain batch, or a COMMIT or
ABORT marker for a producer (whether or not it has a transaction open), chosen by
``SEED``. After each step it prints ``A <log end offset>`` with one ``write``. Any error
is printed to stderr and ends the process with status 3.
"""

from __future__ import annotations

import os
import random
import sys
import time
import traceback
from pathlib import Path

from tidelog.broker.partitions import Partitions
from tidelog.records import BatchBuilder
from tidelog.storage import LogConfig, LogManager

PRODUCERS = (501, 502, 503, 504, 505)
CONFIG = LogConfig.from_mapping({"segment.bytes": 2048})


def clock() -> int:
    return time.time_ns() // 1_000_000


def main() -> None:
    directory, seed = Path(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(seed)
    logs = LogManager([directory], clock=clock)
    logs.open()
    partition = Partitions(logs).ensure("txn", 0, config=CONFIG, topic_id=None, leader_epoch=0)
    sequences = {pid: entry.last_seq + 1 for pid, entry in partition.producers.producers.items()}
    os.write(1, b"READY\n")
    while True:
        roll = rng.random()
        pid = rng.choice(PRODUCERS)
        if roll < 0.55:
            seq = sequences.get(pid, 0)
            count = rng.randint(1, 8)
            builder = BatchBuilder(transactional=True)
            builder.set_producer(pid, 0, seq)
            for index in range(count):
                builder.append(b"k%d" % pid, b"%d-%d" % (pid, seq + index), timestamp=clock())
            partition.append(bytearray(builder.close()))
            sequences[pid] = seq + count
        elif roll < 0.65:
            builder = BatchBuilder()
            builder.append(b"plain", b"plain", timestamp=clock())
            partition.append(bytearray(builder.close()))
        else:
            partition.append_txn_marker(pid, 0, 0, rng.random() < 0.5, clock())
        os.write(1, b"A %d\n" % partition.log.log_end_offset)


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        sys.stderr.write(traceback.format_exc())
        sys.stderr.flush()
        os._exit(3)
