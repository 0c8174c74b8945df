"""The quorum's messages through Kafka's real framing: message -> kio -> bytes -> kio -> message.

Requests go through ``encode_request`` and the broker's own ``parse_request`` (with the
controller listener's version table), responses through ``encode_response`` and the client's
``decode_response``: what a peer would put on the socket and what this node reads back.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.metadata.raft.batches import encode_entries, encode_leader_change
from tidelog.metadata.raft.messages import (
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    Entry,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Message,
    OffsetAndEpoch,
    VoteRequest,
    VoteResponse,
)
from tidelog.metadata.raft.wire import (
    METADATA_TOPIC,
    METADATA_TOPIC_ID,
    SENT_VERSIONS,
    Inbound,
    QuorumDescription,
    Refusal,
    ReplicaDescription,
    api_key_of,
    check_describe_quorum,
    describe_quorum_response,
    fetch_names_metadata,
    read_describe_quorum,
    read_request,
    read_response,
    write_request,
    write_response,
)
from tidelog.protocol import (
    ApiKey,
    ErrorCode,
    decode_response,
    encode_request,
    encode_response,
    parse_request,
    request_class,
)
from tidelog.protocol.versions import CONTROLLER_VERSIONS

CLUSTER = "MkU3OEVBNTcwNTJENDM2Qg"
LOCAL = 2  # the node receiving the requests
PEER = 1


def over_the_wire_request(request: Any) -> tuple[Any, Any]:
    """Encode a kio request as a peer sends it and parse it as the listener does."""
    data = encode_request(request, correlation_id=41, client_id="raft-client-1")
    header, parsed = parse_request(memoryview(data)[4:], CONTROLLER_VERSIONS)
    assert header.correlation_id == 41
    return header, parsed


def over_the_wire_response(header: Any, response: Any) -> Any:
    data = encode_response(header, response)
    _, decoded = decode_response(
        memoryview(data)[4:],
        api_key=header.api_key,
        api_version=header.api_version,
        correlation_id=header.correlation_id,
    )
    return decoded


REQUESTS: list[Message] = [
    VoteRequest(7, PEER, LOCAL, 6, 120, pre_vote=False),
    VoteRequest(8, PEER, LOCAL, 6, 120, pre_vote=True),
    BeginQuorumEpochRequest(9, PEER, LOCAL),
    EndQuorumEpochRequest(9, PEER, (LOCAL, 3)),
    FetchRequest(PEER, 9, 150, 8, 1 << 20, 500),
    FetchSnapshotRequest(PEER, 9, OffsetAndEpoch(100, 5), 4096, 1 << 16),
]


@pytest.mark.parametrize("message", REQUESTS, ids=lambda m: type(m).__name__)
def test_requests_round_trip_through_the_framing(message: Message) -> None:
    request = write_request(message, cluster_id=CLUSTER, destination=LOCAL)
    assert int(request.__version__) == SENT_VERSIONS[api_key_of(message)]
    _, parsed = over_the_wire_request(request)
    assert read_request(parsed, cluster_id=CLUSTER, node_id=LOCAL) == Inbound(PEER, message)


@pytest.mark.parametrize(
    ("message", "versions"),
    [
        (VoteRequest(7, PEER, LOCAL, 6, 120, pre_vote=False), (0, 1, 2)),
        (BeginQuorumEpochRequest(9, PEER, LOCAL), (0, 1)),
        (EndQuorumEpochRequest(9, PEER, (LOCAL, 3)), (0, 1)),
        (FetchRequest(PEER, 9, 150, 8, 1 << 20, 500), tuple(range(12, 19))),
        (FetchSnapshotRequest(PEER, 9, OffsetAndEpoch(100, 5), 4096, 1 << 16), (0, 1)),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, tuple) else "",
)
def test_every_version_kafka_defines_is_read(message: Message, versions: tuple[int, ...]) -> None:
    for version in versions:
        request = write_request(message, cluster_id=CLUSTER, destination=LOCAL, version=version)
        _, parsed = over_the_wire_request(request)
        assert read_request(parsed, cluster_id=CLUSTER, node_id=LOCAL) == Inbound(PEER, message)


def test_a_pre_vote_needs_vote_v2() -> None:
    with pytest.raises(ValueError, match="v2"):
        write_request(
            VoteRequest(8, PEER, LOCAL, 6, 120, pre_vote=True),
            cluster_id=CLUSTER,
            destination=LOCAL,
            version=1,
        )


def test_the_fetch_names_the_metadata_topic_by_its_fixed_id() -> None:
    request = write_request(REQUESTS[4], cluster_id=CLUSTER, destination=LOCAL)
    assert request.topics[0].topic_id == uuid.UUID("00000000-0000-0000-0000-000000000001")
    assert request.replica_state.replica_id == PEER
    assert request.topics[0].partitions[0].current_leader_epoch == 9
    assert fetch_names_metadata(request)
    other = dataclasses.replace(
        request, topics=(dataclasses.replace(request.topics[0], topic_id=uuid.uuid4()),)
    )
    assert not fetch_names_metadata(other)


ENTRIES = (
    Entry(150, 9, (encode_leader_change(1, [1, 2, 3], [1, 2]),), control=True),
    Entry(151, 9, (b"topic-record", b"partition-record")),
    Entry(153, 9, (b"\x00" * 300,)),
)

RESPONSES: list[Message] = [
    VoteResponse(ErrorCode.NONE, None, 7, True, False),
    VoteResponse(ErrorCode.FENCED_LEADER_EPOCH, 3, 9, False, False),
    BeginQuorumEpochResponse(ErrorCode.NONE, 1, 9),
    BeginQuorumEpochResponse(ErrorCode.INCONSISTENT_VOTER_SET, None, 9),
    EndQuorumEpochResponse(ErrorCode.NONE, 1, 9),
    FetchResponse(ErrorCode.NONE, 1, 9, 151, 0, records=ENTRIES),
    FetchResponse(ErrorCode.NONE, 1, 9, 140, 0, diverging_epoch=OffsetAndEpoch(130, 6)),
    FetchResponse(ErrorCode.NONE, 1, 9, 140, 100, snapshot_id=OffsetAndEpoch(100, 5)),
    FetchResponse(ErrorCode.NOT_LEADER_OR_FOLLOWER, 3, 10, 140, 0),
    FetchSnapshotResponse(ErrorCode.NONE, 1, 9, OffsetAndEpoch(100, 5), 9000, 4096, b"x" * 100),
    FetchSnapshotResponse(ErrorCode.SNAPSHOT_NOT_FOUND, 1, 9, OffsetAndEpoch(100, 5)),
]


@pytest.mark.parametrize("message", RESPONSES, ids=lambda m: type(m).__name__)
def test_responses_round_trip_through_the_framing(message: Message) -> None:
    key = api_key_of(message)
    cls = request_class(key, SENT_VERSIONS[key])
    assert cls is not None
    request = write_request(_request_for(key), cluster_id=CLUSTER, destination=LOCAL)
    header, _ = over_the_wire_request(request)
    decoded = over_the_wire_response(header, write_response(message, key, header.api_version))
    assert read_response(decoded) == message


@pytest.mark.parametrize("key", [ApiKey.VOTE, ApiKey.BEGIN_QUORUM_EPOCH, ApiKey.FETCH])
def test_responses_are_written_in_every_version(key: ApiKey) -> None:
    message = next(m for m in RESPONSES if api_key_of(m) == key)
    low = 12 if key == ApiKey.FETCH else CONTROLLER_VERSIONS[key].min_accepted
    for version in range(low, CONTROLLER_VERSIONS[key].max_version + 1):
        request = write_request(
            _request_for(key), cluster_id=CLUSTER, destination=LOCAL, version=version
        )
        header, _ = over_the_wire_request(request)
        decoded = over_the_wire_response(header, write_response(message, key, version))
        assert read_response(decoded) == message


def _request_for(key: ApiKey) -> Message:
    return next(m for m in REQUESTS if api_key_of(m) == key)


def test_fetch_records_are_the_concatenated_batches() -> None:
    message = RESPONSES[5]
    request = write_request(REQUESTS[4], cluster_id=CLUSTER, destination=LOCAL)
    header, _ = over_the_wire_request(request)
    decoded = over_the_wire_response(header, write_response(message, ApiKey.FETCH, 17))
    partition = decoded.responses[0].partitions[0]
    assert bytes(partition.records) == encode_entries(ENTRIES)
    assert decoded.responses[0].topic_id == METADATA_TOPIC_ID
    assert partition.current_leader.leader_id == 1 and partition.current_leader.leader_epoch == 9
    assert partition.diverging_epoch.epoch == -1 and partition.snapshot_id.epoch == -1


def test_corrupt_fetched_records_read_as_corrupt_message() -> None:
    message = RESPONSES[5]
    response = write_response(message, ApiKey.FETCH, 17)
    partition = response.responses[0].partitions[0]
    damaged = bytearray(partition.records)
    damaged[-1] ^= 0xFF  # inside the last batch's records: its CRC no longer matches
    response = dataclasses.replace(
        response,
        responses=(
            dataclasses.replace(
                response.responses[0],
                partitions=(dataclasses.replace(partition, records=bytes(damaged)),),
            ),
        ),
    )
    read = read_response(response)
    assert isinstance(read, FetchResponse)
    assert read.error is ErrorCode.CORRUPT_MESSAGE and read.records == ()


# -- refusals ----------------------------------------------------------------------------


def _refusal(request: Any) -> Refusal:
    _, parsed = over_the_wire_request(request)
    result = read_request(parsed, cluster_id=CLUSTER, node_id=LOCAL)
    assert isinstance(result, Refusal), result
    # The refusal is a response the listener can send.
    header, _ = over_the_wire_request(request)
    over_the_wire_response(header, result.response)
    return result


def _partition_error(response: Any) -> ErrorCode:
    topics = response.responses if hasattr(response, "responses") else response.topics
    return ErrorCode.from_wire(int(topics[0].partitions[0].error_code))


@pytest.mark.parametrize("message", REQUESTS, ids=lambda m: type(m).__name__)
def test_a_request_of_another_cluster_is_refused(message: Message) -> None:
    request = write_request(message, cluster_id="another-cluster", destination=LOCAL)
    refusal = _refusal(request)
    assert refusal.error is ErrorCode.INCONSISTENT_CLUSTER_ID
    assert ErrorCode.from_wire(int(refusal.response.error_code)) is refusal.error


@pytest.mark.parametrize("message", REQUESTS, ids=lambda m: type(m).__name__)
def test_a_request_without_a_cluster_id_is_accepted(message: Message) -> None:
    # Kafka accepts a null cluster id (senders from before it was added).
    request = dataclasses.replace(
        write_request(message, cluster_id=CLUSTER, destination=LOCAL), cluster_id=None
    )
    _, parsed = over_the_wire_request(request)
    assert read_request(parsed, cluster_id=CLUSTER, node_id=LOCAL) == Inbound(PEER, message)


def _with_topic(request: Any, **changes: Any) -> Any:
    return dataclasses.replace(request, topics=(dataclasses.replace(request.topics[0], **changes),))


@pytest.mark.parametrize("message", REQUESTS[:5], ids=lambda m: type(m).__name__)
def test_another_topic_is_an_invalid_request(message: Message) -> None:
    request = write_request(message, cluster_id=CLUSTER, destination=LOCAL)
    field = "topic_id" if isinstance(message, FetchRequest) else "topic_name"
    value: Any = uuid.uuid4() if field == "topic_id" else "orders"
    refusal = _refusal(_with_topic(request, **{field: value}))
    assert refusal.error is ErrorCode.INVALID_REQUEST


def test_two_partitions_are_an_invalid_request() -> None:
    request = write_request(REQUESTS[0], cluster_id=CLUSTER, destination=LOCAL)
    partition = request.topics[0].partitions[0]
    refusal = _refusal(_with_topic(request, partitions=(partition, partition)))
    assert refusal.error is ErrorCode.INVALID_REQUEST


def test_fetch_snapshot_of_another_topic_is_unknown() -> None:
    request = write_request(REQUESTS[5], cluster_id=CLUSTER, destination=LOCAL)
    refusal = _refusal(_with_topic(request, name="orders"))
    assert refusal.error is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert _partition_error(refusal.response) is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


@pytest.mark.parametrize("message", REQUESTS[:3], ids=lambda m: type(m).__name__)
def test_a_request_for_another_voter_has_the_wrong_voter_key(message: Message) -> None:
    request = write_request(message, cluster_id=CLUSTER, destination=LOCAL)
    refusal = _refusal(dataclasses.replace(request, voter_id=LOCAL + 5))
    assert refusal.error is ErrorCode.INVALID_VOTER_KEY
    assert _partition_error(refusal.response) is ErrorCode.INVALID_VOTER_KEY


@pytest.mark.parametrize(
    "message",
    [
        VoteRequest(7, PEER, LOCAL, 7, 120, pre_vote=False),  # last epoch not below its own
        VoteRequest(7, PEER, LOCAL, 6, -1, pre_vote=False),
        FetchRequest(PEER, 9, -1, 8, 1 << 20, 500),
        FetchRequest(PEER, 9, 150, 10, 1 << 20, 500),  # fetched an epoch it is not in yet
        FetchRequest(PEER, 9, 150, 8, 1 << 20, -1),
        BeginQuorumEpochRequest(-1, PEER, LOCAL),
    ],
    ids=lambda m: type(m).__name__,
)
def test_impossible_offsets_and_epochs_are_invalid_requests(message: Message) -> None:
    refusal = _refusal(write_request(message, cluster_id=CLUSTER, destination=LOCAL))
    assert refusal.error is ErrorCode.INVALID_REQUEST
    assert _partition_error(refusal.response) is ErrorCode.INVALID_REQUEST


def test_a_fetch_older_than_v12_cannot_be_a_raft_fetch() -> None:
    # v11 has no LastFetchedEpoch, so the leader could not check the fetcher's log.
    with pytest.raises(ValueError, match="v12"):
        write_request(REQUESTS[4], cluster_id=CLUSTER, destination=LOCAL, version=11)
    cls = request_class(ApiKey.FETCH, 11)
    assert cls is not None
    request = write_request(REQUESTS[4], cluster_id=CLUSTER, destination=LOCAL, version=12)
    names = {f.name for f in dataclasses.fields(cls)}
    older = cls(
        **{f.name: getattr(request, f.name) for f in dataclasses.fields(request) if f.name in names}
    )
    refusal = read_request(older, cluster_id=CLUSTER, node_id=LOCAL)
    assert isinstance(refusal, Refusal) and refusal.error is ErrorCode.UNSUPPORTED_VERSION


@settings(max_examples=300, deadline=None)
@given(
    index=st.integers(0, len(REQUESTS) - 1),
    ints=st.lists(st.integers(-(2**31), 2**31 - 1), min_size=8, max_size=8),
)
def test_any_values_get_an_answer_never_an_exception(index: int, ints: list[int]) -> None:
    """Whatever numbers a peer puts in a request, it gets a message for the node or a
    refusal that can be sent; nothing escapes."""
    message = REQUESTS[index]
    numeric = [f.name for f in dataclasses.fields(message) if type(getattr(message, f.name)) is int]
    changed = dataclasses.replace(
        message, **{name: value for name, value in zip(numeric, ints, strict=False)}
    )
    try:
        request = write_request(changed, cluster_id=CLUSTER, destination=LOCAL)
        data = encode_request(request, correlation_id=1, client_id=None)
    except Exception:
        return  # a value kio cannot write (out of an int16 range...) never reaches a peer
    _, parsed = parse_request(memoryview(data)[4:], CONTROLLER_VERSIONS)
    result = read_request(parsed, cluster_id=CLUSTER, node_id=LOCAL)
    if isinstance(result, Refusal):
        assert result.error is not ErrorCode.NONE
        header, _ = parse_request(memoryview(data)[4:], CONTROLLER_VERSIONS)
        encode_response(header, result.response)
    else:
        assert isinstance(result, Inbound)


# -- DescribeQuorum ----------------------------------------------------------------------


def _describe_request(version: int, topic: str = METADATA_TOPIC) -> Any:
    cls = request_class(ApiKey.DESCRIBE_QUORUM, version)
    assert cls is not None
    module = __import__(cls.__module__, fromlist=["TopicData", "PartitionData"])
    partition = module.PartitionData(partition_index=0)
    return cls(topics=(module.TopicData(topic_name=topic, partitions=(partition,)),))


@pytest.mark.parametrize("version", [0, 1, 2])
def test_describe_quorum_round_trips(version: int) -> None:
    description = QuorumDescription(
        leader_id=1,
        leader_epoch=9,
        high_watermark=153,
        voters=(
            ReplicaDescription(1, 154, 1_700_000_000_500, 1_700_000_000_500),
            ReplicaDescription(2, 153, 1_700_000_000_400, 1_700_000_000_400),
            ReplicaDescription(3, -1),
        ),
        observers=(ReplicaDescription(4, 100, 1_700_000_000_300, -1),),
    )
    header, parsed = over_the_wire_request(_describe_request(version))
    assert check_describe_quorum(parsed) is ErrorCode.NONE
    decoded = over_the_wire_response(header, describe_quorum_response(version, description))
    read = read_describe_quorum(decoded)
    if version == 0:
        # v0 has no timestamps: they read as unknown.
        description = dataclasses.replace(
            description,
            voters=tuple(
                ReplicaDescription(r.replica_id, r.log_end_offset) for r in description.voters
            ),
            observers=tuple(
                ReplicaDescription(r.replica_id, r.log_end_offset) for r in description.observers
            ),
        )
    assert read == description


def test_describe_quorum_of_another_topic_and_from_a_follower() -> None:
    _, parsed = over_the_wire_request(_describe_request(2, topic="orders"))
    assert check_describe_quorum(parsed) is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    header, _ = over_the_wire_request(_describe_request(2))
    decoded = over_the_wire_response(header, describe_quorum_response(2, None))
    assert read_describe_quorum(decoded) is ErrorCode.NOT_LEADER_OR_FOLLOWER
