"""A real full disk under the agent: a 2 MiB tmpfs (in a private mount namespace, so no
privileges are needed) holding the data directory, the cluster unreachable until the disk
fills, 4 MB of events to store.

* block: the send that found the disk full waits; once the broker is up, delivery frees
  room and every event is acknowledged and delivered once, in order.
* reject: a send while the disk is full raises QueueFullError saying so; the events
  acknowledged are delivered once, in order.
* drop-oldest: sending never stops; the oldest segments are dropped (counted, and answered
  "dropped"), every other event is delivered once, in order.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from agent_helpers import read_topic
from interop_broker import BrokerProcess

HERE = Path(__file__).resolve().parent
EVENTS = 4000
MOUNT = 'mount -t tmpfs -o size=2m tmpfs "$1" && shift && exec "$@"'


def run_child(
    tmp_path: Path, broker: BrokerProcess, policy: str, topic: str
) -> tuple[list[str], dict]:
    data = tmp_path / "tmpfs"
    data.mkdir()
    command = [
        "unshare",
        "--mount",
        "--map-root-user",
        "sh",
        "-c",
        MOUNT,
        "sh",
        str(data),
        sys.executable,
        str(HERE / "disk_full_child.py"),
        str(data),
        broker.bootstrap,
        policy,
        topic,
        str(EVENTS),
    ]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    errors: list[str] = []
    reader = threading.Thread(target=lambda: errors.extend(child.stderr or ()), daemon=True)
    reader.start()
    lines: list[str] = []
    try:
        assert child.stdout is not None
        for line in child.stdout:
            lines.append(line.strip())
            if line.startswith("full"):
                # Only now can anything be delivered: room comes from delivery from here on.
                broker.start()
        assert child.wait(180) == 0, (lines, "".join(errors)[:3000])
    finally:
        if child.poll() is None:
            child.kill()
    assert lines and lines[-1].startswith("done "), (lines, "".join(errors)[-3000:])
    return lines, json.loads(lines[-1][5:])


@pytest.mark.parametrize("policy", ["block", "reject", "drop-oldest"])
def test_a_full_disk(tmp_path: Path, policy: str, topic_name: Callable[[], str]) -> None:
    broker = BrokerProcess(tmp_path / "broker", kind="tidelog")
    broker.workdir.mkdir()
    topic = topic_name()
    try:
        lines, done = run_child(tmp_path, broker, policy, topic)
        assert done["full_seen"], lines
        status = done["status"]
        # The file system itself said it was full (not the budget), and then had room again.
        assert status["disk_full_waits"] > 0 and not status["disk_full"]
        delivered = [v for _, _, v in read_topic(broker.bootstrap, topic, 1)[0]]
    finally:
        broker.stop()
    sent = [b"A%06d" % i + b"x" * 993 for i in range(EVENTS)]
    if policy == "drop-oldest":
        assert done["acked"] == EVENTS and done["refused"] == 0
        assert status["dropped"] > 0
        kept = [s == "delivered" for s in done["states"]]
        assert done["states"].count("dropped") == status["dropped"]
        assert delivered == [v for v, k in zip(sent, kept, strict=True) if k]
        return
    # Every event acknowledged, delivered once, in order; nothing dropped.
    assert done["acked"] == EVENTS and status["dropped"] == 0
    assert done["numbers"] == list(range(EVENTS))
    assert done["states"] == ["delivered"] * EVENTS
    assert delivered == sent
    if policy == "reject":
        [rejected] = [line for line in lines if line.startswith("rejected")]
        assert "the disk is full" in rejected and "No space left on device" in rejected
    else:
        assert done["refused"] == 0
