"""An agent on a small tmpfs that sends until the disk is full, for test_disk_full.

    disk_full_child.py DATA_DIR BOOTSTRAP POLICY TOPIC EVENTS

Meant to run in a private mount namespace with a tmpfs of a few MiB on DATA_DIR (see the
test). A thread sends EVENTS events of 1 KB (``A000000...``) to partition 0, sending an event
again when it is refused (policy reject), so that every event is acknowledged once, in
order. The main thread watches the queue: once the disk is full it prints ``full``, and with
policy reject also ``rejected <message>`` for a send tried meanwhile. At the end, after every
queue is delivered, it prints ``done <json>``: the status row and the state of every event.
Lines are flushed as they are written; the test starts the broker when it reads ``full``.
"""

from __future__ import annotations

import json
import sys
import threading
import time

from tidelog.agent import Agent, EventId
from tidelog.agent.errors import QueueFullError


def main() -> None:
    data_dir, bootstrap, policy, topic, count = sys.argv[1:6]
    events = int(count)
    config = {
        "bootstrap.servers": bootstrap,
        "data.dir": data_dir,
        "queue.full.policy": policy,
        "queue.segment.bytes": 262144,
        "retry.backoff.max.ms": 200,
    }
    agent = Agent(config)
    acked: list[EventId] = []
    refused = 0

    def send_all() -> None:
        nonlocal refused
        for i in range(events):
            value = b"A%06d" % i + b"x" * 993
            while True:
                try:
                    acked.append(agent.send(topic, value, partition=0))
                    break
                except QueueFullError:
                    refused += 1
                    time.sleep(0.05)

    sender = threading.Thread(target=send_all)
    sender.start()
    full_seen = False
    while sender.is_alive():
        rows = agent.status()
        if not rows:  # the queue is made by the first send
            time.sleep(0.01)
            continue
        [row] = rows
        # drop-oldest makes room at once: the disk may be full only for an instant.
        if (row["disk_full"] or row["disk_full_waits"]) and not full_seen:
            full_seen = True
            if policy == "reject":
                try:
                    agent.send(topic, b"B", partition=0)
                    print("accepted while full", flush=True)
                except QueueFullError as exc:
                    print(f"rejected {exc}", flush=True)
            print(f"full {len(acked)}", flush=True)
        time.sleep(0.01)
    sender.join()
    if not agent.flush(120):
        print("not delivered in time", flush=True)
        sys.exit(1)
    [row] = agent.status()
    states = [agent.delivery(e).state for e in acked]
    print(
        "done "
        + json.dumps(
            {"acked": len(acked), "numbers": [e.number for e in acked], "status": row}
            | {"states": states, "refused": refused, "full_seen": full_seen}
        ),
        flush=True,
    )
    agent.close()


if __name__ == "__main__":
    main()
