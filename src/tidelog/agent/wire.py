"""The agent's Unix socket protocol: size-prefixed frames, pipelined, answered by request id.

Request (big-endian)::

    size u32 (bytes after this field) | op u8 | request_id u32 | payload

    SEND   (1): topic_len u16 | topic | partition i32 (-1: the partitioner; below -1 is a
                bad request) | record body (:mod:`tidelog.agent.event`)
    QUERY  (2): topic_len u16 | topic | partition i32 | number u64
    STATUS (3): nothing

Response::

    size u32 | request_id u32 | status u8 | payload

    status 0 (ok):   SEND   -> partition i32 | number u64      (the event is durable;
                               partition -1: parked, its topic has no metadata yet)
                     QUERY  -> state u8 (0 pending, 1 delivered, 2 dropped, 3 unknown) |
                               offset i64 (-1 when not known) |
                               partition i32 (where it went; -1 while parked)
                     STATUS -> JSON, UTF-8
    status 1 (error), 2 (queue full), 3 (bad request), 4 (event too large: above
             max.request.size), 5 (the agent is closed): message, UTF-8

A client may send any number of requests before reading answers; answers to SENDs of one
partition come in request order, others may overtake them. Each SEND is answered for
itself: one stored before another's partition failed is answered ok even where the server
stored them in one call. The server closes a connection whose frame is larger than
:data:`MAX_FRAME` or cannot be parsed, after answering the frames before it; the clients
refuse such a request before writing it (``EventTooLargeError``). A client must read
answers while it writes a long pipeline: the server answers as it reads, and stops reading
while its answers are not read.
"""

from __future__ import annotations

import struct

from tidelog.agent.errors import AgentError, EventFormatError

OP_SEND = 1
OP_QUERY = 2
OP_STATUS = 3

OK = 0
ERROR = 1
QUEUE_FULL = 2
BAD_REQUEST = 3
TOO_LARGE = 4
CLOSED = 5

STATES = ("pending", "delivered", "dropped", "unknown")

MAX_FRAME = 64 * 1024 * 1024

REQUEST_HEAD = struct.Struct(">IBI")
RESPONSE_HEAD = struct.Struct(">IIB")
SEND_ACK = struct.Struct(">iQ")
QUERY_ANSWER = struct.Struct(">Bqi")
_TOPIC_LEN = struct.Struct(">H")
_PARTITION = struct.Struct(">i")
_NUMBER = struct.Struct(">Q")
INT32_MAX = 2**31 - 1


def check_partition(partition: object) -> int:
    """An explicit partition, or None for the partitioner's choice; returns the value a SEND
    carries (-1 for None).

    A partition is a Kafka partition index, an int32 from 0. Whether the topic has it is not
    checked (it may have grown since the last metadata, or not exist yet): the event waits in
    that partition's queue until the partition has a leader.
    """
    if partition is None:
        return -1
    if type(partition) is not int or not 0 <= partition <= INT32_MAX:
        raise AgentError(f"partition must be an integer from 0 to {INT32_MAX}, got {partition!r}")
    return partition


def encode_request(op: int, request_id: int, payload: bytes) -> bytes:
    return REQUEST_HEAD.pack(5 + len(payload), op, request_id) + payload


def encode_topic_partition(topic: str, partition: int) -> bytes:
    raw = topic.encode("utf-8")
    return _TOPIC_LEN.pack(len(raw)) + raw + _PARTITION.pack(partition)


def encode_response(request_id: int, status: int, payload: bytes) -> bytes:
    return RESPONSE_HEAD.pack(5 + len(payload), request_id, status) + payload


# RESPONSE_HEAD and SEND_ACK in one: the answer to a SEND that succeeded.
_SEND_OK = struct.Struct(">IIBiQ")
_SEND_OK_SIZE = _SEND_OK.size - 4


def encode_send_ok(request_id: int, partition: int, number: int) -> bytes:
    return _SEND_OK.pack(_SEND_OK_SIZE, request_id, OK, partition, number)


def parse_topic_partition(payload: memoryview) -> tuple[str, int, int]:
    """(topic, partition, bytes consumed) at the start of a SEND or QUERY payload."""
    if len(payload) < 2:
        raise EventFormatError("request too short for a topic")
    (length,) = _TOPIC_LEN.unpack_from(payload, 0)
    if length == 0 or 2 + length + 4 > len(payload):
        raise EventFormatError("bad topic length")
    try:
        topic = bytes(payload[2 : 2 + length]).decode("utf-8")
    except UnicodeDecodeError:
        raise EventFormatError("topic is not UTF-8") from None
    (partition,) = _PARTITION.unpack_from(payload, 2 + length)
    if partition < -1:
        raise EventFormatError(f"partition {partition}: -1 (none) or an index from 0")
    return topic, partition, 2 + length + 4


def parse_number(payload: memoryview, at: int) -> int:
    if len(payload) != at + 8:
        raise EventFormatError("QUERY needs exactly one event number")
    (number,) = _NUMBER.unpack_from(payload, at)
    return int(number)


def encode_number(number: int) -> bytes:
    return _NUMBER.pack(number)
