"""The quorum's messages on the wire: KRaft's Kafka APIs as kio objects, sans-io.

A Raft message (:mod:`tidelog.metadata.raft.messages`) is one partition entry of a Kafka
request or response for ``__cluster_metadata-0``; this module writes it into the kio request a
Kafka 4.x controller sends, and reads kio requests and responses of every version Kafka
defines back into messages:

========================  ===  ======================================================
API                       key  versions written (read: all of kio's)
========================  ===  ======================================================
Vote                      52   2 (PreVote, KIP-996, exists from v2 only)
BeginQuorumEpoch          53   1 (KIP-853: voter id, directory id, leader endpoints)
EndQuorumEpoch            54   1 (preferred candidates with directory ids)
DescribeQuorum            55   answered in the request's version (v2: nodes, messages)
FetchSnapshot             59   1
Fetch                     1    17 (ReplicaState; topic id, KRaft's fixed metadata id)
========================  ===  ======================================================

Requests are checked as Kafka's ``KafkaRaftClient`` checks them, before the node sees them:
a cluster id other than ours (null is accepted, as Kafka does for old senders) gets a
top-level INCONSISTENT_CLUSTER_ID; anything but exactly ``__cluster_metadata-0`` gets a
top-level INVALID_REQUEST (UNKNOWN_TOPIC_OR_PARTITION for DescribeQuorum and FetchSnapshot,
at the partition level, as Kafka answers); a request addressed to another voter id gets
INVALID_VOTER_KEY; offsets and epochs that cannot be right (negative, or a last epoch past
the sender's current one) get INVALID_REQUEST. Each of those is a :class:`Refusal` carrying
the response to send. Voters the node does not know are the node's business: it answers
INCONSISTENT_VOTER_SET.

Directory ids (KIP-853) are not tracked by Tidelog: they are written as the zero UUID, which
Kafka reads as "unknown". Leader endpoints are not sent: the voters come from the static
``controller.quorum.voters``. A top-level error in a response is read as the same error on
the partition with no leader and epoch -1, which the node treats as a failed request.
"""

from __future__ import annotations

import datetime
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, fields
from functools import cache
from typing import Any

from kio.static.protocol import RequestPayload, ResponsePayload

from tidelog.metadata.raft.batches import decode_entries, encode_entries
from tidelog.metadata.raft.messages import (
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Message,
    OffsetAndEpoch,
    VoteRequest,
    VoteResponse,
)
from tidelog.protocol.apis import ApiKey, request_class, response_class
from tidelog.protocol.error_codes import ErrorCode

METADATA_TOPIC = "__cluster_metadata"
METADATA_PARTITION = 0
#: Kafka's ``Uuid.METADATA_TOPIC_ID``: the metadata topic has this fixed id, not a random one.
METADATA_TOPIC_ID = uuid.UUID(int=1)
#: Kafka's "unknown directory id".
NO_DIRECTORY = uuid.UUID(int=0)

#: The version of each API this node sends, as a Kafka 4.x controller does.
SENT_VERSIONS: dict[ApiKey, int] = {
    ApiKey.VOTE: 2,
    ApiKey.BEGIN_QUORUM_EPOCH: 1,
    ApiKey.END_QUORUM_EPOCH: 1,
    ApiKey.FETCH_SNAPSHOT: 1,
    ApiKey.FETCH: 17,
}
#: The Raft Fetch needs LastFetchedEpoch and DivergingEpoch (KIP-595): v12 and later.
MIN_RAFT_FETCH_VERSION = 12

_REQUEST_MESSAGES = (
    VoteRequest,
    BeginQuorumEpochRequest,
    EndQuorumEpochRequest,
    FetchRequest,
    FetchSnapshotRequest,
)


@dataclass(frozen=True, slots=True)
class Inbound:
    """A request read off the wire: the message for the node and the node that sent it."""

    source: int
    message: Message


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request answered without the node: ``response`` is the kio response to send."""

    error: ErrorCode
    response: ResponsePayload


# ---------------------------------------------------------------------------- kio helpers


def _make(cls: type, **values: Any) -> Any:
    """An instance of ``cls`` from the values its version has; the others are dropped."""
    names = _field_names(cls)
    return cls(**{k: v for k, v in values.items() if k in names})


@cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls))


def _nested(cls: type, name: str) -> type:
    """The class ``name`` of the same kio schema module as ``cls`` (its version's)."""
    found: type = getattr(sys.modules[cls.__module__], name)
    return found


def _request_cls(key: ApiKey, version: int) -> type:
    cls = request_class(key, version)
    if cls is None:
        raise ValueError(f"kio has no {key.name} v{version} request")
    return cls


def _response_cls(key: ApiKey, version: int) -> type:
    cls = response_class(key, version)
    if cls is None:
        raise ValueError(f"kio has no {key.name} v{version} response")
    return cls


def _leader(leader_id: int | None) -> int:
    return -1 if leader_id is None else leader_id


def _leader_or_none(leader_id: int) -> int | None:
    return None if leader_id < 0 else leader_id


def _error(code: int) -> ErrorCode:
    return ErrorCode.from_wire(int(code))


def _metadata_partition(
    topics: Sequence[Any], name_field: str, index_field: str = "partition_index"
) -> Any:
    """The one partition entry of a request or response if it holds exactly
    ``__cluster_metadata-0`` (one topic, one partition: all a raft client accepts while there
    is a single Raft partition), else None. Topics are named by ``name_field``."""
    if len(topics) != 1 or not _names_metadata_topic(topics[0], name_field):
        return None
    partitions = topics[0].partitions
    if len(partitions) != 1 or int(getattr(partitions[0], index_field)) != METADATA_PARTITION:
        return None
    return partitions[0]


def _names_metadata_topic(topic: Any, name_field: str) -> bool:
    value = getattr(topic, name_field)
    return bool(value in (METADATA_TOPIC, METADATA_TOPIC_ID))


# ---------------------------------------------------------------------------- requests out


def write_request(
    message: Message, *, cluster_id: str, destination: int, version: int | None = None
) -> RequestPayload:
    """The kio request a Kafka 4.x controller sends for ``message`` to ``destination``
    (in :data:`SENT_VERSIONS`, or ``version`` for a peer that speaks an older one).

    :raises ValueError: the message cannot be said in ``version`` (a pre-vote before v2).
    """
    key = api_key_of(message)
    if version is None:
        version = SENT_VERSIONS[key]
    if isinstance(message, VoteRequest):
        if message.pre_vote and version < 2:
            raise ValueError(f"Vote v{version} cannot carry a pre-vote (KIP-996 needs v2)")
        cls = _request_cls(ApiKey.VOTE, version)
        partition = _make(
            _nested(cls, "PartitionData"),
            partition_index=METADATA_PARTITION,
            replica_epoch=message.candidate_epoch,
            replica_id=message.candidate_id,
            replica_directory_id=NO_DIRECTORY,
            voter_directory_id=NO_DIRECTORY,
            last_offset_epoch=message.last_offset_epoch,
            last_offset=message.last_offset,
            pre_vote=message.pre_vote,
        )
        topic = _make(_nested(cls, "TopicData"), topic_name=METADATA_TOPIC, partitions=(partition,))
        request: RequestPayload = _make(
            cls, cluster_id=cluster_id, voter_id=message.voter_id, topics=(topic,)
        )
        return request
    if isinstance(message, BeginQuorumEpochRequest):
        cls = _request_cls(ApiKey.BEGIN_QUORUM_EPOCH, version)
        partition = _make(
            _nested(cls, "PartitionData"),
            partition_index=METADATA_PARTITION,
            voter_directory_id=NO_DIRECTORY,
            leader_id=message.leader_id,
            leader_epoch=message.leader_epoch,
        )
        topic = _make(_nested(cls, "TopicData"), topic_name=METADATA_TOPIC, partitions=(partition,))
        request = _make(
            cls,
            cluster_id=cluster_id,
            voter_id=message.voter_id,
            topics=(topic,),
            leader_endpoints=(),
        )
        return request
    if isinstance(message, EndQuorumEpochRequest):
        cls = _request_cls(ApiKey.END_QUORUM_EPOCH, version)
        successors: dict[str, Any]
        if version >= 1:
            # v1 names each successor with its directory id (KIP-853).
            info = _nested(cls, "ReplicaInfo")
            successors = {
                "preferred_candidates": tuple(
                    info(candidate_id=c, candidate_directory_id=NO_DIRECTORY)
                    for c in message.preferred_successors
                )
            }
        else:
            successors = {"preferred_successors": message.preferred_successors}
        partition = _make(
            _nested(cls, "PartitionData"),
            partition_index=METADATA_PARTITION,
            leader_id=message.leader_id,
            leader_epoch=message.leader_epoch,
            **successors,
        )
        topic = _make(_nested(cls, "TopicData"), topic_name=METADATA_TOPIC, partitions=(partition,))
        request = _make(cls, cluster_id=cluster_id, topics=(topic,), leader_endpoints=())
        return request
    if isinstance(message, FetchRequest):
        return _write_fetch_request(message, cluster_id, version)
    if isinstance(message, FetchSnapshotRequest):
        cls = _request_cls(ApiKey.FETCH_SNAPSHOT, version)
        snapshot = _make(
            _nested(cls, "SnapshotId"),
            end_offset=message.snapshot_id.offset,
            epoch=message.snapshot_id.epoch,
        )
        partition = _make(
            _nested(cls, "PartitionSnapshot"),
            partition=METADATA_PARTITION,
            current_leader_epoch=message.current_leader_epoch,
            snapshot_id=snapshot,
            position=message.position,
            replica_directory_id=NO_DIRECTORY,
        )
        topic = _make(_nested(cls, "TopicSnapshot"), name=METADATA_TOPIC, partitions=(partition,))
        request = _make(
            cls,
            cluster_id=cluster_id,
            replica_id=message.replica_id,
            max_bytes=message.max_bytes,
            topics=(topic,),
        )
        return request
    raise TypeError(f"{type(message).__name__} is not a request")


def _write_fetch_request(message: FetchRequest, cluster_id: str, version: int) -> RequestPayload:
    if version < MIN_RAFT_FETCH_VERSION:
        raise ValueError(f"Fetch v{version} has no LastFetchedEpoch; the quorum needs v12+")
    cls = _request_cls(ApiKey.FETCH, version)
    partition = _make(
        _nested(cls, "FetchPartition"),
        partition=METADATA_PARTITION,
        current_leader_epoch=message.current_leader_epoch,
        fetch_offset=message.fetch_offset,
        last_fetched_epoch=message.last_fetched_epoch,
        log_start_offset=-1,
        partition_max_bytes=message.max_bytes,
        replica_directory_id=NO_DIRECTORY,
    )
    topic = _make(
        _nested(cls, "FetchTopic"),
        topic=METADATA_TOPIC,
        topic_id=METADATA_TOPIC_ID,
        partitions=(partition,),
    )
    values: dict[str, Any] = {
        "cluster_id": cluster_id,
        "replica_id": message.replica_id,
        "max_wait": _millis(message.max_wait_ms),
        "min_bytes": 0,
        "max_bytes": message.max_bytes,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "topics": (topic,),
        "forgotten_topics_data": (),
        "rack_id": "",
    }
    if "replica_state" in _field_names(cls):
        # KRaft names the fetching replica here from v15; its broker epoch is not used.
        values["replica_state"] = _make(
            _nested(cls, "ReplicaState"), replica_id=message.replica_id, replica_epoch=-1
        )
    request: RequestPayload = _make(cls, **values)
    return request


def _millis(ms: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=ms)


def _to_millis(value: Any) -> int:
    return int(value.total_seconds() * 1000) if hasattr(value, "total_seconds") else int(value)


# ---------------------------------------------------------------------------- requests in


def read_request(request: RequestPayload, *, cluster_id: str, node_id: int) -> Inbound | Refusal:
    """The message in a request received by node ``node_id`` of cluster ``cluster_id``, or
    the refusal to send back. Never raises for anything a peer can send."""
    key = ApiKey(int(request.__api_key__))
    version = int(request.__version__)
    claimed = getattr(request, "cluster_id", None)
    if claimed is not None and claimed != cluster_id:
        return _refuse(key, version, ErrorCode.INCONSISTENT_CLUSTER_ID)
    try:
        if key == ApiKey.VOTE:
            return _read_vote(request, version, node_id)
        if key == ApiKey.BEGIN_QUORUM_EPOCH:
            return _read_begin(request, version, node_id)
        if key == ApiKey.END_QUORUM_EPOCH:
            return _read_end(request, version)
        if key == ApiKey.FETCH:
            return _read_fetch(request, version)
        if key == ApiKey.FETCH_SNAPSHOT:
            return _read_fetch_snapshot(request, version)
    except (AttributeError, TypeError, ValueError):
        # A request kio read but whose values do not fit a message.
        return _refuse(key, version, ErrorCode.INVALID_REQUEST)
    raise ValueError(f"{key.name} is not a request of the quorum")


def _refuse(key: ApiKey, version: int, error: ErrorCode) -> Refusal:
    """A response with ``error`` at the top level and no partitions."""
    cls = _response_cls(key, version)
    values: dict[str, Any] = {
        "error_code": error.to_kio(),
        "topics": (),
        "responses": (),
        "node_endpoints": (),
        "throttle_time": _millis(0),
        "session_id": 0,
        "error_message": error.message,
        "nodes": (),
    }
    return Refusal(error, _make(cls, **values))


def _refuse_partition(
    key: ApiKey, version: int, error: ErrorCode, message: Message | None = None
) -> Refusal:
    """A response with ``error`` on the metadata partition (no leader known)."""
    if message is None:
        message = error_reply(key, error)
    return Refusal(error, write_response(message, key, version))


def error_reply(
    key: ApiKey, error: ErrorCode, leader_id: int | None = None, epoch: int = -1
) -> Message:
    """The response message of API ``key`` that carries only ``error`` (and the leader and
    epoch the answering node knows)."""
    if key == ApiKey.VOTE:
        return VoteResponse(error, leader_id, epoch, False, False)
    if key == ApiKey.BEGIN_QUORUM_EPOCH:
        return BeginQuorumEpochResponse(error, leader_id, epoch)
    if key == ApiKey.END_QUORUM_EPOCH:
        return EndQuorumEpochResponse(error, leader_id, epoch)
    if key == ApiKey.FETCH:
        return FetchResponse(error, leader_id, epoch, -1, -1)
    return FetchSnapshotResponse(error, leader_id, epoch, OffsetAndEpoch(-1, -1))


def _read_vote(request: Any, version: int, node_id: int) -> Inbound | Refusal:
    key = ApiKey.VOTE
    partition = _metadata_partition(request.topics, "topic_name")
    if partition is None:
        return _refuse(key, version, ErrorCode.INVALID_REQUEST)
    voter_id = int(getattr(request, "voter_id", -1))
    if voter_id not in (-1, node_id):
        return _refuse_partition(key, version, ErrorCode.INVALID_VOTER_KEY)
    epoch = int(partition.replica_epoch)
    last_epoch = int(partition.last_offset_epoch)
    last_offset = int(partition.last_offset)
    # Kafka's checks: the candidate's log cannot end in its own (new) epoch or later.
    if last_offset < 0 or last_epoch < 0 or last_epoch >= epoch:
        return _refuse_partition(key, version, ErrorCode.INVALID_REQUEST)
    candidate = int(partition.replica_id)
    message = VoteRequest(
        candidate_epoch=epoch,
        candidate_id=candidate,
        voter_id=node_id,
        last_offset_epoch=last_epoch,
        last_offset=last_offset,
        pre_vote=bool(getattr(partition, "pre_vote", False)),
    )
    return Inbound(candidate, message)


def _read_begin(request: Any, version: int, node_id: int) -> Inbound | Refusal:
    key = ApiKey.BEGIN_QUORUM_EPOCH
    partition = _metadata_partition(request.topics, "topic_name")
    if partition is None:
        return _refuse(key, version, ErrorCode.INVALID_REQUEST)
    voter_id = int(getattr(request, "voter_id", -1))
    if voter_id not in (-1, node_id):
        return _refuse_partition(key, version, ErrorCode.INVALID_VOTER_KEY)
    leader = int(partition.leader_id)
    epoch = int(partition.leader_epoch)
    if leader < 0 or epoch < 0:
        return _refuse_partition(key, version, ErrorCode.INVALID_REQUEST)
    return Inbound(leader, BeginQuorumEpochRequest(epoch, leader, node_id))


def _read_end(request: Any, version: int) -> Inbound | Refusal:
    key = ApiKey.END_QUORUM_EPOCH
    partition = _metadata_partition(request.topics, "topic_name")
    if partition is None:
        return _refuse(key, version, ErrorCode.INVALID_REQUEST)
    leader = int(partition.leader_id)
    epoch = int(partition.leader_epoch)
    if leader < 0 or epoch < 0:
        return _refuse_partition(key, version, ErrorCode.INVALID_REQUEST)
    if hasattr(partition, "preferred_candidates"):
        successors = tuple(int(c.candidate_id) for c in partition.preferred_candidates)
    else:
        successors = tuple(int(c) for c in partition.preferred_successors)
    return Inbound(leader, EndQuorumEpochRequest(epoch, leader, successors))


def fetch_names_metadata(request: RequestPayload) -> bool:
    """Whether a Fetch asks for the metadata topic (by name before v13, by id from v13):
    such a Fetch is the quorum's, any other goes to the partitions."""
    name_field = "topic_id" if int(request.__version__) >= 13 else "topic"
    return any(_names_metadata_topic(t, name_field) for t in getattr(request, "topics", ()))


def _read_fetch(request: Any, version: int) -> Inbound | Refusal:
    key = ApiKey.FETCH
    if version < MIN_RAFT_FETCH_VERSION:
        return _refuse(key, version, ErrorCode.UNSUPPORTED_VERSION)
    name_field = "topic_id" if version >= 13 else "topic"
    partition = _metadata_partition(request.topics, name_field, "partition")
    if partition is None:
        return _refuse(key, version, ErrorCode.INVALID_REQUEST)
    if hasattr(request, "replica_state"):
        replica = int(request.replica_state.replica_id)
    else:
        replica = int(request.replica_id)
    max_wait = _to_millis(request.max_wait)
    current_epoch = int(partition.current_leader_epoch)
    fetch_offset = int(partition.fetch_offset)
    last_epoch = int(partition.last_fetched_epoch)
    if max_wait < 0 or fetch_offset < 0 or last_epoch < 0 or last_epoch > current_epoch:
        return _refuse_partition(key, version, ErrorCode.INVALID_REQUEST)
    max_bytes = max(1, min(int(request.max_bytes), int(partition.partition_max_bytes)))
    message = FetchRequest(
        replica_id=replica,
        current_leader_epoch=current_epoch,
        fetch_offset=fetch_offset,
        last_fetched_epoch=last_epoch,
        max_bytes=max_bytes,
        max_wait_ms=max_wait,
    )
    return Inbound(replica, message)


def _read_fetch_snapshot(request: Any, version: int) -> Inbound | Refusal:
    key = ApiKey.FETCH_SNAPSHOT
    if len(request.topics) != 1 or len(request.topics[0].partitions) != 1:
        return _refuse(key, version, ErrorCode.INVALID_REQUEST)
    partition = _metadata_partition(request.topics, "name", "partition")
    if partition is None:
        return _refuse_partition(key, version, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    snapshot = OffsetAndEpoch(
        int(partition.snapshot_id.end_offset), int(partition.snapshot_id.epoch)
    )
    replica = int(request.replica_id)
    message = FetchSnapshotRequest(
        replica_id=replica,
        current_leader_epoch=int(partition.current_leader_epoch),
        snapshot_id=snapshot,
        position=int(partition.position),
        max_bytes=int(request.max_bytes),
    )
    return Inbound(replica, message)


# ---------------------------------------------------------------------------- responses out

_RESPONSE_KEYS: dict[type, ApiKey] = {
    VoteResponse: ApiKey.VOTE,
    BeginQuorumEpochResponse: ApiKey.BEGIN_QUORUM_EPOCH,
    EndQuorumEpochResponse: ApiKey.END_QUORUM_EPOCH,
    FetchResponse: ApiKey.FETCH,
    FetchSnapshotResponse: ApiKey.FETCH_SNAPSHOT,
}


def api_key_of(message: Message) -> ApiKey:
    """The API a message belongs to."""
    for cls, key in _RESPONSE_KEYS.items():
        if isinstance(message, cls):
            return key
    if isinstance(message, VoteRequest):
        return ApiKey.VOTE
    if isinstance(message, BeginQuorumEpochRequest):
        return ApiKey.BEGIN_QUORUM_EPOCH
    if isinstance(message, EndQuorumEpochRequest):
        return ApiKey.END_QUORUM_EPOCH
    if isinstance(message, FetchRequest):
        return ApiKey.FETCH
    return ApiKey.FETCH_SNAPSHOT


def is_request(message: Message) -> bool:
    return isinstance(message, _REQUEST_MESSAGES)


def write_response(message: Message, key: ApiKey, version: int) -> ResponsePayload:
    """The kio response of ``version`` carrying ``message`` (a response of API ``key``)."""
    cls = _response_cls(key, version)
    if isinstance(message, VoteResponse | BeginQuorumEpochResponse | EndQuorumEpochResponse):
        values: dict[str, Any] = {
            "partition_index": METADATA_PARTITION,
            "error_code": message.error.to_kio(),
            "leader_id": _leader(message.leader_id),
            "leader_epoch": message.leader_epoch,
        }
        if isinstance(message, VoteResponse):
            values["vote_granted"] = message.vote_granted
        partition = _make(_nested(cls, "PartitionData"), **values)
        topic = _make(_nested(cls, "TopicData"), topic_name=METADATA_TOPIC, partitions=(partition,))
        response: ResponsePayload = _make(
            cls, error_code=ErrorCode.NONE.to_kio(), topics=(topic,), node_endpoints=()
        )
        return response
    if isinstance(message, FetchResponse):
        return _write_fetch_response(message, cls, version)
    if isinstance(message, FetchSnapshotResponse):
        snapshot = _make(
            _nested(cls, "SnapshotId"),
            end_offset=message.snapshot_id.offset,
            epoch=message.snapshot_id.epoch,
        )
        leader = _make(
            _nested(cls, "LeaderIdAndEpoch"),
            leader_id=_leader(message.leader_id),
            leader_epoch=message.leader_epoch,
        )
        partition = _make(
            _nested(cls, "PartitionSnapshot"),
            index=METADATA_PARTITION,
            error_code=message.error.to_kio(),
            snapshot_id=snapshot,
            current_leader=leader,
            size=message.size,
            position=message.position,
            unaligned_records=message.unaligned_records,
        )
        topic = _make(_nested(cls, "TopicSnapshot"), name=METADATA_TOPIC, partitions=(partition,))
        response = _make(
            cls,
            throttle_time=_millis(0),
            error_code=ErrorCode.NONE.to_kio(),
            topics=(topic,),
            node_endpoints=(),
        )
        return response
    raise TypeError(f"{type(message).__name__} is not a response")


def _write_fetch_response(message: FetchResponse, cls: type, version: int) -> ResponsePayload:
    diverging = message.diverging_epoch
    snapshot = message.snapshot_id
    partition = _make(
        _nested(cls, "PartitionData"),
        partition_index=METADATA_PARTITION,
        error_code=message.error.to_kio(),
        high_watermark=message.high_watermark,
        last_stable_offset=-1,
        log_start_offset=message.log_start_offset,
        diverging_epoch=_make(
            _nested(cls, "EpochEndOffset"),
            epoch=diverging.epoch if diverging is not None else -1,
            end_offset=diverging.offset if diverging is not None else -1,
        ),
        current_leader=_make(
            _nested(cls, "LeaderIdAndEpoch"),
            leader_id=_leader(message.leader_id),
            leader_epoch=message.leader_epoch,
        ),
        snapshot_id=_make(
            _nested(cls, "SnapshotId"),
            end_offset=snapshot.offset if snapshot is not None else -1,
            epoch=snapshot.epoch if snapshot is not None else -1,
        ),
        aborted_transactions=None,
        preferred_read_replica=-1,
        records=encode_entries(message.records) if message.records else b"",
    )
    topic = _make(
        _nested(cls, "FetchableTopicResponse"),
        topic=METADATA_TOPIC,
        topic_id=METADATA_TOPIC_ID,
        partitions=(partition,),
    )
    response: ResponsePayload = _make(
        cls,
        throttle_time=_millis(0),
        error_code=ErrorCode.NONE.to_kio(),
        session_id=0,
        responses=(topic,),
        node_endpoints=(),
    )
    return response


# ---------------------------------------------------------------------------- responses in


def read_response(response: ResponsePayload) -> Message:
    """The message in a response to one of this node's requests.

    A top-level error, a response without the metadata partition, or records that do not
    decode come back as that error (INVALID_REQUEST, CORRUPT_MESSAGE) with no leader and epoch
    -1: the node counts the request as failed and tries again later."""
    key = ApiKey(int(response.__api_key__))
    top = _error(getattr(response, "error_code", 0))
    if top is not ErrorCode.NONE:
        return error_reply(key, top)
    try:
        return _read_response_partition(key, response)
    except (AttributeError, TypeError, ValueError, IndexError):
        return error_reply(key, ErrorCode.INVALID_REQUEST)


def _read_response_partition(key: ApiKey, response: Any) -> Message:
    if key == ApiKey.FETCH:
        topics = response.responses
        name_field = "topic_id" if int(response.__version__) >= 13 else "topic"
    elif key == ApiKey.FETCH_SNAPSHOT:
        topics = response.topics
        name_field = "name"
    else:
        topics = response.topics
        name_field = "topic_name"
    index_field = "index" if key == ApiKey.FETCH_SNAPSHOT else "partition_index"
    partition = _metadata_partition(topics, name_field, index_field)
    if partition is None:
        return error_reply(key, ErrorCode.INVALID_REQUEST)
    error = _error(partition.error_code)
    if key == ApiKey.FETCH:
        return _read_fetch_partition(partition, error)
    if key == ApiKey.FETCH_SNAPSHOT:
        return FetchSnapshotResponse(
            error,
            _leader_or_none(int(partition.current_leader.leader_id)),
            int(partition.current_leader.leader_epoch),
            OffsetAndEpoch(int(partition.snapshot_id.end_offset), int(partition.snapshot_id.epoch)),
            int(partition.size),
            int(partition.position),
            bytes(partition.unaligned_records),
        )
    leader = _leader_or_none(int(partition.leader_id))
    epoch = int(partition.leader_epoch)
    if key == ApiKey.VOTE:
        # Whether the request was a pre-vote is known to the asker only; the node matches the
        # answer to its request by correlation id, and reads ``pre_vote`` from nothing else.
        return VoteResponse(error, leader, epoch, bool(partition.vote_granted), False)
    if key == ApiKey.BEGIN_QUORUM_EPOCH:
        return BeginQuorumEpochResponse(error, leader, epoch)
    return EndQuorumEpochResponse(error, leader, epoch)


def _read_fetch_partition(partition: Any, error: ErrorCode) -> FetchResponse:
    leader = _leader_or_none(int(partition.current_leader.leader_id))
    epoch = int(partition.current_leader.leader_epoch)
    diverging = partition.diverging_epoch
    snapshot = partition.snapshot_id
    records = partition.records
    try:
        entries = tuple(decode_entries(bytes(records))) if records else ()
    except ValueError:
        return FetchResponse(ErrorCode.CORRUPT_MESSAGE, leader, epoch, -1, -1)
    return FetchResponse(
        error,
        leader,
        epoch,
        int(partition.high_watermark),
        int(partition.log_start_offset),
        records=entries,
        diverging_epoch=(
            OffsetAndEpoch(int(diverging.end_offset), int(diverging.epoch))
            if int(diverging.epoch) >= 0
            else None
        ),
        snapshot_id=(
            OffsetAndEpoch(int(snapshot.end_offset), int(snapshot.epoch))
            if int(snapshot.epoch) >= 0 and int(snapshot.end_offset) >= 0
            else None
        ),
    )


# ---------------------------------------------------------------------------- DescribeQuorum


@dataclass(frozen=True, slots=True)
class ReplicaDescription:
    """One voter or observer as DescribeQuorum reports it (-1: unknown)."""

    replica_id: int
    log_end_offset: int
    last_fetch_timestamp: int = -1
    last_caught_up_timestamp: int = -1


@dataclass(frozen=True, slots=True)
class QuorumDescription:
    """What DescribeQuorum answers: the leader's view of the quorum."""

    leader_id: int
    leader_epoch: int
    high_watermark: int
    voters: tuple[ReplicaDescription, ...]
    observers: tuple[ReplicaDescription, ...] = ()


def check_describe_quorum(request: RequestPayload) -> ErrorCode:
    """NONE if a DescribeQuorum request asks for exactly ``__cluster_metadata-0``, else
    UNKNOWN_TOPIC_OR_PARTITION (Kafka's answer, at the partition level)."""
    if _metadata_partition(getattr(request, "topics", ()), "topic_name") is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    return ErrorCode.NONE


def describe_quorum_response(
    version: int, description: QuorumDescription | None, error: ErrorCode = ErrorCode.NONE
) -> ResponsePayload:
    """The DescribeQuorum response of ``version``: ``description``, or ``error`` on the
    partition (NOT_LEADER_OR_FOLLOWER from a node that does not lead, as Kafka 4.x answers)."""
    cls = _response_cls(ApiKey.DESCRIBE_QUORUM, version)
    state = _nested(cls, "ReplicaState")

    def replica(r: ReplicaDescription) -> Any:
        return _make(
            state,
            replica_id=r.replica_id,
            replica_directory_id=NO_DIRECTORY,
            log_end_offset=r.log_end_offset,
            last_fetch_timestamp=r.last_fetch_timestamp,
            last_caught_up_timestamp=r.last_caught_up_timestamp,
        )

    if description is None or error is not ErrorCode.NONE:
        if error is ErrorCode.NONE:
            error = ErrorCode.NOT_LEADER_OR_FOLLOWER
        values: dict[str, Any] = {
            "error_code": error.to_kio(),
            "error_message": error.message,
            "leader_id": -1,
            "leader_epoch": -1,
            "high_watermark": -1,
            "current_voters": (),
            "observers": (),
        }
    else:
        values = {
            "error_code": ErrorCode.NONE.to_kio(),
            "error_message": None,
            "leader_id": description.leader_id,
            "leader_epoch": description.leader_epoch,
            "high_watermark": description.high_watermark,
            "current_voters": tuple(replica(r) for r in description.voters),
            "observers": tuple(replica(r) for r in description.observers),
        }
    partition = _make(_nested(cls, "PartitionData"), partition_index=METADATA_PARTITION, **values)
    topic = _make(_nested(cls, "TopicData"), topic_name=METADATA_TOPIC, partitions=(partition,))
    response: ResponsePayload = _make(
        cls, error_code=ErrorCode.NONE.to_kio(), error_message=None, topics=(topic,), nodes=()
    )
    return response


def read_describe_quorum(
    response: RequestPayload | ResponsePayload,
) -> QuorumDescription | ErrorCode:
    """A DescribeQuorum response as a :class:`QuorumDescription`, or its error."""
    top = _error(getattr(response, "error_code", 0))
    if top is not ErrorCode.NONE:
        return top
    partition = _metadata_partition(getattr(response, "topics", ()), "topic_name")
    if partition is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    error = _error(partition.error_code)
    if error is not ErrorCode.NONE:
        return error

    def replica(r: Any) -> ReplicaDescription:
        return ReplicaDescription(
            int(r.replica_id),
            int(r.log_end_offset),
            int(getattr(r, "last_fetch_timestamp", -1)),
            int(getattr(r, "last_caught_up_timestamp", -1)),
        )

    return QuorumDescription(
        int(partition.leader_id),
        int(partition.leader_epoch),
        int(partition.high_watermark),
        tuple(replica(r) for r in partition.current_voters),
        tuple(replica(r) for r in partition.observers),
    )
