"""The socket server's frame handling on its own: one chunk of mixed frames, answered in
order, with SENDs of one topic and partition stored together and bad frames refused alone."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tidelog.agent import EventId
from tidelog.agent.event import decode_body, encode_body
from tidelog.agent.server import AgentServer
from tidelog.agent.wire import (
    BAD_REQUEST,
    OK,
    OP_QUERY,
    OP_SEND,
    OP_STATUS,
    RESPONSE_HEAD,
    SEND_ACK,
    TOO_LARGE,
    encode_number,
    encode_request,
    encode_topic_partition,
)


class RecordingAgent:
    def __init__(self) -> None:
        self.config = {"max.request.size": 1000, "partitioner.ignore.keys": False}
        self.stored: list[tuple[str, int | None, list[tuple[bytes | None, bytes]]]] = []
        self.next = 0

    def store(
        self,
        topic: str,
        partition: int | None,
        items: Sequence[tuple[bytes | None, bytes | memoryview]],
        *,
        wait_for_space: bool = True,
    ) -> list[EventId]:
        self.stored.append((topic, partition, [(k, bytes(b)) for k, b in items]))
        first, self.next = self.next, self.next + len(items)
        return [EventId(topic, 7, n) for n in range(first, self.next)]

    def status(self) -> list[dict[str, Any]]:
        return [{"depth": self.next}]


def send(request_id: int, topic: str, partition: int, body: bytes) -> bytes:
    return encode_request(OP_SEND, request_id, encode_topic_partition(topic, partition) + body)


def answers(data: bytes) -> list[tuple[int, int, bytes]]:
    out = []
    pos = 0
    while pos < len(data):
        size, request_id, status = RESPONSE_HEAD.unpack_from(data, pos)
        out.append((request_id, status, data[pos + RESPONSE_HEAD.size : pos + 4 + size]))
        pos += 4 + size
    return out


def test_a_chunk_of_mixed_frames(tmp_path: Path) -> None:
    agent = RecordingAgent()
    server = AgentServer(agent, tmp_path / "unused.sock")  # type: ignore[arg-type]
    a = [
        encode_body(b"k%d" % i, b"v%d" % i, [("h", b"x")] if i == 1 else None, i) for i in range(4)
    ]
    prefix_of_a = encode_topic_partition("a", -1)
    chunk = b"".join(
        [
            send(1, "a", -1, a[0]),
            send(2, "a", -1, a[1]),
            send(3, "a", -1, a[2][:-1]),  # one byte short: refused, the others go on
            # The topic bytes of the SEND before, then nothing: too short for a body.
            encode_request(OP_SEND, 4, prefix_of_a),
            send(5, "a", 0, a[2]),  # same topic, explicit partition: a new group
            send(6, "b", -1, a[3]),
            send(7, "b", -1, b"\x00" * 2000),  # larger than max.request.size
            encode_request(9, 8, b""),  # unknown op
            encode_request(OP_STATUS, 9, b""),
            send(10, "b", -1, a[0]),
        ]
    )
    tail = send(11, "b", -1, a[1])
    replies: list[bytes] = []
    used = server._handle(bytearray(chunk + tail[:10]), replies)
    # The incomplete frame at the end waits for the next read.
    assert used == len(chunk)
    got = answers(b"".join(replies))
    assert [(r, status) for r, status, _ in got] == [
        (1, OK),
        (2, OK),
        (3, BAD_REQUEST),
        (4, BAD_REQUEST),
        (5, OK),
        (6, OK),
        (7, TOO_LARGE),
        (8, BAD_REQUEST),
        (9, OK),
        (10, OK),
    ]
    assert [SEND_ACK.unpack(p) for r, s, p in got if s == OK and r != 9] == [
        (7, 0),
        (7, 1),
        (7, 2),
        (7, 3),
        (7, 4),
    ]
    assert b"max.request.size" in got[6][2]
    assert [(t, p, [k for k, _ in items]) for t, p, items in agent.stored] == [
        ("a", None, [b"k0", b"k1"]),
        ("a", 0, [b"k2"]),
        ("b", None, [b"k3"]),
        ("b", None, [b"k0"]),
    ]
    assert [decode_body(b)[2] for _, b in agent.stored[0][2]] == [b"v0", b"v1"]
    assert decode_body(agent.stored[0][2][1][1])[3] == [("h", b"x")]


def test_a_frame_of_impossible_size_closes_the_connection(tmp_path: Path) -> None:
    server = AgentServer(RecordingAgent(), tmp_path / "unused.sock")  # type: ignore[arg-type]
    replies: list[bytes] = []
    assert server._handle(bytearray(b"\x00\x00\x00\x02xx"), replies) is None
    assert replies == []


def test_a_partition_below_minus_one_is_refused(tmp_path: Path) -> None:
    agent = RecordingAgent()
    server = AgentServer(agent, tmp_path / "unused.sock")  # type: ignore[arg-type]
    body = encode_body(None, b"v", None, 0)
    query = encode_request(OP_QUERY, 3, encode_topic_partition("a", -5) + encode_number(0))
    replies: list[bytes] = []
    chunk = send(1, "a", -2, body) + query + send(2, "a", 4, body)
    assert server._handle(bytearray(chunk), replies) == len(chunk)
    got = answers(b"".join(replies))
    assert [(r, status) for r, status, _ in got] == [(1, BAD_REQUEST), (3, BAD_REQUEST), (2, OK)]
    assert b"partition -2" in got[0][2] and b"partition -5" in got[1][2]
    assert [(t, p) for t, p, _ in agent.stored] == [("a", 4)]


def test_a_negative_timestamp_is_refused(tmp_path: Path) -> None:
    # The body's timestamp is CreateTime from 0; a parked queue also relies on it (a pinned
    # parked entry starts with a negative number where a body has its timestamp).
    agent = RecordingAgent()
    server = AgentServer(agent, tmp_path / "unused.sock")  # type: ignore[arg-type]
    good = encode_body(None, b"v", None, 0)
    bad = (-(1 << 63)).to_bytes(8, "big", signed=True) + good[8:]
    replies: list[bytes] = []
    chunk = send(1, "a", -1, bad) + send(2, "a", -1, good)
    assert server._handle(bytearray(chunk), replies) == len(chunk)
    got = answers(b"".join(replies))
    assert [(r, status) for r, status, _ in got] == [(1, BAD_REQUEST), (2, OK)]
    assert b"timestamp must be epoch milliseconds from 0" in got[0][2]
    assert [len(items) for _, _, items in agent.stored] == [1]


def test_sends_alternating_partitions_are_stored_in_one_call_per_partition(
    tmp_path: Path,
) -> None:
    """One call of the agent (one group commit) per topic and explicit partition, however
    the SENDs alternate, each partition's events in the order sent; SENDs without a
    partition keep the calls they had as runs (the agent makes one sticky choice per call
    for the events without a key) and are never reordered against an explicit partition of
    their topic; a STATUS is answered after the SENDs before it are stored; the answers
    come in request order."""
    agent = RecordingAgent()
    server = AgentServer(agent, tmp_path / "unused.sock")  # type: ignore[arg-type]

    def event(request_id: int, topic: str, partition: int, key: bytes | None) -> bytes:
        return send(request_id, topic, partition, encode_body(key, b"%d" % request_id, None, 0))

    chunk = b"".join(
        [
            event(1, "a", 0, None),
            event(2, "a", 1, None),
            event(3, "a", 0, None),
            event(4, "b", -1, b"k"),  # keyed, no partition: placed by its key's hash
            event(5, "a", 1, None),
            event(6, "b", -1, b"j"),  # keyed too: joins 4 (the same partitions either way)
            event(7, "b", -1, None),  # follows 6 directly: the same call as before
            event(8, "a", 0, None),
            event(9, "b", -1, None),  # after another SEND, without a key: a call of its own
            event(10, "a", -1, None),  # ends the groups of a's explicit partitions...
            event(11, "a", 0, None),  # ... and an explicit partition ends a's run: a new one
            send(12, "a", 1, b"\x00\x00\x00"),  # too short for a body: refused alone
            event(13, "a", 1, None),
            encode_request(OP_STATUS, 14, b""),
            event(15, "a", 0, None),
        ]
    )
    replies: list[bytes] = []
    assert server._handle(bytearray(chunk), replies) == len(chunk)
    got = answers(b"".join(replies))
    assert [r for r, _, _ in got] == list(range(1, 16))
    assert [r for r, status, _ in got if status != OK] == [12]
    stored = [
        (t, p, [int(decode_body(b)[2] or b"") for _, b in items]) for t, p, items in agent.stored
    ]
    assert stored == [
        ("a", 0, [1, 3, 8]),
        ("a", 1, [2, 5]),
        ("b", None, [4, 6, 7]),
        ("b", None, [9]),
        ("a", None, [10]),
        ("a", 0, [11]),
        ("a", 1, [13]),
        ("a", 0, [15]),
    ]
    # The STATUS saw the 12 events before it stored.
    assert json.loads(got[13][2]) == {"queues": [{"depth": 12}]}
    # Each SEND is answered with the id of its own event.
    numbers = {r: SEND_ACK.unpack(p)[1] for r, s, p in got if s == OK and r != 14}
    order = [r for _, _, requests in stored for r in requests]
    assert [numbers[r] for r in order] == list(range(13))

    # Keys ignored by the partitioner: keyed events are placed by the sticky choice too.
    agent.config["partitioner.ignore.keys"] = True
    agent.stored.clear()
    chunk = event(1, "b", -1, b"k") + event(2, "a", 0, None) + event(3, "b", -1, b"j")
    assert server._handle(bytearray(chunk), []) == len(chunk)
    assert [(t, p, len(items)) for t, p, items in agent.stored] == [
        ("b", None, 1),
        ("a", 0, 1),
        ("b", None, 1),
    ]
