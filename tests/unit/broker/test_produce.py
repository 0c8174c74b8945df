"""Produce handler: versions, acks, validation errors (nothing written), LogAppendTime."""

from __future__ import annotations

import asyncio
import struct
import uuid
from typing import Any

import pytest

from tidelog.broker import produce_validation
from tidelog.broker.connection import CloseConnection
from tidelog.broker.handlers.produce import handle_produce
from tidelog.broker.reply import NO_RESPONSE, Deferred
from tidelog.protocol import ApiKey, ErrorCode
from tidelog.records import compute_crc, iter_batches
from tidelog.records.batch import TIMESTAMP_TYPE_MASK
from tidelog.storage import InvalidAppendError, Log, LogConfig, RecordTooLargeError

from .conftest import (
    add_topic,
    context,
    make_batch,
    produce_request,
    run,
    stored_batches,
)

NOW = 1_700_000_000_000


def call(broker: Any, version: int, request: Any) -> Any:
    async def go() -> Any:
        reply = await handle_produce(context(broker, ApiKey.PRODUCE, version), request)
        if isinstance(reply, Deferred):
            return await reply.waiter
        return reply

    return run(go())


def only(response: Any, topic_index: int = 0, partition_index: int = 0) -> Any:
    return response.responses[topic_index].partition_responses[partition_index]


def patch_field(batch: bytes, offset: int, fmt: str, value: int) -> bytes:
    """Overwrite a header field and fix the CRC (a well-formed but invalid batch)."""
    buf = bytearray(batch)
    struct.pack_into(fmt, buf, offset, value)
    struct.pack_into(">I", buf, 17, compute_crc(buf, 0, len(buf)))
    return bytes(buf)


@pytest.mark.parametrize("version", range(3, 14))
def test_every_version_appends_and_reports_offsets(broker: Any, version: int) -> None:
    topic_id = add_topic(broker, "t", 2)
    broker.topic_name_of = lambda tid: "t" if tid == topic_id else None
    key: Any = topic_id if version >= 13 else "t"
    first = call(broker, version, produce_request(version, {key: {0: make_batch()}}))
    second = call(broker, version, produce_request(version, {key: {0: make_batch([b"x"])}}))
    assert type(first).__module__ == f"kio.schema.produce.v{version}.response"
    assert only(first).error_code == ErrorCode.NONE
    assert (only(first).base_offset, only(second).base_offset) == (0, 3)
    assert only(first).log_append_time is None  # -1 on the wire: CreateTime topic
    if version >= 5:
        assert only(second).log_start_offset == 0
    if version >= 13:
        assert first.responses[0].topic_id == topic_id
    else:
        assert first.responses[0].name == "t"
    assert [h.record_count for h in stored_batches(broker, "t")] == [3, 1]


def test_acks_all_is_deferred_until_fsynced(broker: Any) -> None:
    add_topic(broker, "t")
    partition = broker.partitions.get("t", 0)

    async def go() -> tuple[Any, Any]:
        reply = await handle_produce(
            context(broker, ApiKey.PRODUCE, 9),
            produce_request(9, {"t": {0: make_batch()}}, acks=-1),
        )
        assert isinstance(reply, Deferred)
        return reply, await reply.waiter

    _reply, response = run(go())
    assert only(response).error_code == ErrorCode.NONE
    assert partition.log.recovery_point >= 3


def test_acks_one_is_answered_at_once_without_fsync(broker: Any) -> None:
    add_topic(broker, "t")

    async def go() -> Any:
        return await handle_produce(
            context(broker, ApiKey.PRODUCE, 9), produce_request(9, {"t": {0: make_batch()}}, acks=1)
        )

    reply = run(go())
    assert not isinstance(reply, Deferred)
    assert only(reply).base_offset == 0
    assert broker.partitions.get("t", 0).log.recovery_point == 0


def test_acks_zero_gets_no_response(broker: Any) -> None:
    add_topic(broker, "t")
    reply = call(broker, 9, produce_request(9, {"t": {0: make_batch()}}, acks=0))
    assert reply is NO_RESPONSE
    assert len(stored_batches(broker, "t")) == 1


def test_acks_zero_error_closes_the_connection_but_good_partitions_are_written(
    broker: Any,
) -> None:
    add_topic(broker, "t")
    request = produce_request(9, {"t": {0: make_batch()}, "missing": {0: make_batch()}}, acks=0)
    with pytest.raises(CloseConnection):
        call(broker, 9, request)
    assert len(stored_batches(broker, "t")) == 1


def test_invalid_acks_writes_nothing(broker: Any) -> None:
    add_topic(broker, "t")
    response = call(broker, 9, produce_request(9, {"t": {0: make_batch()}}, acks=2))
    assert only(response).error_code == ErrorCode.INVALID_REQUIRED_ACKS
    assert stored_batches(broker, "t") == []


def test_unknown_topic_or_partition_does_not_affect_others(broker: Any) -> None:
    add_topic(broker, "t")
    request = produce_request(
        9, {"t": {0: make_batch(), 5: make_batch()}, "nope": {0: make_batch()}}
    )
    response = call(broker, 9, request)
    assert only(response, 0, 0).error_code == ErrorCode.NONE
    assert only(response, 0, 1).error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert only(response, 1, 0).error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert only(response, 0, 1).base_offset == -1
    assert broker.partitions.get("nope", 0) is None  # no auto-creation
    assert len(stored_batches(broker, "t")) == 1


def test_v13_unknown_topic_id(broker: Any) -> None:
    add_topic(broker, "t")
    broker.topic_name_of = lambda tid: None
    response = call(broker, 13, produce_request(13, {uuid.uuid4(): {0: make_batch()}}))
    assert only(response).error_code == ErrorCode.UNKNOWN_TOPIC_ID


def _corrupt_crc(batch: bytes) -> bytes:
    buf = bytearray(batch)
    buf[-1] ^= 0xFF
    return bytes(buf)


def _magic_one(batch: bytes) -> bytes:
    buf = bytearray(batch)
    buf[16] = 1
    return bytes(buf)


def _control() -> bytes:
    return make_batch(control=True)


# Kafka 4.0's default; the topic config default here is still Long.MAX.
_AFTER_ONE_HOUR = LogConfig.from_mapping({"message.timestamp.after.max.ms": "3600000"})

CASES: list[tuple[str, Any, ErrorCode]] = [
    ("crc", lambda: _corrupt_crc(make_batch()), ErrorCode.CORRUPT_MESSAGE),
    ("truncated", lambda: make_batch()[:-5], ErrorCode.CORRUPT_MESSAGE),
    ("short length", lambda: patch_field(make_batch(), 8, ">i", 10), ErrorCode.CORRUPT_MESSAGE),
    ("magic 1", lambda: _magic_one(make_batch()), ErrorCode.INVALID_RECORD),
    ("null", lambda: None, ErrorCode.INVALID_RECORD),
    ("empty", lambda: b"", ErrorCode.INVALID_RECORD),
    ("two batches", lambda: make_batch() + make_batch(), ErrorCode.INVALID_RECORD),
    ("count mismatch", lambda: patch_field(make_batch(), 57, ">i", 2), ErrorCode.INVALID_RECORD),
    ("delta mismatch", lambda: patch_field(make_batch(), 23, ">i", 5), ErrorCode.INVALID_RECORD),
    ("control", _control, ErrorCode.INVALID_RECORD),
    (
        "negative sequence",
        lambda: make_batch(producer=(7, 0, -1)),
        ErrorCode.INVALID_RECORD,
    ),
    (
        "transactional",
        lambda: make_batch(producer=(7, 0, 0), transactional=True),
        ErrorCode.INVALID_TXN_STATE,
    ),
    (
        "producer set LogAppendTime",
        lambda: patch_field(make_batch(), 21, ">h", TIMESTAMP_TYPE_MASK),
        ErrorCode.INVALID_TIMESTAMP,
    ),
    (
        "timestamp in the future",
        lambda: make_batch(timestamps=[NOW, NOW + 3_600_001, NOW]),
        ErrorCode.INVALID_TIMESTAMP,
    ),
]


@pytest.mark.parametrize(("name", "records", "code"), CASES, ids=[c[0] for c in CASES])
def test_invalid_records_are_refused_and_not_written(
    broker: Any, name: str, records: Any, code: ErrorCode
) -> None:
    add_topic(broker, "t", 2, config=_AFTER_ONE_HOUR)
    request = produce_request(9, {"t": {0: records(), 1: make_batch()}})
    response = call(broker, 9, request)
    bad, good = only(response, 0, 0), only(response, 0, 1)
    assert bad.error_code == code, bad.error_message
    assert bad.base_offset == -1
    assert good.error_code == ErrorCode.NONE
    assert stored_batches(broker, "t", 0) == []
    assert len(stored_batches(broker, "t", 1)) == 1


def test_future_timestamp_names_the_record(broker: Any) -> None:
    add_topic(broker, "t", config=_AFTER_ONE_HOUR)
    batch = make_batch(timestamps=[NOW, NOW + 3_600_001, NOW])
    bad = only(call(broker, 9, produce_request(9, {"t": {0: batch}})))
    assert [e.batch_index for e in bad.record_errors] == [1]
    assert bad.error_message
    assert stored_batches(broker, "t") == []


def test_default_bounds_are_kafka_4s(broker: Any) -> None:
    """No lower bound; at most an hour ahead (message.timestamp.after.max.ms, KIP-1030)."""
    add_topic(broker, "t")
    old = make_batch(timestamps=[1, NOW])
    assert only(call(broker, 9, produce_request(9, {"t": {0: old}}))).error_code == (ErrorCode.NONE)
    ahead = make_batch(timestamps=[NOW, NOW + 3_600_000 + 1_000])
    assert only(call(broker, 9, produce_request(9, {"t": {0: ahead}}))).error_code == (
        ErrorCode.INVALID_TIMESTAMP
    )


_TIMESTAMP_BOUNDS = {
    "message.timestamp.before.max.ms": "60000",
    "message.timestamp.after.max.ms": "60000",
}


def test_old_timestamp_refused_with_before_max_ms(broker: Any) -> None:
    add_topic(broker, "t", config=LogConfig.from_mapping(_TIMESTAMP_BOUNDS))
    old = make_batch(timestamps=[NOW - 60_001, NOW])
    ok = make_batch(timestamps=[NOW - 60_000, NOW + 60_000])
    response = call(broker, 9, produce_request(9, {"t": {0: old}}))
    assert only(response).error_code == ErrorCode.INVALID_TIMESTAMP
    assert [e.batch_index for e in only(response).record_errors] == [0]
    assert only(call(broker, 9, produce_request(9, {"t": {0: ok}}))).error_code == ErrorCode.NONE
    assert len(stored_batches(broker, "t")) == 1


# Timestamp deltas of every length a producer writes: one and two bytes (within the +-8192 ms
# the walk skips without decoding) and three or more.
_OUT_OF_WINDOW = [
    ("two-byte delta, just too old", [NOW - 55_000, NOW - 60_001, NOW - 55_000], [1]),
    ("long delta, far too old", [NOW, NOW - 7_200_000, NOW, NOW - 60_001], [1, 3]),
    ("two-byte delta, just too new", [NOW + 55_000, NOW + 60_001, NOW + 55_000], [1]),
]


@pytest.mark.parametrize(
    ("name", "timestamps", "refused"), _OUT_OF_WINDOW, ids=[c[0] for c in _OUT_OF_WINDOW]
)
@pytest.mark.parametrize("compact", [False, True], ids=["delete", "compact"])
def test_every_records_timestamp_is_checked(
    broker: Any, name: str, timestamps: list[int], refused: list[int], compact: bool
) -> None:
    """A record after the first that is out of the window refuses the batch (Kafka checks
    every record), on plain and compacted topics alike."""
    policy = {"cleanup.policy": "compact"} if compact else {}
    add_topic(broker, "t", config=LogConfig.from_mapping({**_TIMESTAMP_BOUNDS, **policy}))
    batch = make_batch(timestamps=timestamps)
    bad = only(call(broker, 9, produce_request(9, {"t": {0: batch}})))
    assert bad.error_code == ErrorCode.INVALID_TIMESTAMP
    assert bad.error_message == "One or more records have been rejected due to invalid timestamp"
    assert [e.batch_index for e in bad.record_errors] == refused
    assert all("is out of range" in str(e.batch_index_error_message) for e in bad.record_errors)
    assert stored_batches(broker, "t") == []


def test_a_uniform_batch_with_one_old_record_is_refused(broker: Any) -> None:
    """Records of one size are walked as uniform runs; an old record in the middle still
    refuses the batch, whether its delta breaks the run (three bytes) or fits it (two)."""
    add_topic(broker, "t", config=LogConfig.from_mapping(_TIMESTAMP_BOUNDS))
    for old, index in ((NOW - 60_001, 20), (NOW - 7_200_000, 33)):
        timestamps = [NOW - 55_000] * 40
        timestamps[index] = old
        batch = make_batch([b"x" * 10] * 40, keys=[b"k"] * 40, timestamps=timestamps)
        bad = only(call(broker, 9, produce_request(9, {"t": {0: batch}})))
        assert bad.error_code == ErrorCode.INVALID_TIMESTAMP, old
        assert [e.batch_index for e in bad.record_errors] == [index]
    assert stored_batches(broker, "t") == []


def test_records_near_the_bounds_are_decoded_and_accepted(broker: Any) -> None:
    """A batch within 8 s of a bound has its records compared one by one: in range, it is
    stored."""
    add_topic(broker, "t", config=LogConfig.from_mapping(_TIMESTAMP_BOUNDS))
    edge = make_batch(timestamps=[NOW - 55_000, NOW - 60_000, NOW + 60_000, NOW])
    assert only(call(broker, 9, produce_request(9, {"t": {0: edge}}))).error_code == (
        ErrorCode.NONE
    )
    assert [h.record_count for h in stored_batches(broker, "t")] == [4]


def test_batches_far_from_the_bounds_are_not_decoded(
    broker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The common case costs no decoding: the walk's bounds on the deltas settle it."""

    def no_decoding(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("records decoded for the timestamp check")

    monkeypatch.setattr(produce_validation, "iter_records", no_decoding)
    add_topic(broker, "t", config=LogConfig.from_mapping(_TIMESTAMP_BOUNDS))
    spread = make_batch(timestamps=[NOW - 40_000, NOW - 50_000, NOW + 45_000, NOW])
    assert only(call(broker, 9, produce_request(9, {"t": {0: spread}}))).error_code == (
        ErrorCode.NONE
    )


def test_message_too_large(broker: Any) -> None:
    add_topic(broker, "t", config=LogConfig(max_message_bytes=100))
    big = make_batch([b"x" * 200])
    small = make_batch([b"x"])
    assert only(call(broker, 9, produce_request(9, {"t": {0: big}}))).error_code == (
        ErrorCode.MESSAGE_TOO_LARGE
    )
    assert only(call(broker, 9, produce_request(9, {"t": {0: small}}))).error_code == (
        ErrorCode.NONE
    )
    assert [h.record_count for h in stored_batches(broker, "t")] == [1]


def test_zstd_needs_version_7(broker: Any) -> None:
    add_topic(broker, "t")
    batch = make_batch(compression=4)
    response = call(broker, 6, produce_request(6, {"t": {0: batch}}))
    assert only(response).error_code == ErrorCode.UNSUPPORTED_COMPRESSION_TYPE
    assert stored_batches(broker, "t") == []
    assert only(call(broker, 7, produce_request(7, {"t": {0: batch}}))).error_code == (
        ErrorCode.NONE
    )


def test_compacted_topic_refuses_records_without_key(broker: Any) -> None:
    add_topic(broker, "c", config=LogConfig.from_mapping({"cleanup.policy": "compact"}))
    keyless = make_batch([b"a", b"b", b"c"], keys=[b"k", None, None])
    response = call(broker, 9, produce_request(9, {"c": {0: keyless}}))
    bad = only(response)
    assert bad.error_code == ErrorCode.INVALID_RECORD
    assert [e.batch_index for e in bad.record_errors] == [1, 2]
    assert all(e.batch_index_error_message for e in bad.record_errors)
    assert bad.error_message
    assert stored_batches(broker, "c") == []
    keyed = make_batch([b"a"], keys=[b"k"])
    assert only(call(broker, 9, produce_request(9, {"c": {0: keyed}}))).error_code == (
        ErrorCode.NONE
    )


def test_compacted_topic_with_keyless_and_out_of_window_records(broker: Any) -> None:
    """Kafka checks a record's key before its timestamp, and one timestamp error makes the
    whole refusal INVALID_TIMESTAMP: every bad record is named, each for its first fault."""
    config = {"cleanup.policy": "compact", **_TIMESTAMP_BOUNDS}
    add_topic(broker, "c", config=LogConfig.from_mapping(config))
    old = NOW - 7_200_000
    batch = make_batch(
        [b"a", b"b", b"c", b"d"],
        keys=[None, b"k", None, b"k"],
        timestamps=[NOW, old, old, NOW],  # record 2 is both keyless and too old
    )
    bad = only(call(broker, 9, produce_request(9, {"c": {0: batch}})))
    assert bad.error_code == ErrorCode.INVALID_TIMESTAMP
    assert bad.error_message == "One or more records have been rejected due to invalid timestamp"
    named = [(e.batch_index, e.batch_index_error_message) for e in bad.record_errors]
    assert [index for index, _ in named] == [0, 1, 2]
    assert "without key" in str(named[0][1]) and "without key" in str(named[2][1])
    assert "is out of range" in str(named[1][1])
    # Only keyless records, all in the window: INVALID_RECORD as before.
    keyless = make_batch([b"a", b"b"], keys=[None, b"k"], timestamps=[old, NOW])
    bad = only(call(broker, 9, produce_request(9, {"c": {0: keyless}})))
    assert bad.error_code == ErrorCode.INVALID_RECORD
    assert [e.batch_index for e in bad.record_errors] == [0]
    assert stored_batches(broker, "c") == []


def test_compacted_topic_corrupt_compressed_records(broker: Any) -> None:
    add_topic(broker, "c", config=LogConfig.from_mapping({"cleanup.policy": "compact"}))
    batch = bytearray(make_batch(compression=1))
    for i in range(72, len(batch)):  # the deflate data and trailer of the gzip stream
        batch[i] ^= 0x5A
    struct.pack_into(">I", batch, 17, compute_crc(batch, 0, len(batch)))
    response = call(broker, 9, produce_request(9, {"c": {0: bytes(batch)}}))
    assert only(response).error_code == ErrorCode.CORRUPT_MESSAGE
    assert stored_batches(broker, "c") == []


def test_log_append_time_topic(broker: Any, clock: Any) -> None:
    add_topic(broker, "t", config=LogConfig(message_timestamp_type="LogAppendTime"))
    clock.now_ms = NOW + 5
    response = call(broker, 9, produce_request(9, {"t": {0: make_batch(timestamp=12345)}}))
    part = only(response)
    assert part.error_code == ErrorCode.NONE
    assert round(part.log_append_time.timestamp() * 1000) == NOW + 5
    (header,) = stored_batches(broker, "t")
    assert header.is_log_append_time
    assert header.max_timestamp == NOW + 5


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (RecordTooLargeError("too big"), ErrorCode.MESSAGE_TOO_LARGE),
        (InvalidAppendError("keyless"), ErrorCode.INVALID_RECORD),
        (OSError(5, "EIO"), ErrorCode.KAFKA_STORAGE_ERROR),
    ],
)
def test_storage_errors_are_mapped(broker: Any, exc: Exception, code: ErrorCode) -> None:
    add_topic(broker, "t", 2)
    log = broker.partitions.get("t", 0).log

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise exc

    log.append = fail
    response = call(broker, 9, produce_request(9, {"t": {0: make_batch(), 1: make_batch()}}))
    assert only(response, 0, 0).error_code == code
    assert only(response, 0, 0).error_message
    assert only(response, 0, 1).error_code == ErrorCode.NONE


def test_failed_fsync_reports_storage_error(broker: Any) -> None:
    add_topic(broker, "t")
    partition = broker.partitions.get("t", 0)

    async def broken(end_offset: int) -> None:
        await asyncio.sleep(0)
        raise OSError(5, "EIO")

    partition.make_durable = broken
    response = call(broker, 9, produce_request(9, {"t": {0: make_batch()}}, acks=-1))
    assert only(response).error_code == ErrorCode.KAFKA_STORAGE_ERROR


def test_stored_batch_gets_offsets_and_leader_epoch(broker: Any) -> None:
    add_topic(broker, "t")
    broker.partitions.get("t", 0).leader_epoch = 4
    call(broker, 9, produce_request(9, {"t": {0: make_batch()}}))
    call(broker, 9, produce_request(9, {"t": {0: make_batch()}}))
    log = broker.partitions.get("t", 0).log
    data = log.read_bytes(0, 1 << 20)
    headers = [h for _, h in iter_batches(data)]  # CRCs verified
    assert [(h.base_offset, h.partition_leader_epoch) for h in headers] == [(0, 4), (3, 4)]


def test_compacted_topic_records_are_decoded_once(
    broker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_topic(broker, "c", config=LogConfig.from_mapping({"cleanup.policy": "compact"}))
    decoded: list[str] = []
    real = produce_validation.iter_records

    def counting(*args: Any, **kwargs: Any) -> Any:
        decoded.append("broker")
        return real(*args, **kwargs)

    def storage_check(*args: Any) -> None:
        decoded.append("storage")

    monkeypatch.setattr(produce_validation, "iter_records", counting)
    monkeypatch.setattr(Log, "_check_keys", staticmethod(storage_check))
    keyed = make_batch([b"a", b"b"], keys=[b"k", b"l"])
    assert only(call(broker, 9, produce_request(9, {"c": {0: keyed}}))).error_code == (
        ErrorCode.NONE
    )
    assert decoded == ["broker"]
    assert [h.record_count for h in stored_batches(broker, "c")] == [2]
