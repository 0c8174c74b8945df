"""The broker process applies compaction in the background, on Kafka's schedule."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tidelog.broker.app import BrokerApp
from tidelog.metadata.configs import BrokerConfig
from tidelog.metadata.controller import NewTopic
from tidelog.records import BatchBuilder, Compression, decode_records, iter_batches


def _batch(key: bytes, value: bytes, timestamp: int) -> bytearray:
    builder = BatchBuilder(compression=Compression.NONE)
    builder.append(key, value, (), timestamp=timestamp)
    return bytearray(builder.close())


def test_the_cleaner_compacts_a_compacted_topic_while_the_broker_runs(tmp_path: Path) -> None:
    config = BrokerConfig(
        {
            "log.dirs": str(tmp_path / "data"),
            "listeners": "PLAINTEXT://127.0.0.1:0",
            "log.cleaner.backoff.ms": "50",
        }
    )

    async def scenario() -> list[tuple[int, bytes | None, bytes | None]]:
        app = BrokerApp(config)
        await app.start()
        try:
            assert app.controller is not None and app.broker is not None
            topic = NewTopic(
                name="users",
                num_partitions=1,
                replication_factor=1,
                configs={
                    "cleanup.policy": "compact",
                    "segment.bytes": "200",
                    "min.cleanable.dirty.ratio": "0.01",
                },
            )
            [result] = await app.broker.run_blocking(
                app.controller.create_topics, [topic], validate_only=False
            )
            assert result.error.ok, result.error
            await asyncio.sleep(0)  # the metadata change reaches the partitions
            partition = app.broker.partitions.get("users", 0)
            assert partition is not None
            now = app.clock()
            for round_ in range(20):
                for key in (b"a", b"b"):
                    partition.append(_batch(key, b"%s-%d" % (key, round_), now), keys_checked=True)
            before = partition.log.size_in_bytes
            for _ in range(200):
                await asyncio.sleep(0.05)
                if partition.log.size_in_bytes < before / 2:
                    break
            log = partition.log
            records: list[tuple[int, bytes | None, bytes | None]] = []
            offset = log.log_start_offset
            while offset < log.log_end_offset:  # one segment per read
                data = log.read_bytes(offset, 1 << 20)
                for position, header in iter_batches(data):
                    records += [
                        (r.offset, r.key, r.value)
                        for r in decode_records(data, position, header=header)
                    ]
                    offset = header.next_offset
            return records
        finally:
            await app.stop()

    records = asyncio.run(scenario())
    latest = {key: value for _, key, value in records}
    assert latest[b"a"] == b"a-19" and latest[b"b"] == b"b-19"
    # Older values of both keys are gone, except what still sits in the active segment.
    assert len(records) < 10, records
