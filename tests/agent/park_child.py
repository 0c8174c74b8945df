"""Child process of the parking crash test: an agent that finishes moving parked events.

``python park_child.py DATA_DIR KILL_AT`` opens an agent on DATA_DIR (its cluster is
unreachable; the topic's partition count comes from topics.json) with small move chunks, so
that the move of the parked events takes many steps. The KILL_AT-th fsync the agent asks for
sends SIGKILL to this process instead of syncing: the crash happens exactly there, with the
bytes written so far in the page cache but not known to be on disk. With KILL_AT 0 it runs
until every parked event has moved and prints ``moved``.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from tidelog.agent import Agent, parking


def main() -> None:
    data_dir, kill_at = sys.argv[1], int(sys.argv[2])
    calls = [0]

    def fsync(fd: int) -> None:
        calls[0] += 1
        if calls[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        os.fdatasync(fd)

    parking.MOVE_CHUNK_BYTES = 4096
    agent = Agent(
        {
            "bootstrap.servers": "127.0.0.1:1",
            "data.dir": data_dir,
            "retry.backoff.ms": 20,
            "retry.backoff.max.ms": 50,
        },
        fsync=fsync,
    )
    deadline = time.monotonic() + 60
    while any(row["depth"] for row in agent.status() if row["partition"] < 0):
        if time.monotonic() > deadline:
            sys.exit("the parked events did not move")
        time.sleep(0.01)
    agent.close()
    print("moved", flush=True)


if __name__ == "__main__":
    main()
