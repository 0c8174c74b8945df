"""A three-node metadata quorum of real `tidelog serve` processes under faults.

Each test runs a fresh cluster (tests/cluster/cluster_harness.py): three combined
broker+controller nodes whose controllers reach each other through per-link TCP proxies
the test can cut. A client creates uniquely named topics in a loop, round-robin over the
nodes' client listeners, and the history of what it was told is checked against what every
node holds afterwards (Jepsen style: acknowledged creates are everywhere, certainly failed
ones nowhere, indeterminate ones may be either, and nothing else exists).

Times are recorded and printed (run with -s to see them), never asserted.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
from cluster_harness import (
    Cluster,
    CreateLoop,
    History,
    Op,
    check_creates,
    create_topic,
    wait_until,
)

pytestmark = pytest.mark.slow

SNAPSHOT_BYTES = "metadata.log.max.record.bytes.between.snapshots"


def _others(cluster: Cluster, node: int) -> list[int]:
    return [n for n in cluster.nodes if n != node]


def _check(cluster: Cluster, history: History, prefix: str) -> dict[int, dict[str, str]]:
    seen = cluster.wait_converged()
    problems = check_creates(history, prefix, seen)
    assert problems == [], "\n".join(problems)
    return seen


def test_sigkill_of_the_active_controller_while_topics_are_created(cluster: Cluster) -> None:
    with CreateLoop(cluster, "kill") as loop:
        loop.wait_acknowledged(15)
        before = cluster.leader()
        assert before is not None
        victim = before.leader_id
        killed_at = time.monotonic()
        cluster.nodes[victim].kill()
        survivors = _others(cluster, victim)
        new_leader = cluster.wait_leader(survivors, after_epoch=before.epoch)
        elected_after = time.monotonic() - killed_at
        # The two others carry on: creates through them are acknowledged again.
        loop.wait_acknowledged(15)
        print(
            f"\nSIGKILL of leader {victim} (epoch {before.epoch}): node {new_leader} leads "
            f"after {elected_after:.2f}s; history {loop.history.summary()}"
        )
    assert new_leader in survivors
    # The killed node was asked too while it was down: those creates certainly failed.
    assert loop.history.by_outcome("fail"), "no create met the dead node"
    cluster.nodes[victim].spawn()
    cluster.wait_ready()
    seen = _check(cluster, loop.history, "kill")
    assert len(seen[victim]) >= 30


def test_sigstop_of_the_leader_then_sigcont_it_steps_down(cluster: Cluster) -> None:
    before = cluster.leader()
    assert before is not None
    paused = before.leader_id
    survivors = _others(cluster, paused)
    history = History()
    with CreateLoop(cluster, "stop", nodes=survivors) as loop:
        loop.wait_acknowledged(5)
        cluster.nodes[paused].pause()
        stopped_at = time.monotonic()
        new_leader = cluster.wait_leader(survivors, after_epoch=before.epoch)
        elected_after = time.monotonic() - stopped_at
        # A create sent to the stopped node waits in its socket; it reaches the node when it
        # wakes up still believing it leads epoch `before.epoch`.
        held = Op("stop-held", paused, started=time.monotonic())

        def send_held() -> None:
            held.outcome, held.error = create_topic(cluster.nodes[paused].port, held.name)
            held.ended = time.monotonic()

        sender = threading.Thread(target=send_held)
        sender.start()
        loop.wait_acknowledged(10)
        cluster.nodes[paused].resume()
        # It hears of the newer epoch and stops answering as a leader of its own.
        wait_until(
            lambda: (q := cluster.describe_quorum(paused)) is None or q.epoch > before.epoch,
            f"node {paused} to step down after SIGCONT",
        )
        loop.wait_acknowledged(5)
    sender.join()
    for op in loop.history.ops:
        history.add(op)
    history.add(held)
    print(
        f"\nSIGSTOP of leader {paused} (epoch {before.epoch}): node {new_leader} leads after "
        f"{elected_after:.2f}s; the create held by the stopped node: {held.outcome} "
        f"{held.error}; history {history.summary()}"
    )
    cluster.wait_ready()
    quorum = cluster.leader()
    assert quorum is not None and quorum.epoch > before.epoch
    _check(cluster, history, "stop")
    # Every voter's log reaches the leader's end, and the disks hold the same batches:
    # nothing the stopped leader appended in its old epoch after waking survived.
    wait_until(
        lambda: (
            (q := cluster.leader()) is not None
            and len(set(q.log_end_offsets.values())) == 1
            and q.high_watermark == next(iter(q.log_end_offsets.values()))
        ),
        "every voter's log to end where the leader's does",
    )
    for node in cluster.nodes.values():
        node.kill()
    logs = {n: cluster.metadata_log(n) for n in cluster.nodes}
    common = min(len(batches) for batches in logs.values())
    assert common > 0
    reference = logs[new_leader][:common]
    for n, batches in logs.items():
        assert batches[:common] == reference, f"node {n}'s metadata log differs from the leader's"
        epochs = [epoch for _, epoch, _ in batches]
        assert epochs == sorted(epochs), f"node {n}'s log goes back to an older epoch"
    # The old epoch ends where the new one begins, on the woken node as on the others.
    stale = [offset for offset, epoch, _ in logs[paused] if epoch == before.epoch]
    newer = [offset for offset, epoch, _ in logs[paused] if epoch > before.epoch]
    assert newer and all(offset < newer[0] for offset in stale)


def test_a_node_cut_off_commits_nothing_and_catches_up_after_healing(cluster: Cluster) -> None:
    before = cluster.leader()
    assert before is not None
    cut = before.leader_id  # the leader: the hardest node to cut off
    majority = _others(cluster, cut)
    with CreateLoop(cluster, "cut") as loop:
        loop.wait_acknowledged(10)
        cluster.net.isolate(cut)
        cut_at = time.monotonic()
        cluster.wait_leader(majority, after_epoch=before.epoch)
        frozen = cluster.topics(cut)
        assert frozen is not None
        loop.wait_acknowledged(20)
        # The majority went on; the cut node's metadata did not move.
        assert cluster.topics(cut) == frozen
        majority_view = cluster.topics(majority[0])
        assert majority_view is not None and set(frozen) < set(majority_view)
        # Its heartbeats no longer reach the controller: the majority fences its broker.
        wait_until(
            lambda: _fenced(cluster, majority[0]) == {cut},
            f"node {cut}'s broker to be fenced",
            30,
        )
        fenced_after = time.monotonic() - cut_at
        healed_at = time.monotonic()
        cluster.net.heal()
        loop.wait_acknowledged(5)
    # Nothing sent to the cut node while it was cut off was acknowledged: it could reach
    # no majority to commit it.
    acknowledged_alone = [
        op.name
        for op in loop.history.by_outcome("ok")
        if op.node == cut and op.started >= cut_at and op.ended <= healed_at
    ]
    assert acknowledged_alone == []
    print(
        f"\ncut off node {cut} (leader of epoch {before.epoch}): its broker fenced after "
        f"{fenced_after:.1f}s; history {loop.history.summary()}"
    )
    cluster.wait_ready()
    _check(cluster, loop.history, "cut")


def _fenced(cluster: Cluster, node: int) -> set[int]:
    """The brokers node ``node`` says are fenced (DescribeCluster with fenced brokers)."""
    from tidelog.client import Admin

    with Admin({"bootstrap.servers": cluster.nodes[node].bootstrap}) as admin:
        brokers = admin.describe_cluster(include_fenced_brokers=True).brokers
    assert {b.node_id for b in brokers} == set(cluster.nodes)
    return {b.node_id for b in brokers if b.fenced}


def _restart_all(cluster: Cluster, prefix: str) -> None:
    """Creates, all three stopped and started again: the same topics with the same ids."""
    with CreateLoop(cluster, prefix) as loop:
        loop.wait_acknowledged(40)
    before = _check(cluster, loop.history, prefix)
    cluster.stop()
    for node in cluster.nodes.values():
        node.spawn()
    cluster.wait_ready()
    assert cluster.wait_converged() == before


def test_all_three_stopped_and_started_keep_the_same_metadata(cluster: Cluster) -> None:
    _restart_all(cluster, "restart")


def test_all_three_restarted_from_snapshot_plus_log(tmp_path: Path) -> None:
    # A snapshot every few KiB of records: forty creates leave several, and a log after.
    cluster = Cluster(tmp_path, overrides={SNAPSHOT_BYTES: "4096"})
    try:
        cluster.start()
        with CreateLoop(cluster, "snap") as loop:
            loop.wait_acknowledged(40)
        wait_until(
            lambda: all(cluster.snapshots(n) for n in cluster.nodes),
            "a metadata snapshot on every node",
            30,
        )
        _check(cluster, loop.history, "snap")
        _restart_all(cluster, "snap-after")
    finally:
        cluster.close()


# -- every client family sees the three brokers -----------------------------------------


def _confluent(bootstrap: str) -> set[int]:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    return set(admin.list_topics(timeout=10).brokers)


def _kcat(bootstrap: str) -> set[int]:
    out = subprocess.run(
        ["kcat", "-b", bootstrap, "-L", "-J"], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    return {int(b["id"]) for b in json.loads(out.stdout)["brokers"]}


def _kafka_python(bootstrap: str) -> set[int]:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000)
    try:
        return {int(b["broker_id"]) for b in admin.describe_cluster()["brokers"]}
    finally:
        admin.close()


def _aiokafka(bootstrap: str) -> set[int]:
    from aiokafka import AIOKafkaClient

    async def brokers() -> set[int]:
        client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=10000)
        await client.bootstrap()
        try:
            await client.force_metadata_update()
            return {int(b.nodeId) for b in client.cluster.brokers()}
        finally:
            await client.close()

    return asyncio.run(brokers())


def test_every_client_family_sees_all_three_brokers_from_any_node(cluster: Cluster) -> None:
    from java_harness import JavaClient

    java = JavaClient.build()
    assert shutil.which("kcat") is not None
    expected = set(cluster.nodes)
    for n, node in cluster.nodes.items():
        seen = {
            "confluent-kafka": _confluent(node.bootstrap),
            "kcat": _kcat(node.bootstrap),
            "kafka-python": _kafka_python(node.bootstrap),
            "aiokafka": _aiokafka(node.bootstrap),
            "java": {int(b["id"]) for b in java.bound(node.bootstrap).one("metadata", {})["nodes"]},
        }
        wrong = {client: ids for client, ids in seen.items() if ids != expected}
        assert wrong == {}, f"through node {n}: {wrong}"
