"""The API table: API keys, kio's message classes per (key, version), and header versions.

kio generates one request class and one response class per (API, version) from Kafka's JSON
message specs. Each class says whether its version is *flexible* (``__flexible__``: compact
strings and arrays, tagged fields). The header version follows from that:

- requests use header v2 when flexible, v1 otherwise; ControlledShutdown v0 alone used v0;
- responses use header v1 when flexible, v0 otherwise; ApiVersions responses always use v0,
  because a client must be able to read the answer before it knows which versions the broker
  speaks.

Versions beyond kio's newest are assumed flexible when kio's newest is (flexible ranges are
open-ended, "N+", in Kafka's specs); this is what lets the broker read the header of an
ApiVersions request from a newer client. Nothing here imports a schema module until it is asked
for, so importing the package stays cheap.
"""

from __future__ import annotations

import enum
from functools import cache

from kio.index import load_request_schema, load_response_schema
from kio.schema.index import api_key_map, schema_name_map
from kio.static.constants import EntityType
from kio.static.protocol import RequestPayload, ResponsePayload


class ApiKey(enum.IntEnum):
    """Every API key kio has message schemas for; names are Kafka's."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    WRITE_TXN_MARKERS = 27
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    ALTER_REPLICA_LOG_DIRS = 34
    DESCRIBE_LOG_DIRS = 35
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    CREATE_DELEGATION_TOKEN = 38
    RENEW_DELEGATION_TOKEN = 39
    EXPIRE_DELEGATION_TOKEN = 40
    DESCRIBE_DELEGATION_TOKEN = 41
    DELETE_GROUPS = 42
    ELECT_LEADERS = 43
    INCREMENTAL_ALTER_CONFIGS = 44
    ALTER_PARTITION_REASSIGNMENTS = 45
    LIST_PARTITION_REASSIGNMENTS = 46
    OFFSET_DELETE = 47
    DESCRIBE_CLIENT_QUOTAS = 48
    ALTER_CLIENT_QUOTAS = 49
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    VOTE = 52
    BEGIN_QUORUM_EPOCH = 53
    END_QUORUM_EPOCH = 54
    DESCRIBE_QUORUM = 55
    ALTER_PARTITION = 56
    UPDATE_FEATURES = 57
    ENVELOPE = 58
    FETCH_SNAPSHOT = 59
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61
    BROKER_REGISTRATION = 62
    BROKER_HEARTBEAT = 63
    UNREGISTER_BROKER = 64
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66
    ALLOCATE_PRODUCER_IDS = 67
    CONSUMER_GROUP_HEARTBEAT = 68
    CONSUMER_GROUP_DESCRIBE = 69
    CONTROLLER_REGISTRATION = 70
    GET_TELEMETRY_SUBSCRIPTIONS = 71
    PUSH_TELEMETRY = 72
    ASSIGN_REPLICAS_TO_DIRS = 73
    LIST_CONFIG_RESOURCES = 74
    DESCRIBE_TOPIC_PARTITIONS = 75
    SHARE_GROUP_HEARTBEAT = 76
    SHARE_GROUP_DESCRIBE = 77
    SHARE_FETCH = 78
    SHARE_ACKNOWLEDGE = 79
    ADD_RAFT_VOTER = 80
    REMOVE_RAFT_VOTER = 81
    UPDATE_RAFT_VOTER = 82
    INITIALIZE_SHARE_GROUP_STATE = 83
    READ_SHARE_GROUP_STATE = 84
    WRITE_SHARE_GROUP_STATE = 85
    DELETE_SHARE_GROUP_STATE = 86
    READ_SHARE_GROUP_STATE_SUMMARY = 87
    STREAMS_GROUP_HEARTBEAT = 88
    STREAMS_GROUP_DESCRIBE = 89
    DESCRIBE_SHARE_GROUP_OFFSETS = 90
    ALTER_SHARE_GROUP_OFFSETS = 91
    DELETE_SHARE_GROUP_OFFSETS = 92


# ControlledShutdown (key 7) left Kafka with ZooKeeper mode and kio has no schemas for it; it is
# named here only because its v0 is the one request that used request header v0.
CONTROLLED_SHUTDOWN_KEY = 7
_FLEXIBLE_FROM_OUTSIDE_KIO = {CONTROLLED_SHUTDOWN_KEY: 3}


@cache
def kio_versions(api_key: int) -> tuple[int, int] | None:
    """The (lowest, highest) version kio has schemas for, or None for an unknown key."""
    name = api_key_map.get(api_key)
    if name is None:
        return None
    versions = [v for v, kinds in schema_name_map[name].items() if EntityType.request in kinds]
    return min(versions), max(versions)


@cache
def request_class(api_key: int, api_version: int) -> type[RequestPayload] | None:
    """kio's request class for (key, version), or None when kio has none."""
    span = kio_versions(api_key)
    if span is None or not span[0] <= api_version <= span[1]:
        return None
    return load_request_schema(api_key, api_version)


@cache
def response_class(api_key: int, api_version: int) -> type[ResponsePayload] | None:
    """kio's response class for (key, version), or None when kio has none."""
    span = kio_versions(api_key)
    if span is None or not span[0] <= api_version <= span[1]:
        return None
    return load_response_schema(api_key, api_version)


@cache
def _first_flexible_version(api_key: int) -> int | None:
    """The first flexible version of an API (None: no version kio knows is flexible)."""
    if api_key in _FLEXIBLE_FROM_OUTSIDE_KIO:
        return _FLEXIBLE_FROM_OUTSIDE_KIO[api_key]
    span = kio_versions(api_key)
    if span is None:
        return None
    lowest, highest = span
    for version in range(lowest, highest + 1):
        cls = request_class(api_key, version)
        if cls is not None and cls.__flexible__:
            # An API whose oldest known version is flexible was flexible from the start.
            return 0 if version == lowest else version
    return None


def is_known_api(api_key: int) -> bool:
    return api_key in _FLEXIBLE_FROM_OUTSIDE_KIO or kio_versions(api_key) is not None


def is_flexible(api_key: int, api_version: int) -> bool:
    """Whether (key, version) uses the flexible encoding. The key must be known."""
    if not is_known_api(api_key):
        raise ValueError(f"unknown API key {api_key}")
    first = _first_flexible_version(api_key)
    return first is not None and api_version >= first


def request_header_version(api_key: int, api_version: int) -> int:
    """The request header version (0, 1 or 2) for (key, version). The key must be known."""
    if api_key == CONTROLLED_SHUTDOWN_KEY and api_version == 0:
        return 0
    return 2 if is_flexible(api_key, api_version) else 1


def response_header_version(api_key: int, api_version: int) -> int:
    """The response header version (0 or 1) for (key, version). The key must be known."""
    if api_key == ApiKey.API_VERSIONS:
        return 0
    return 1 if is_flexible(api_key, api_version) else 0


def as_api_key(value: int) -> ApiKey | None:
    """The :class:`ApiKey` member for ``value``, or None."""
    return _API_KEYS.get(value)


def api_name(api_key: int) -> str:
    """Kafka's name of an API key ("Produce"), or "Unknown(<key>)"."""
    try:
        return _CAMEL_NAMES[ApiKey(api_key)]
    except ValueError:
        return f"Unknown({api_key})"


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


_CAMEL_NAMES = {key: _camel(key.name) for key in ApiKey}
_API_KEYS: dict[int, ApiKey] = {int(key): key for key in ApiKey}
