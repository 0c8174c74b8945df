"""Metadata record encoding: round trips, and malformed bytes."""

from __future__ import annotations

import contextlib
import json
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.metadata.errors import MetadataRecordError
from tidelog.metadata.records import (
    AccessControlEntryRecord,
    BrokerEndpoint,
    ConfigRecord,
    FeatureLevelRecord,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RecordType,
    RegisterBrokerRecord,
    RemoveAccessControlEntryRecord,
    RemoveTopicRecord,
    TopicRecord,
    decode_record,
    encode_record,
)

ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
small = st.integers(min_value=-1, max_value=2**31 - 1)
ids = st.uuids()
texts = st.text(max_size=30)
brokers = st.lists(st.integers(min_value=0, max_value=1000), max_size=5).map(tuple)

records: st.SearchStrategy[MetadataRecord] = st.one_of(
    st.builds(
        RegisterBrokerRecord,
        small,
        ids,
        st.lists(st.builds(BrokerEndpoint, texts, texts, small, texts), max_size=3).map(tuple),
        st.none() | texts,
    ),
    st.builds(TopicRecord, texts, ids),
    st.builds(PartitionRecord, ids, small, brokers, brokers, small, small, small, brokers, brokers),
    st.builds(
        PartitionChangeRecord,
        ids,
        small,
        st.none() | small,
        st.none() | brokers,
        st.none() | brokers,
        st.none() | brokers,
        st.none() | brokers,
    ),
    st.builds(ConfigRecord, st.sampled_from([2, 4]), texts, texts, st.none() | texts),
    st.builds(RemoveTopicRecord, ids),
    st.builds(ProducerIdsRecord, small, ints, ints),
    st.builds(FeatureLevelRecord, texts, st.integers(0, 2**15 - 1)),
    st.builds(AccessControlEntryRecord, ids, small, texts, small, texts, texts, small, small),
    st.builds(RemoveAccessControlEntryRecord, ids),
)


@given(records)
def test_round_trip(record: MetadataRecord) -> None:
    data = encode_record(record)
    assert data[0] == record.TYPE
    assert decode_record(data) == record


def test_layout_is_type_version_json() -> None:
    topic_id = uuid.UUID("12345678-1234-5678-1234-567812345678")
    data = encode_record(TopicRecord("orders", topic_id))
    assert data[:2] == bytes((RecordType.TOPIC, 0))
    assert json.loads(data[2:]) == {"name": "orders", "topic_id": str(topic_id)}


def test_missing_optional_epochs_default_to_zero() -> None:
    topic_id = uuid.uuid4()
    body = {"topic_id": str(topic_id), "partition": 0, "replicas": [1], "isr": [1], "leader": 1}
    data = bytes((RecordType.PARTITION, 0)) + json.dumps(body).encode()
    assert decode_record(data) == PartitionRecord(topic_id, 0, (1,), (1,), 1, 0, 0)


def test_partition_records_without_reassignment_fields_read_as_none_under_way() -> None:
    # Records written before reassignments existed, and new ones without one, look alike.
    topic_id = uuid.uuid4()
    record = PartitionRecord(topic_id, 0, (1, 2), (1,), 1, 3, 4)
    assert "adding_replicas" not in json.loads(encode_record(record)[2:])
    change = PartitionChangeRecord(topic_id, 0, isr=(1, 2))
    assert "removing_replicas" not in json.loads(encode_record(change)[2:])
    decoded = decode_record(encode_record(change))
    assert isinstance(decoded, PartitionChangeRecord)
    assert decoded.adding_replicas is None and decoded.removing_replicas is None


def test_unknown_fields_are_ignored() -> None:
    body = {"topic_id": str(uuid.uuid4()), "future": [1, 2]}
    data = bytes((RecordType.REMOVE_TOPIC, 0)) + json.dumps(body).encode()
    assert isinstance(decode_record(data), RemoveTopicRecord)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (None, "without a value"),
        (b"", "no header"),
        (b"\x02", "no header"),
        (b"\x63\x00{}", "unknown metadata record type"),
        (b"\x02\x09{}", "newer"),
        (b"\x02\x00not json", "not JSON"),
        (b"\x02\x00\xff\xfe", "not JSON"),
        (b"\x02\x00[1,2]", "not a JSON object"),
        (b'\x02\x00{"name": 5, "topic_id": "x"}', "'name'"),
        (b'\x02\x00{"name": "a", "topic_id": "not-a-uuid"}', "UUID"),
        (
            b'\x03\x00{"topic_id": "00000000-0000-0000-0000-000000000001", "partition": true}',
            "integer",
        ),
        (
            b'\x03\x00{"topic_id": "00000000-0000-0000-0000-000000000001", "partition": 0, "replicas": ["a"]}',
            "integers",
        ),
        (
            b'\x01\x00{"broker_id": 1, "incarnation_id": "00000000-0000-0000-0000-000000000001", "endpoints": [1]}',
            "objects",
        ),
        (b'\x05\x00{"resource_type": 2, "resource_name": "t", "name": "k", "value": 3}', "null"),
        (b"\x02\x00" + b"[" * 100000 + b"]" * 100000, "JSON"),
    ],
)
def test_malformed_values_raise_record_error(data: bytes | None, reason: str) -> None:
    with pytest.raises(MetadataRecordError, match=reason):
        decode_record(data)


@given(st.binary(max_size=200))
def test_arbitrary_bytes_raise_only_record_error(data: bytes) -> None:
    with contextlib.suppress(MetadataRecordError):
        decode_record(data)


@given(
    st.sampled_from(list(RecordType)),
    st.dictionaries(texts, st.none() | texts | small | st.lists(small)),
)
def test_arbitrary_bodies_raise_only_record_error(
    kind: RecordType, body: dict[str, object]
) -> None:
    data = bytes((kind, 0)) + json.dumps(body).encode()
    with contextlib.suppress(MetadataRecordError):
        decode_record(data)
