"""Kafka error codes: the one table every response's error field comes from.

Each member is the Kafka number (an ``int16`` on the wire) and carries two attributes: whether a
client may retry the operation unchanged (``retriable``, the classification Kafka uses) and a
short description (``message``) in Tidelog's own words. Names are Kafka's.

kio has its own ``ErrorCode`` enum, which its message classes use for ``error_code`` fields. It
cannot be subclassed (it has members), so this table is separate; :meth:`ErrorCode.to_kio` and
:meth:`ErrorCode.from_wire` convert, and a unit test keeps the numbers and retriable flags of the
two tables identical.
"""

from __future__ import annotations

import enum

from kio.schema.errors import ErrorCode as KioErrorCode


class ErrorCode(enum.IntEnum):
    """A Kafka protocol error code."""

    retriable: bool
    message: str

    def __new__(cls, value: int, retriable: bool, message: str) -> ErrorCode:
        member = int.__new__(cls, value)
        member._value_ = value
        member.retriable = retriable
        member.message = message
        return member

    UNKNOWN_SERVER_ERROR = (
        -1,
        False,
        "The broker hit an unexpected error while handling the request.",
    )
    NONE = 0, False, "No error."
    OFFSET_OUT_OF_RANGE = 1, False, "The offset lies outside the range the partition holds."
    CORRUPT_MESSAGE = (
        2,
        True,
        "A record batch failed validation (CRC, size, or a missing key on a compacted topic).",
    )
    UNKNOWN_TOPIC_OR_PARTITION = 3, True, "This broker does not host that topic or partition."
    INVALID_FETCH_SIZE = 4, False, "The fetch size in the request is not valid."
    LEADER_NOT_AVAILABLE = 5, True, "The partition has no leader right now; an election is running."
    NOT_LEADER_OR_FOLLOWER = (
        6,
        True,
        "This broker is not the leader (or not a replica) of the partition.",
    )
    REQUEST_TIMED_OUT = 7, True, "The request did not complete within its timeout."
    BROKER_NOT_AVAILABLE = 8, False, "The broker is not available."
    REPLICA_NOT_AVAILABLE = 9, True, "The replica is not available for the partition."
    MESSAGE_TOO_LARGE = 10, False, "A record batch is larger than the broker accepts."
    STALE_CONTROLLER_EPOCH = 11, False, "The request came from a controller that has been replaced."
    OFFSET_METADATA_TOO_LARGE = (
        12,
        False,
        "The metadata string of the committed offset is too long.",
    )
    NETWORK_EXCEPTION = 13, True, "The connection closed before a response arrived."
    COORDINATOR_LOAD_IN_PROGRESS = 14, True, "The coordinator is still loading its state."
    COORDINATOR_NOT_AVAILABLE = 15, True, "The coordinator is not available."
    NOT_COORDINATOR = 16, True, "This broker is not the coordinator for that group or transaction."
    INVALID_TOPIC_EXCEPTION = (
        17,
        False,
        "The topic name is not valid or the topic cannot be used this way.",
    )
    RECORD_LIST_TOO_LARGE = 18, False, "The record batch is larger than the segment size."
    NOT_ENOUGH_REPLICAS = (
        19,
        True,
        "Fewer in-sync replicas than min.insync.replicas; the write was refused.",
    )
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = (
        20,
        True,
        "The write is in the log but reached fewer in-sync replicas than required.",
    )
    INVALID_REQUIRED_ACKS = 21, False, "The acks value is not one of -1, 0 or 1."
    ILLEGAL_GENERATION = 22, False, "The group generation in the request is not the current one."
    INCONSISTENT_GROUP_PROTOCOL = (
        23,
        False,
        "The member's protocols do not match the group's, or none were given.",
    )
    INVALID_GROUP_ID = 24, False, "The group id is not valid."
    UNKNOWN_MEMBER_ID = 25, False, "The coordinator does not know this member id."
    INVALID_SESSION_TIMEOUT = (
        26,
        False,
        "The session timeout is outside the broker's allowed range.",
    )
    REBALANCE_IN_PROGRESS = 27, False, "The group is rebalancing; the member must rejoin."
    INVALID_COMMIT_OFFSET_SIZE = 28, False, "The size of the offset commit data is not valid."
    TOPIC_AUTHORIZATION_FAILED = 29, False, "Not authorized to access the topic."
    GROUP_AUTHORIZATION_FAILED = 30, False, "Not authorized to access the group."
    CLUSTER_AUTHORIZATION_FAILED = 31, False, "Not authorized for this cluster operation."
    INVALID_TIMESTAMP = 32, False, "A record timestamp is outside the accepted range."
    UNSUPPORTED_SASL_MECHANISM = 33, False, "The broker does not offer that SASL mechanism."
    ILLEGAL_SASL_STATE = 34, False, "The request is not allowed in the current SASL state."
    UNSUPPORTED_VERSION = 35, False, "The broker does not support this version of the API."
    TOPIC_ALREADY_EXISTS = 36, False, "A topic with this name exists already."
    INVALID_PARTITIONS = 37, False, "The partition count is not valid."
    INVALID_REPLICATION_FACTOR = (
        38,
        False,
        "The replication factor is below 1 or above the number of brokers.",
    )
    INVALID_REPLICA_ASSIGNMENT = 39, False, "The replica assignment is not valid."
    INVALID_CONFIG = 40, False, "A configuration value is not valid."
    NOT_CONTROLLER = 41, True, "This node is not the active controller."
    INVALID_REQUEST = 42, False, "The request is malformed or not valid for this broker."
    UNSUPPORTED_FOR_MESSAGE_FORMAT = (
        43,
        False,
        "The message format on the broker does not support this request.",
    )
    POLICY_VIOLATION = 44, False, "The request breaks a policy configured on the broker."
    OUT_OF_ORDER_SEQUENCE_NUMBER = (
        45,
        False,
        "The producer sequence number is not the next one expected.",
    )
    DUPLICATE_SEQUENCE_NUMBER = 46, False, "The producer sequence number was seen already."
    INVALID_PRODUCER_EPOCH = 47, False, "The producer epoch is older than the current one."
    INVALID_TXN_STATE = 48, False, "The transaction is not in a state that allows this operation."
    INVALID_PRODUCER_ID_MAPPING = (
        49,
        False,
        "The producer id is not the one assigned to this transactional id.",
    )
    INVALID_TRANSACTION_TIMEOUT = (
        50,
        False,
        "The transaction timeout is above transaction.max.timeout.ms.",
    )
    CONCURRENT_TRANSACTIONS = 51, True, "Another operation on the same transaction is in progress."
    TRANSACTION_COORDINATOR_FENCED = (
        52,
        False,
        "The transaction coordinator that sent this marker has been replaced.",
    )
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53, False, "Not authorized to use the transactional id."
    SECURITY_DISABLED = 54, False, "Security features are not enabled on the broker."
    OPERATION_NOT_ATTEMPTED = (
        55,
        False,
        "The broker skipped this operation because another part of the request failed.",
    )
    KAFKA_STORAGE_ERROR = 56, True, "A disk error occurred while accessing the log."
    LOG_DIR_NOT_FOUND = 57, False, "The log directory is not one the broker is configured with."
    SASL_AUTHENTICATION_FAILED = 58, False, "SASL authentication failed."
    UNKNOWN_PRODUCER_ID = (
        59,
        False,
        "The broker has no state for this producer id (it may have expired).",
    )
    REASSIGNMENT_IN_PROGRESS = 60, False, "A partition reassignment is running."
    DELEGATION_TOKEN_AUTH_DISABLED = 61, False, "Delegation tokens are not enabled."
    DELEGATION_TOKEN_NOT_FOUND = 62, False, "The delegation token does not exist."
    DELEGATION_TOKEN_OWNER_MISMATCH = (
        63,
        False,
        "The principal is not the owner or a renewer of the token.",
    )
    DELEGATION_TOKEN_REQUEST_NOT_ALLOWED = (
        64,
        False,
        "Delegation token requests are not allowed on this kind of connection.",
    )
    DELEGATION_TOKEN_AUTHORIZATION_FAILED = (
        65,
        False,
        "Not authorized for this delegation token operation.",
    )
    DELEGATION_TOKEN_EXPIRED = 66, False, "The delegation token has expired."
    INVALID_PRINCIPAL_TYPE = 67, False, "The principal type is not supported."
    NON_EMPTY_GROUP = 68, False, "The group still has members."
    GROUP_ID_NOT_FOUND = 69, False, "No group with this id exists."
    FETCH_SESSION_ID_NOT_FOUND = 70, True, "The fetch session id is unknown to the broker."
    INVALID_FETCH_SESSION_EPOCH = 71, True, "The fetch session epoch is not the expected one."
    LISTENER_NOT_FOUND = (
        72,
        True,
        "The partition leader has no listener matching the one this request used.",
    )
    TOPIC_DELETION_DISABLED = 73, False, "Deleting topics is disabled on the broker."
    FENCED_LEADER_EPOCH = 74, True, "The leader epoch in the request is older than the broker's."
    UNKNOWN_LEADER_EPOCH = 75, True, "The leader epoch in the request is newer than the broker's."
    UNSUPPORTED_COMPRESSION_TYPE = (
        76,
        False,
        "The client cannot use the compression type of this partition.",
    )
    STALE_BROKER_EPOCH = 77, False, "The broker epoch has changed."
    OFFSET_NOT_AVAILABLE = (
        78,
        True,
        "The new leader's high watermark has not caught up yet; offsets are not final.",
    )
    MEMBER_ID_REQUIRED = 79, False, "The member must join again with the member id it was given."
    PREFERRED_LEADER_NOT_AVAILABLE = 80, True, "The preferred leader cannot take leadership now."
    GROUP_MAX_SIZE_REACHED = 81, False, "The group has as many members as it may have."
    FENCED_INSTANCE_ID = (
        82,
        False,
        "Another member with the same group.instance.id has replaced this one.",
    )
    ELIGIBLE_LEADERS_NOT_AVAILABLE = 83, True, "No eligible leader is available for the partition."
    ELECTION_NOT_NEEDED = (
        84,
        True,
        "The partition already has the leader the election would choose.",
    )
    NO_REASSIGNMENT_IN_PROGRESS = 85, False, "No partition reassignment is running."
    GROUP_SUBSCRIBED_TO_TOPIC = (
        86,
        False,
        "Offsets cannot be deleted for a topic the group is subscribed to.",
    )
    INVALID_RECORD = 87, False, "A record failed the broker's validation and the batch was refused."
    UNSTABLE_OFFSET_COMMIT = 88, True, "Pending transactional offsets must be resolved first."
    THROTTLING_QUOTA_EXCEEDED = 89, True, "The request exceeded the throttling quota."
    PRODUCER_FENCED = (
        90,
        False,
        "A newer producer with the same transactional id has fenced this one.",
    )
    RESOURCE_NOT_FOUND = 91, False, "The request names a resource that does not exist."
    DUPLICATE_RESOURCE = 92, False, "The request names the same resource more than once."
    UNACCEPTABLE_CREDENTIAL = 93, False, "The credential does not meet the acceptance criteria."
    INCONSISTENT_VOTER_SET = (
        94,
        False,
        "The sender or receiver is not one of the expected quorum voters.",
    )
    INVALID_UPDATE_VERSION = 95, False, "The update version is not valid."
    FEATURE_UPDATE_FAILED = 96, False, "The finalized features could not be updated."
    PRINCIPAL_DESERIALIZATION_FAILURE = (
        97,
        False,
        "A forwarded principal could not be deserialized.",
    )
    SNAPSHOT_NOT_FOUND = 98, False, "The requested snapshot does not exist."
    POSITION_OUT_OF_RANGE = 99, False, "The snapshot position is negative or past its end."
    UNKNOWN_TOPIC_ID = 100, True, "This broker does not host a topic with that id."
    DUPLICATE_BROKER_REGISTRATION = 101, False, "Another broker has registered with this id."
    BROKER_ID_NOT_REGISTERED = 102, False, "No broker with this id is registered."
    INCONSISTENT_TOPIC_ID = (
        103,
        True,
        "The topic id in the request differs from the one in the log.",
    )
    INCONSISTENT_CLUSTER_ID = (
        104,
        False,
        "The cluster id in the request differs from this cluster's.",
    )
    TRANSACTIONAL_ID_NOT_FOUND = 105, False, "No transaction with this transactional id exists."
    FETCH_SESSION_TOPIC_ID_ERROR = 106, True, "The fetch session used topic ids inconsistently."
    INELIGIBLE_REPLICA = 107, False, "The proposed ISR contains a replica that may not be in it."
    NEW_LEADER_ELECTED = (
        108,
        False,
        "The ISR update was applied, but the partition has a new leader.",
    )
    OFFSET_MOVED_TO_TIERED_STORAGE = 109, False, "The offset now lives in tiered storage."
    FENCED_MEMBER_EPOCH = (
        110,
        False,
        "The member epoch was fenced; the member must give up its partitions and rejoin.",
    )
    UNRELEASED_INSTANCE_ID = (
        111,
        False,
        "Another member still holds this instance id and must leave first.",
    )
    UNSUPPORTED_ASSIGNOR = (
        112,
        False,
        "The group does not support this assignor or its version range.",
    )
    STALE_MEMBER_EPOCH = (
        113,
        False,
        "The member epoch is out of date; retry with the epoch from the latest heartbeat.",
    )
    MISMATCHED_ENDPOINT_TYPE = 114, False, "The request reached an endpoint of the wrong type."
    UNSUPPORTED_ENDPOINT_TYPE = 115, False, "This endpoint type is not supported yet."
    UNKNOWN_CONTROLLER_ID = 116, False, "No controller with this id is known."
    UNKNOWN_SUBSCRIPTION_ID = 117, False, "The telemetry subscription id is unknown or out of date."
    TELEMETRY_TOO_LARGE = 118, False, "The telemetry payload is larger than the broker accepts."
    INVALID_REGISTRATION = (
        119,
        False,
        "The controller judged the broker registration to be invalid.",
    )
    TRANSACTION_ABORTABLE = (
        120,
        False,
        "The transaction hit an error; abort it to keep using the transactional id.",
    )
    INVALID_RECORD_STATE = (
        121,
        False,
        "The record's delivery state does not allow this acknowledgement.",
    )
    SHARE_SESSION_NOT_FOUND = 122, True, "The share session does not exist."
    INVALID_SHARE_SESSION_EPOCH = 123, True, "The share session epoch is not the expected one."
    FENCED_STATE_EPOCH = (
        124,
        False,
        "The share group state epoch does not match; the request was refused.",
    )
    INVALID_VOTER_KEY = 125, False, "The voter key differs from the receiving replica's."
    DUPLICATE_VOTER = 126, False, "The voter is already in the voter set."
    VOTER_NOT_FOUND = 127, False, "The voter is not in the voter set."
    INVALID_REGULAR_EXPRESSION = 128, False, "The regular expression is not valid."
    REBOOTSTRAP_REQUIRED = 129, False, "The client's metadata is stale; it must bootstrap again."
    STREAMS_INVALID_TOPOLOGY = 130, False, "The streams topology is not valid."
    STREAMS_INVALID_TOPOLOGY_EPOCH = 131, False, "The streams topology epoch is not valid."
    STREAMS_TOPOLOGY_FENCED = 132, False, "The streams topology epoch is out of date."
    SHARE_SESSION_LIMIT_REACHED = 133, True, "The broker holds as many share sessions as it may."

    def to_kio(self) -> KioErrorCode:
        """The same code as kio's enum, for the ``error_code`` fields of kio message classes."""
        return KioErrorCode(self.value)

    @classmethod
    def from_wire(cls, value: int) -> ErrorCode:
        """The member for ``value``; a code this table does not know reads as UNKNOWN_SERVER_ERROR.

        That is what Kafka's clients do with a code from a newer broker.
        """
        return _BY_VALUE.get(value, cls.UNKNOWN_SERVER_ERROR)


_BY_VALUE: dict[int, ErrorCode] = {int(code): code for code in ErrorCode}


def error_name(code: int) -> str:
    """Kafka's name of a wire error code (``NOT_LEADER_OR_FOLLOWER``); the number as text for
    a code this table does not know, so that logs and metrics never name it wrongly."""
    member = _BY_VALUE.get(code)
    return str(code) if member is None else member.name
