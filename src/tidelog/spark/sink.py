"""Batch and streaming writes to Tidelog topics (the sink of ``format("tidelog")``).

Input columns, as Spark's Kafka sink: ``value`` (binary or string, required), ``key``
(binary or string), ``topic`` (string; the ``topic`` option, when set, wins over it),
``partition`` (int; when null or absent the producer picks it: the key's murmur2 hash like
the Java client, sticky for null keys) and ``headers`` (array<struct<key string, value
binary>>). Other columns are ignored.

Each Spark task writes its rows with one :class:`tidelog.client.Producer` (``acks=all`` unless
``kafka.acks`` says otherwise), waits for every acknowledgement before returning its commit
message, and fails the task if any record failed. Spark retries failed tasks and re-runs
micro-batches after a crash, so delivery is at least once: a record can be written twice,
never lost once its batch committed. The producer is idempotent (the client's default), so
its own retries within a task neither duplicate nor reorder records.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    StringType,
    StructType,
)

from tidelog.client.errors import ClientError
from tidelog.client.sync import Producer
from tidelog.client.types import RecordMetadata
from tidelog.spark.options import SinkOptions, TidelogOptionError

_BYTES_OR_TEXT = (BinaryType, StringType)


@dataclass
class WrittenRecords(WriterCommitMessage):
    records: int


def check_sink_schema(schema: StructType, options: SinkOptions) -> None:
    """Raise TidelogOptionError when the DataFrame cannot be written."""
    fields = {f.name.lower(): f.dataType for f in schema.fields}
    if "value" not in fields:
        raise TidelogOptionError("the DataFrame to write needs a 'value' column")
    for name in ("value", "key"):
        if name in fields and not isinstance(fields[name], _BYTES_OR_TEXT):
            raise TidelogOptionError(
                f"column {name!r} must be binary or string, not {fields[name].simpleString()}"
            )
    if options.topic is None:
        if "topic" not in fields:
            raise TidelogOptionError(
                "no topic to write to: give the 'topic' option or a 'topic' column"
            )
        if not isinstance(fields["topic"], StringType):
            raise TidelogOptionError("column 'topic' must be a string")
    if "partition" in fields and not isinstance(fields["partition"], IntegerType):
        raise TidelogOptionError("column 'partition' must be an int")
    if "headers" in fields:
        headers = fields["headers"]
        ok = (
            isinstance(headers, ArrayType)
            and isinstance(headers.elementType, StructType)
            and [f.name for f in headers.elementType.fields] == ["key", "value"]
        )
        if not ok:
            raise TidelogOptionError(
                "column 'headers' must be array<struct<key: string, value: binary>>"
            )


def _column(batch: Any, name: str) -> list[Any] | None:
    names = [n.lower() for n in batch.schema.names]
    if name not in names:
        return None
    return batch.column(names.index(name)).to_pylist()  # type: ignore[no-any-return]


def write_batches(options: SinkOptions, batches: Iterator[Any]) -> WrittenRecords:
    config = {"acks": "all", **options.client}
    producer = Producer(config)
    failure: list[ClientError] = []
    lock = threading.Lock()

    def delivered(error: ClientError | None, _metadata: RecordMetadata | None) -> None:
        if error is not None:
            with lock:
                failure.append(error)

    count = 0
    try:
        for batch in batches:
            n = batch.num_rows
            values = _column(batch, "value") or [None] * n
            keys = _column(batch, "key") or [None] * n
            topics = [options.topic] * n if options.topic else _column(batch, "topic")
            assert topics is not None
            parts = _column(batch, "partition") or [None] * n
            headers = _column(batch, "headers")
            send = producer.send
            for i in range(n):
                topic = topics[i]
                if topic is None:
                    raise TidelogOptionError("a row has a null topic and no 'topic' option")
                hdrs = None
                if headers is not None and headers[i]:
                    hdrs = [(h["key"], h["value"]) for h in headers[i]]
                send(topic, values[i], keys[i], hdrs, parts[i], on_delivery=delivered)
            count += n
            if failure:
                break
        left = producer.flush()
        if failure:
            raise failure[0]
        if left:
            raise ClientError(f"{left} records were not acknowledged")
    finally:
        producer.close()
    return WrittenRecords(count)


class TidelogBatchWriter(DataSourceArrowWriter):
    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return write_batches(self.options, iterator)


class TidelogStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return write_batches(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Every task already waited for its acknowledgements; nothing is staged.
        return None

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Records of failed tasks may already be in the topic: delivery is at least once.
        return None
