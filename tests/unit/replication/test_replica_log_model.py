"""The simulation's replica log against the real partition log: the same appends (leader and
follower), truncations and epoch questions must give the same answers, so what the
replication simulation proves over the model holds over storage.Log."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tidelog.records import BatchBuilder, iter_batches
from tidelog.replication.log import ReplicaLog
from tidelog.storage import Log, LogConfig
from tidelog.testing.sim_disk import SimReplicaLog, as_replica_log


def batch(rng: random.Random, n: int) -> bytes:
    builder = BatchBuilder()
    for i in range(rng.randint(1, 3)):
        builder.append(None, f"{n}-{i}".encode(), timestamp=1000)
    return builder.close()


def view(log: ReplicaLog) -> tuple[object, ...]:
    batches = log.read_bytes(0, 1 << 30) if log.log_end_offset else b""
    headers = [
        (h.base_offset, h.last_offset, h.partition_leader_epoch)
        for _, h in iter_batches(batches, verify_crc=False)
    ]
    epochs = {e: log.end_offset_for_epoch(e) for e in range(-1, 12)}
    return (log.log_end_offset, log.latest_epoch, headers, epochs, batches)


@pytest.mark.parametrize("seed", range(40))
def test_model_and_real_log_agree(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    real = Log.open(
        tmp_path / "t-0",
        LogConfig.from_mapping({"segment.bytes": 4096}),
        topic="t",
        partition=0,
        clock=lambda: 0,
    )
    logs = (as_replica_log(real), as_replica_log(SimReplicaLog()))
    # Batches a "leader" wrote, to replay as a follower.
    source = SimReplicaLog()
    epoch = 0
    try:
        for step in range(60):
            action = rng.random()
            if action < 0.35:
                epoch += rng.randint(0, 1)
                data = batch(rng, step)
                for log in logs:
                    log.append(data, leader_epoch=epoch, durable=rng.random() < 0.5)
            elif action < 0.65:
                # Follower appends: what a leader with its own epochs holds from our end on.
                epoch += rng.randint(0, 2)
                while source.log_end_offset < logs[0].log_end_offset + 2:
                    source.append(batch(rng, step), leader_epoch=epoch)
                data = source.read_bytes(logs[0].log_end_offset, rng.choice([1, 200, 1 << 20]))
                if data and logs[0].log_end_offset in {b for b, *_ in source.batches()}:
                    for log in logs:
                        log.append_as_follower(data)
                else:
                    source.truncate_to(logs[0].log_end_offset)
            elif action < 0.85 and logs[0].log_end_offset:
                target = rng.randrange(logs[0].log_end_offset + 1)
                results = [log.truncate_to(target) for log in logs]
                assert results[0] == results[1]
                source.truncate_to(logs[0].log_end_offset)
            elif logs[0].log_end_offset:
                assert logs[0].epoch_cache.assign(epoch + 1, logs[0].log_end_offset) == (
                    logs[1].epoch_cache.assign(epoch + 1, logs[1].log_end_offset)
                )
                epoch += 1
            assert view(logs[0]) == view(logs[1]), f"step {step}"
    finally:
        real.close()
