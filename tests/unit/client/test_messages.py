from __future__ import annotations

import datetime
import uuid

from tidelog.client.messages import ZERO_UUID, build, epoch_millis, has_field, millis
from tidelog.protocol import ApiKey, encode_request, request_class


def test_build_keeps_fields_of_the_version_and_fills_defaults() -> None:
    v12 = request_class(ApiKey.FETCH, 12)
    v13 = request_class(ApiKey.FETCH, 13)
    assert v12 is not None and v13 is not None
    values = {
        "max_wait": 250,
        "min_bytes": 1,
        "topics": [
            {
                "topic": "t",
                "topic_id": uuid.UUID(int=5),
                "partitions": [{"partition": 1, "fetch_offset": 9}],
            }
        ],
    }
    old = build(v12, values)
    new = build(v13, values)
    assert old.topics[0].topic == "t"
    assert new.topics[0].topic_id == uuid.UUID(int=5)
    assert old.max_wait == datetime.timedelta(milliseconds=250)
    assert old.topics[0].partitions[0].fetch_offset == 9
    assert old.topics[0].partitions[0].partition_max_bytes == 0  # Kafka's zero default
    assert old.forgotten_topics_data == ()
    v15 = request_class(ApiKey.FETCH, 15)
    assert v15 is not None
    assert has_field(v12, "replica_id") and not has_field(v15, "replica_id")
    assert build(v15, {"replica_id": 3}).replica_state.replica_id == -1
    # The result encodes.
    assert encode_request(new, correlation_id=1, client_id="c")[:4] != b"\x00\x00\x00\x00"


def test_missing_uuid_is_zero_and_conversions() -> None:
    cls = request_class(ApiKey.FETCH, 13)
    assert cls is not None
    request = build(cls, {"topics": [{"partitions": []}]})
    assert request.topics[0].topic_id is None  # nullable in kio: written as the zero UUID
    assert encode_request(request, correlation_id=2, client_id=None).count(ZERO_UUID.bytes) == 1
    assert millis(datetime.timedelta(seconds=2)) == 2000
    assert epoch_millis(datetime.datetime(1970, 1, 1, 0, 0, 1, tzinfo=datetime.UTC)) == 1000
