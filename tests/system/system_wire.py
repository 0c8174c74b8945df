"""A small blocking Kafka client over one socket, built on tidelog.protocol and tidelog.records.

The system tests talk to a real broker process both through real clients (confluent-kafka)
and through this: it sends exactly the bytes a test chose (a batch with hand-set producer
id, epoch and sequence, the same frame twice, a mutated frame) and reads the answer with the
project's own response decoder. One request at a time, except :meth:`WireClient.send_raw`,
which sends bytes and leaves reading to the caller.

Request builders (``*_request``) return kio request objects, so the fuzz test can encode
them and mutate the bytes.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import socket
import time
from dataclasses import dataclass
from typing import Any

from kio.static.primitive import i32Timedelta

from tidelog.protocol import FrameDecoder, decode_response, encode_request
from tidelog.records import BatchBuilder, iter_batches, iter_records, parse_header
from tidelog.records.batch import LOG_OVERHEAD

CLIENT_ID = "tidelog-system-test"
LATEST = -1
EARLIEST = -2


def _ms(ms: int) -> Any:
    return i32Timedelta.parse(datetime.timedelta(milliseconds=ms))


class WireError(RuntimeError):
    """The broker closed the connection or did not answer in time."""


# -- requests ---------------------------------------------------------------------------------


def build(api: str, version: int, class_name: str, /, **values: Any) -> Any:
    """kio's ``class_name`` class of ``api`` v``version``, given the ``values`` it has fields for.

    One call shape serves every version: fields a version lacks are left out.
    """
    module = importlib.import_module(f"kio.schema.{api}.v{version}.request")
    cls = getattr(module, class_name)
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in known})


def api_versions_request(version: int = 3) -> Any:
    return build(
        "api_versions",
        version,
        "ApiVersionsRequest",
        client_software_name="tidelog-tests",
        client_software_version="1",
    )


def metadata_request(topics: list[str] | None, version: int = 12) -> Any:
    return build(
        "metadata",
        version,
        "MetadataRequest",
        topics=None
        if topics is None
        else tuple(
            build("metadata", version, "MetadataRequestTopic", topic_id=None, name=t)
            for t in topics
        ),
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )


def create_topics_request(name: str, partitions: int, version: int = 7) -> Any:
    topic = build(
        "create_topics",
        version,
        "CreatableTopic",
        name=name,
        num_partitions=partitions,
        replication_factor=1,
        assignments=(),
        configs=(),
    )
    return build(
        "create_topics", version, "CreateTopicsRequest", topics=(topic,), timeout=_ms(10_000)
    )


def produce_request(
    topic: str, partition: int, records: bytes, acks: int = -1, version: int = 9
) -> Any:
    data = build("produce", version, "PartitionProduceData", index=partition, records=records)
    return build(
        "produce",
        version,
        "ProduceRequest",
        transactional_id=None,
        acks=acks,
        timeout=_ms(10_000),
        topic_data=(
            build("produce", version, "TopicProduceData", name=topic, partition_data=(data,)),
        ),
    )


def fetch_request(
    topic: str, partition: int, offset: int, max_bytes: int = 1 << 20, version: int = 12
) -> Any:
    part = build(
        "fetch",
        version,
        "FetchPartition",
        partition=partition,
        current_leader_epoch=-1,
        fetch_offset=offset,
        last_fetched_epoch=-1,
        log_start_offset=-1,
        partition_max_bytes=max_bytes,
    )
    return build(
        "fetch",
        version,
        "FetchRequest",
        replica_id=-1,
        max_wait=_ms(0),
        min_bytes=0,
        max_bytes=max_bytes,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(build("fetch", version, "FetchTopic", topic=topic, partitions=(part,)),),
        forgotten_topics_data=(),
        rack_id="",
    )


def list_offsets_request(topic: str, partition: int, timestamp: int, version: int = 7) -> Any:
    part = build(
        "list_offsets",
        version,
        "ListOffsetsPartition",
        partition_index=partition,
        current_leader_epoch=-1,
        timestamp=timestamp,
        max_num_offsets=1,
    )
    return build(
        "list_offsets",
        version,
        "ListOffsetsRequest",
        replica_id=-1,
        isolation_level=0,
        topics=(
            build("list_offsets", version, "ListOffsetsTopic", name=topic, partitions=(part,)),
        ),
    )


def init_producer_id_request(version: int = 4) -> Any:
    return build(
        "init_producer_id",
        version,
        "InitProducerIdRequest",
        transactional_id=None,
        transaction_timeout=_ms(60_000),
        producer_id=-1,
        producer_epoch=-1,
    )


def describe_producers_request(topic: str, partitions: tuple[int, ...]) -> Any:
    return build(
        "describe_producers",
        0,
        "DescribeProducersRequest",
        topics=(
            build(
                "describe_producers", 0, "TopicRequest", name=topic, partition_indexes=partitions
            ),
        ),
    )


def make_batch(
    values: list[bytes],
    *,
    key: bytes | None = None,
    producer: tuple[int, int, int] | None = None,
    timestamp: int | None = None,
) -> bytes:
    """One uncompressed RecordBatch v2; ``producer`` is (id, epoch, base sequence).

    Timestamps default to now: the broker forgets producers whose last batch is older than
    ``producer.id.expiration.ms`` (by the batch's own timestamp, as Kafka does).
    """
    if timestamp is None:
        timestamp = time.time_ns() // 1_000_000
    builder = BatchBuilder()
    if producer is not None:
        builder.set_producer(*producer)
    for i, value in enumerate(values):
        builder.append(key, value, timestamp=timestamp + i)
    return builder.close()


# -- the client -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoredRecord:
    offset: int
    key: bytes | None
    value: bytes | None
    producer_id: int
    base_sequence: int


class WireClient:
    """One connection; :meth:`call` sends a request and returns the decoded response."""

    def __init__(self, host: str, port: int, timeout: float = 15.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._decoder = FrameDecoder()
        self._frames: list[memoryview] = []
        self._correlation = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def encode(self, request: Any) -> tuple[int, bytes]:
        self._correlation += 1
        return self._correlation, encode_request(
            request, correlation_id=self._correlation, client_id=CLIENT_ID
        )

    def read_frame(self) -> memoryview:
        while not self._frames:
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError as exc:
                raise WireError("no answer from the broker") from exc
            if not data:
                raise WireError("the broker closed the connection")
            self._frames.extend(self._decoder.feed(data))
        return self._frames.pop(0)

    def read_response(self, request: Any, correlation_id: int) -> Any:
        frame = self.read_frame()
        _, response = decode_response(
            frame,
            api_key=int(request.__api_key__),
            api_version=int(request.__version__),
            correlation_id=correlation_id,
        )
        return response

    def call(self, request: Any) -> Any:
        correlation_id, data = self.encode(request)
        self.sock.sendall(data)
        return self.read_response(request, correlation_id)

    # -- conveniences ---------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int) -> None:
        response = self.call(create_topics_request(name, partitions))
        (result,) = response.topics
        if result.error_code != 0:
            raise WireError(
                f"CreateTopics {name}: error {result.error_code} {result.error_message}"
            )

    def init_producer_id(self) -> tuple[int, int]:
        response = self.call(init_producer_id_request())
        if response.error_code != 0:
            raise WireError(f"InitProducerId: error {response.error_code}")
        return int(response.producer_id), int(response.producer_epoch)

    def produce(self, topic: str, partition: int, records: bytes, acks: int = -1) -> Any:
        """The partition's response (error_code, base_offset, ...)."""
        response = self.call(produce_request(topic, partition, records, acks))
        return response.responses[0].partition_responses[0]

    def list_offset(self, topic: str, partition: int, timestamp: int) -> int:
        response = self.call(list_offsets_request(topic, partition, timestamp))
        result = response.topics[0].partitions[0]
        if result.error_code != 0:
            raise WireError(f"ListOffsets {topic}-{partition}: error {result.error_code}")
        return int(result.offset)

    def fetch_batches(self, topic: str, partition: int) -> list[bytes]:
        """Every batch of the partition, from offset 0 to the high watermark, as stored."""
        batches: list[bytes] = []
        offset = 0
        end = self.list_offset(topic, partition, LATEST)
        while offset < end:
            response = self.call(fetch_request(topic, partition, offset))
            result = response.responses[0].partitions[0]
            if result.error_code != 0:
                raise WireError(f"Fetch {topic}-{partition}@{offset}: error {result.error_code}")
            got = [b for b in whole_batches(bytes(result.records or b"")) if b[1] >= offset]
            if not got:
                raise WireError(f"Fetch {topic}-{partition}@{offset} (end {end}) made no progress")
            batches.extend(b[0] for b in got)
            offset = got[-1][1] + 1
        return batches

    def fetch_records(self, topic: str, partition: int) -> list[StoredRecord]:
        out: list[StoredRecord] = []
        for batch in self.fetch_batches(topic, partition):
            header = parse_header(batch)
            for record in iter_records(batch):
                out.append(
                    StoredRecord(
                        offset=record.offset,
                        key=record.key,
                        value=record.value,
                        producer_id=header.producer_id,
                        base_sequence=header.base_sequence,
                    )
                )
        return out


def whole_batches(data: bytes) -> list[tuple[bytes, int]]:
    """The complete batches of fetched data, each with its last offset, CRCs checked.

    A fetch may end inside a batch (Kafka sends whole segments' bytes up to the size
    limit); that partial tail is not an error, anything else invalid is.
    """
    out: list[tuple[bytes, int]] = []
    pos = 0
    while len(data) - pos >= LOG_OVERHEAD:
        size = int.from_bytes(data[pos + 8 : pos + 12], "big", signed=True) + LOG_OVERHEAD
        if len(data) - pos < size:
            break
        ((_, header),) = iter_batches(data, pos, pos + size)
        out.append((data[pos : pos + size], header.last_offset))
        pos += size
    return out


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    """Poll ``predicate`` until it returns something true; that value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)
