"""Child process of the crash tests: appends to a disk queue and reports each acknowledgement.

``python queue_writer.py DIR`` appends batches of 1..20 events, forever; after each append
returns (the events are durable) it prints the number of the last event acknowledged. The
parent kills it with SIGKILL at some point and checks what recovery keeps.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from tidelog.agent.event import encode_body
from tidelog.agent.queue import DiskQueue


def body(i: int) -> bytes:
    return encode_body(b"%d" % i, b"event-%d-" % i + b"p" * (i % 300), None, i)


def main() -> None:
    queue = DiskQueue.open(Path(sys.argv[1]), segment_bytes=64 * 1024)
    rng = random.Random(7)
    n = queue.write_n
    while True:
        count = rng.randint(1, 20)
        first = queue.append([body(i) for i in range(n, n + count)])
        assert first == n
        n += count
        print(n - 1, flush=True)


if __name__ == "__main__":
    main()
