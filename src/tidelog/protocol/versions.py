"""The supported-version table: which versions of which APIs Tidelog serves.

This is the single place that lists them. Each entry has two ranges:

- the *advertised* range, sent to clients in ApiVersions responses;
- the *accepted* range, the versions :func:`tidelog.protocol.codec.parse_request` will parse.

They differ only for Produce: Kafka 4 dropped Produce v0-v2, but librdkafka decides whether the
broker supports compression by checking that Produce v0 is advertised, and silently stops
compressing otherwise. So Produce is advertised from v0 while v0-v2 are refused (kio has no
schemas for them either), exactly as Kafka 4 does.

Every accepted version has kio schemas (a unit test checks this), and each range is the widest
kio 0.6.5 has, which covers what librdkafka 2.x, the Java client 3.9/4.x, kafka-python and
aiokafka send. The broker advertises only the APIs it has handlers for, by passing a subset of
keys to the ApiVersions builder.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from tidelog.protocol.apis import ApiKey


@dataclass(frozen=True, slots=True)
class VersionRange:
    """Versions of one API: advertised [min_version, max_version], accepted [min_accepted, max]."""

    api_key: ApiKey
    min_version: int
    max_version: int
    min_accepted: int

    def __post_init__(self) -> None:
        if not 0 <= self.min_version <= self.min_accepted <= self.max_version:
            raise ValueError(f"inconsistent version range {self}")

    def accepts(self, api_version: int) -> bool:
        return self.min_accepted <= api_version <= self.max_version


def _serve(
    key: ApiKey, lowest: int, highest: int, *, advertise_from: int | None = None
) -> VersionRange:
    return VersionRange(
        api_key=key,
        min_version=lowest if advertise_from is None else advertise_from,
        max_version=highest,
        min_accepted=lowest,
    )


# fmt: off
_TABLE: tuple[VersionRange, ...] = (
    #      API                                    accepted   advertised from
    _serve(ApiKey.PRODUCE,                        3, 13,     advertise_from=0),
    _serve(ApiKey.FETCH,                          4, 18),
    _serve(ApiKey.LIST_OFFSETS,                   1, 11),
    _serve(ApiKey.METADATA,                       0, 13),
    _serve(ApiKey.OFFSET_COMMIT,                  2, 10),
    _serve(ApiKey.OFFSET_FETCH,                   1, 10),
    _serve(ApiKey.FIND_COORDINATOR,               0, 6),
    _serve(ApiKey.JOIN_GROUP,                     0, 9),
    _serve(ApiKey.HEARTBEAT,                      0, 4),
    _serve(ApiKey.LEAVE_GROUP,                    0, 5),
    _serve(ApiKey.SYNC_GROUP,                     0, 5),
    _serve(ApiKey.DESCRIBE_GROUPS,                0, 6),
    _serve(ApiKey.LIST_GROUPS,                    0, 5),
    _serve(ApiKey.SASL_HANDSHAKE,                 0, 1),
    _serve(ApiKey.API_VERSIONS,                   0, 4),
    _serve(ApiKey.CREATE_TOPICS,                  2, 7),
    _serve(ApiKey.DELETE_TOPICS,                  1, 6),
    _serve(ApiKey.DELETE_RECORDS,                 0, 2),
    _serve(ApiKey.INIT_PRODUCER_ID,               0, 6),
    _serve(ApiKey.OFFSET_FOR_LEADER_EPOCH,        2, 4),
    _serve(ApiKey.ADD_PARTITIONS_TO_TXN,          0, 4),
    _serve(ApiKey.ADD_OFFSETS_TO_TXN,             0, 4),
    _serve(ApiKey.END_TXN,                        0, 4),
    _serve(ApiKey.TXN_OFFSET_COMMIT,              0, 4),
    _serve(ApiKey.WRITE_TXN_MARKERS,              1, 2),
    _serve(ApiKey.DESCRIBE_CONFIGS,               1, 4),
    _serve(ApiKey.ALTER_CONFIGS,                  0, 2),
    _serve(ApiKey.DESCRIBE_LOG_DIRS,              1, 5),
    _serve(ApiKey.CREATE_PARTITIONS,              0, 3),
    _serve(ApiKey.DELETE_GROUPS,                  0, 2),
    _serve(ApiKey.SASL_AUTHENTICATE,              0, 2),
    _serve(ApiKey.INCREMENTAL_ALTER_CONFIGS,      0, 1),
    _serve(ApiKey.OFFSET_DELETE,                  0, 0),
    _serve(ApiKey.DESCRIBE_CLUSTER,               0, 2),
    _serve(ApiKey.DESCRIBE_PRODUCERS,             0, 0),
    _serve(ApiKey.DESCRIBE_TRANSACTIONS,          0, 0),
    _serve(ApiKey.LIST_TRANSACTIONS,              0, 2),
    _serve(ApiKey.DESCRIBE_CLIENT_QUOTAS,         0, 1),
    _serve(ApiKey.ALTER_CLIENT_QUOTAS,            0, 1),
    _serve(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, 0),
    _serve(ApiKey.ALTER_USER_SCRAM_CREDENTIALS,   0, 0),
    # Kafka 4 dropped v0 of the ACL APIs (KIP-896); every client sends v1 or later.
    _serve(ApiKey.DESCRIBE_ACLS,                  1, 3),
    _serve(ApiKey.CREATE_ACLS,                    1, 3),
    _serve(ApiKey.DELETE_ACLS,                    1, 3),
    _serve(ApiKey.ELECT_LEADERS,                  0, 2),
    _serve(ApiKey.ALTER_PARTITION_REASSIGNMENTS,  0, 1),
    _serve(ApiKey.LIST_PARTITION_REASSIGNMENTS,   0, 0),
)
# fmt: on

SUPPORTED_VERSIONS: Mapping[ApiKey, VersionRange] = MappingProxyType(
    {entry.api_key: entry for entry in sorted(_TABLE, key=lambda e: e.api_key)}
)
"""Every API Tidelog serves, by key."""

# fmt: off
_QUORUM_TABLE: tuple[VersionRange, ...] = (
    # The metadata quorum's own APIs (KRaft), every version Kafka defines.
    _serve(ApiKey.VOTE,                           0, 2),
    _serve(ApiKey.BEGIN_QUORUM_EPOCH,             0, 1),
    _serve(ApiKey.END_QUORUM_EPOCH,               0, 1),
    _serve(ApiKey.DESCRIBE_QUORUM,                0, 2),
    _serve(ApiKey.FETCH_SNAPSHOT,                 0, 1),
)
_MEMBERSHIP_TABLE: tuple[VersionRange, ...] = (
    # What brokers send the controller to join and leave the cluster (KRaft).
    _serve(ApiKey.BROKER_REGISTRATION,            0, 4),
    _serve(ApiKey.BROKER_HEARTBEAT,               0, 2),
    _serve(ApiKey.UNREGISTER_BROKER,              0, 0),
    # A broker's block of producer ids, from the active controller.
    _serve(ApiKey.ALLOCATE_PRODUCER_IDS,          0, 0),
    # A partition leader's ISR changes; Kafka 4 dropped v0-1 (topic names, KIP-896).
    _serve(ApiKey.ALTER_PARTITION,                2, 3),
)
# fmt: on

CONTROLLER_VERSIONS: Mapping[ApiKey, VersionRange] = MappingProxyType(
    {
        entry.api_key: entry
        for entry in sorted((*_TABLE, *_QUORUM_TABLE, *_MEMBERSHIP_TABLE), key=lambda e: e.api_key)
    }
)
"""What a controller listener serves: every API above plus the quorum's and the broker
membership's, which Kafka serves on controller listeners only (a Fetch there may also be of
``__cluster_metadata``)."""


def restrict(
    api_keys: Iterable[int], table: Mapping[ApiKey, VersionRange] = SUPPORTED_VERSIONS
) -> Mapping[ApiKey, VersionRange]:
    """The part of ``table`` for ``api_keys`` (keys the table lacks are ignored)."""
    wanted = set(api_keys)
    return MappingProxyType({key: entry for key, entry in table.items() if key in wanted})


def markdown_table(table: Mapping[ApiKey, VersionRange] = SUPPORTED_VERSIONS) -> str:
    """The table as Markdown, as docs/protocol.md shows it (a unit test keeps them equal)."""
    from tidelog.protocol.apis import api_name, is_flexible

    lines = [
        "| Key | API | Advertised | Accepted | Flexible from |",
        "|----:|-----|-----------:|---------:|--------------:|",
    ]
    for key, entry in table.items():
        flexible = [
            v for v in range(entry.min_accepted, entry.max_version + 1) if is_flexible(key, v)
        ]
        lines.append(
            f"| {int(key)} | {api_name(key)} | {entry.min_version}-{entry.max_version} "
            f"| {entry.min_accepted}-{entry.max_version} "
            f"| {('v' + str(flexible[0])) if flexible else '-'} |"
        )
    return "\n".join(lines) + "\n"
