"""Per-API authorization: the checks Kafka's request handlers make, in one place.

Handlers ask :func:`access` for the request's :class:`Access` and call its checks; each
check is one call of the broker's :class:`~tidelog.security.authorizer.Authorizer` for the
request's principal and client host, or True when ``authorizer.class.name`` is empty
(``Broker.authorizer`` is None: everything is allowed, as in Kafka without an authorizer).
Which API checks which operation on which resource is the table of ``docs/security.md``.

A request a quorum node forwards to the active controller is authorized for the client
on that node (:func:`answer_forwarded`): the controller sees the node's principal.

Denials are logged on the ``tidelog.authorizer`` logger in the shape of Kafka's
``kafka.authorizer.logger`` (one line: principal, decision, operation, host, resource,
request), at INFO; allowed decisions at DEBUG. As in Kafka, the checks that only filter a
listing (Metadata for every topic, ListGroups, ListTransactions, an OffsetFetch of every
topic) and the authorized-operations bitfields are not logged when denied: nothing was
asked for that the principal could not have.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from tidelog.metadata.acls import CLUSTER_NAME, AclOperation, ResourceType
from tidelog.protocol import ApiKey, ErrorCode
from tidelog.security.principal import ANONYMOUS, KafkaPrincipal

if TYPE_CHECKING:
    from tidelog.broker.connection import RequestContext
    from tidelog.security.authorizer import Authorizer

_audit = logging.getLogger("tidelog.authorizer")

T = TypeVar("T")
R = TypeVar("R")

#: Kafka's value of an authorized-operations field that was not asked for.
AUTHORIZED_OPERATIONS_NOT_REQUESTED = -(2**31)

#: The operations each resource type supports, in Kafka's lists: the bits an
#: authorized-operations field may carry (all of them without an authorizer).
SUPPORTED_OPERATIONS: dict[ResourceType, tuple[AclOperation, ...]] = {
    ResourceType.TOPIC: (
        AclOperation.READ,
        AclOperation.WRITE,
        AclOperation.CREATE,
        AclOperation.DELETE,
        AclOperation.ALTER,
        AclOperation.DESCRIBE,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
    ),
    ResourceType.GROUP: (AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE),
    ResourceType.CLUSTER: (
        AclOperation.CREATE,
        AclOperation.CLUSTER_ACTION,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
        AclOperation.IDEMPOTENT_WRITE,
        AclOperation.ALTER,
        AclOperation.DESCRIBE,
    ),
    ResourceType.TRANSACTIONAL_ID: (AclOperation.DESCRIBE, AclOperation.WRITE),
}

#: The error a denied check answers, by the resource type checked.
DENIED_ERROR: dict[ResourceType, ErrorCode] = {
    ResourceType.TOPIC: ErrorCode.TOPIC_AUTHORIZATION_FAILED,
    ResourceType.GROUP: ErrorCode.GROUP_AUTHORIZATION_FAILED,
    ResourceType.CLUSTER: ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
    ResourceType.TRANSACTIONAL_ID: ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
}


def operation_bits(operations: Iterable[AclOperation]) -> int:
    return sum(1 << int(op) for op in set(operations))


def _camel(name: str) -> str:
    """``TRANSACTIONAL_ID`` -> ``TransactionalId``, as kafka-acls and Kafka's logs write it."""
    return "".join(part.capitalize() for part in name.split("_"))


def _api_name(api_key: int) -> str:
    try:
        return _camel(ApiKey(api_key).name)
    except ValueError:
        return str(api_key)


def client_host(peer: str) -> str:
    """The host part of a ``host:port`` peer address: what an ACL's host is matched with."""
    host, sep, _ = peer.rpartition(":")
    return host if sep else peer


class Access:
    """The authorization checks of one request."""

    __slots__ = ("_api_key", "_authorizer", "host", "principal")

    def __init__(
        self,
        authorizer: Authorizer | None,
        principal: KafkaPrincipal,
        host: str,
        api_key: int = -1,
    ) -> None:
        self._authorizer = authorizer
        self.principal = principal
        self.host = host
        self._api_key = api_key

    @property
    def enabled(self) -> bool:
        return self._authorizer is not None

    def allows(
        self,
        operation: AclOperation,
        resource_type: ResourceType,
        name: str,
        *,
        audit: bool = True,
    ) -> bool:
        """Whether the principal may do ``operation`` on the resource; a denial is logged
        unless ``audit`` is False (listings that only leave things out)."""
        authorizer = self._authorizer
        if authorizer is None:
            return True
        allowed = authorizer.authorize(self.principal, self.host, operation, resource_type, name)
        if not allowed and audit:
            _audit.info(self._audit_line("Denied", operation, resource_type, name))
        elif allowed and _audit.isEnabledFor(logging.DEBUG):
            _audit.debug(self._audit_line("Allowed", operation, resource_type, name))
        return allowed

    def _audit_line(
        self, decision: str, operation: AclOperation, resource_type: ResourceType, name: str
    ) -> str:
        return (
            f"Principal = {self.principal} is {decision} operation = {_camel(operation.name)} "
            f"from host = {self.host} on resource = {_camel(resource_type.name)}:LITERAL:{name} "
            f"for request = {_api_name(self._api_key)}"
        )

    # -- one resource type each -------------------------------------------------------

    def topic(self, operation: AclOperation, name: str, *, audit: bool = True) -> bool:
        return self.allows(operation, ResourceType.TOPIC, name, audit=audit)

    def group(self, operation: AclOperation, group_id: str, *, audit: bool = True) -> bool:
        return self.allows(operation, ResourceType.GROUP, group_id, audit=audit)

    def transactional_id(self, operation: AclOperation, transactional_id: str) -> bool:
        return self.allows(operation, ResourceType.TRANSACTIONAL_ID, transactional_id)

    def cluster(self, operation: AclOperation, *, audit: bool = True) -> bool:
        return self.allows(operation, ResourceType.CLUSTER, CLUSTER_NAME, audit=audit)

    # -- the errors handlers answer -------------------------------------------------------

    def topic_error(
        self, operation: AclOperation, name: str | None, *, audit: bool = True
    ) -> ErrorCode | None:
        """TOPIC_AUTHORIZATION_FAILED when ``name`` is denied, else None (also for a topic
        the request named by an id the broker does not know: that error is the handler's)."""
        if name is None or self.topic(operation, name, audit=audit):
            return None
        return ErrorCode.TOPIC_AUTHORIZATION_FAILED

    def group_error(self, operation: AclOperation, group_id: str) -> ErrorCode | None:
        return None if self.group(operation, group_id) else ErrorCode.GROUP_AUTHORIZATION_FAILED

    def transactional_id_error(
        self, operation: AclOperation, transactional_id: str
    ) -> ErrorCode | None:
        if self.transactional_id(operation, transactional_id):
            return None
        return ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED

    def cluster_error(self, operation: AclOperation, *, audit: bool = True) -> ErrorCode | None:
        if self.cluster(operation, audit=audit):
            return None
        return ErrorCode.CLUSTER_AUTHORIZATION_FAILED

    # -- Kafka's compound rules ---------------------------------------------------------

    def may_create_topic(self, name: str, *, audit: bool = True) -> bool:
        """CreateTopics and Metadata's auto-creation: Create on the cluster, or else on the
        topic (only the topic's denial is logged, as Kafka logs it)."""
        return self.cluster(AclOperation.CREATE, audit=False) or self.topic(
            AclOperation.CREATE, name, audit=audit
        )

    def may_write_idempotently(self) -> bool:
        """InitProducerId without a transactional id (KIP-679): IdempotentWrite on the
        cluster, or Write on any topic."""
        authorizer = self._authorizer
        if authorizer is None or self.cluster(AclOperation.IDEMPOTENT_WRITE, audit=False):
            return True
        if authorizer.authorize_any(
            self.principal, self.host, AclOperation.WRITE, ResourceType.TOPIC
        ):
            return True
        _audit.info(
            self._audit_line(
                "Denied", AclOperation.IDEMPOTENT_WRITE, ResourceType.CLUSTER, CLUSTER_NAME
            )
        )
        return False

    def config_resource_error(
        self, operation: AclOperation, resource_type: int, name: str, *, audit: bool = True
    ) -> ErrorCode | None:
        """DescribeConfigs / AlterConfigs / IncrementalAlterConfigs on one config resource
        (Kafka's ConfigResource types: 2 topic, 4 broker, 8 broker logger): the operation on
        the topic, or on the cluster for a broker or its loggers. Other types are left to
        the handler's own validation."""
        if resource_type == _CONFIG_RESOURCE_TOPIC:
            return self.topic_error(operation, name, audit=audit)
        if resource_type in (_CONFIG_RESOURCE_BROKER, _CONFIG_RESOURCE_BROKER_LOGGER):
            return self.cluster_error(operation, audit=audit)
        return None

    def topic_errors(self, operation: AclOperation) -> Callable[[str], ErrorCode | None]:
        """:meth:`topic_error` for ``operation``, decided once per topic: for a request
        whose answer is built more than once (a Fetch's long poll reads every round)."""
        if self._authorizer is None:
            return no_topic_error
        decided: dict[str, ErrorCode | None] = {}

        def error(name: str) -> ErrorCode | None:
            if name not in decided:
                decided[name] = self.topic_error(operation, name)
            return decided[name]

        return error

    def fetch_topic_errors(self, replica_id: int) -> Callable[[str], ErrorCode | None]:
        """Fetch's check per topic: Read on the topic for a consumer; for a follower
        (replica id >= 0) ClusterAction on the cluster, whose denial fails every topic
        with TOPIC_AUTHORIZATION_FAILED, as Kafka answers it."""
        if self._authorizer is None:
            return no_topic_error
        if replica_id < 0:
            return self.topic_errors(AclOperation.READ)
        if self.cluster(AclOperation.CLUSTER_ACTION):
            return no_topic_error
        return _topic_denied

    def offset_for_leader_epoch_errors(self) -> Callable[[str], ErrorCode | None]:
        """OffsetForLeaderEpoch's check per topic: ClusterAction on the cluster (followers;
        not logged when denied) or else Describe on the topic (consumers, KIP-320)."""
        if self._authorizer is None or self.cluster(AclOperation.CLUSTER_ACTION, audit=False):
            return no_topic_error
        return self.topic_errors(AclOperation.DESCRIBE)

    def operations(self, resource_type: ResourceType, name: str) -> int:
        """The authorized-operations bitfield of a resource: every supported operation the
        principal is allowed (all of them without an authorizer)."""
        supported = SUPPORTED_OPERATIONS[resource_type]
        return operation_bits(
            op for op in supported if self.allows(op, resource_type, name, audit=False)
        )

    def cluster_operations(self) -> int:
        """Metadata's and DescribeCluster's cluster bitfield: 0 unless the principal may
        describe the cluster, as in Kafka."""
        if not self.cluster(AclOperation.DESCRIBE, audit=False):
            return 0
        return self.operations(ResourceType.CLUSTER, CLUSTER_NAME)


def no_topic_error(name: str) -> ErrorCode | None:
    return None


def _topic_denied(name: str) -> ErrorCode | None:
    return ErrorCode.TOPIC_AUTHORIZATION_FAILED


_CONFIG_RESOURCE_TOPIC = 2
_CONFIG_RESOURCE_BROKER = 4
_CONFIG_RESOURCE_BROKER_LOGGER = 8


def access(ctx: RequestContext) -> Access:
    """The checks for the request of ``ctx``."""
    authorizer = ctx.broker.authorizer
    if authorizer is None:
        return _OPEN
    return Access(authorizer, ctx.principal, client_host(ctx.peer), ctx.header.api_key)


def in_request_order(
    items: Sequence[T],
    allowed: Sequence[bool],
    answered: Iterable[R],
    denied: Callable[[T], R],
) -> list[R]:
    """The answers of ``items`` in their order: for an allowed item the next of
    ``answered`` (the answers of the allowed items only, in order), for a denied one
    ``denied(item)``. For handlers that hand only the allowed part of a request on."""
    answers = iter(answered)
    return [next(answers) if ok else denied(item) for item, ok in zip(items, allowed, strict=True)]


#: The checks when no authorizer is configured: every one passes.
_OPEN = Access(None, ANONYMOUS, "")


# -- requests forwarded to the active controller -------------------------------------------

Handler = Callable[[Any, Any], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class _Items:
    """Where a forwarded API keeps its items: the request's list field (by version) and the
    response's list of one result per item, in request order."""

    request_field: Callable[[int], str]
    response_field: str
    #: the authorization error of one item (None: allowed), not logged: the local handler
    #: that answers the denied items logs them
    error: Callable[[Access, Any, Any], ErrorCode | None]


def _create_topic_error(checks: Access, ctx: Any, entry: Any) -> ErrorCode | None:
    if checks.may_create_topic(entry.name, audit=False):
        return None
    return ErrorCode.TOPIC_AUTHORIZATION_FAILED


def _delete_topic_error(checks: Access, ctx: Any, entry: Any) -> ErrorCode | None:
    if isinstance(entry, str):
        name: str | None = entry
    elif entry.name is not None:
        name = entry.name
    else:
        name = ctx.broker.topic_name_of(entry.topic_id) if entry.topic_id is not None else None
    return checks.topic_error(AclOperation.DELETE, name, audit=False)


def _topic_alter_error(checks: Access, ctx: Any, entry: Any) -> ErrorCode | None:
    return checks.topic_error(AclOperation.ALTER, entry.name, audit=False)


def _alter_configs_error(checks: Access, ctx: Any, resource: Any) -> ErrorCode | None:
    return checks.config_resource_error(
        AclOperation.ALTER_CONFIGS, int(resource.resource_type), resource.resource_name, audit=False
    )


_FORWARDED_ITEMS: dict[int, _Items] = {
    ApiKey.CREATE_TOPICS: _Items(lambda _: "topics", "topics", _create_topic_error),
    ApiKey.DELETE_TOPICS: _Items(
        lambda version: "topics" if version >= 6 else "topic_names",
        "responses",
        _delete_topic_error,
    ),
    ApiKey.CREATE_PARTITIONS: _Items(lambda _: "topics", "results", _topic_alter_error),
    ApiKey.ALTER_CONFIGS: _Items(lambda _: "resources", "responses", _alter_configs_error),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: _Items(
        lambda _: "resources", "responses", _alter_configs_error
    ),
}
#: Forwarded APIs that need one cluster operation for the whole request.
_FORWARDED_CLUSTER_OPERATION: dict[int, AclOperation] = {
    ApiKey.ELECT_LEADERS: AclOperation.ALTER,
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: AclOperation.ALTER,
    ApiKey.LIST_PARTITION_REASSIGNMENTS: AclOperation.DESCRIBE,
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: AclOperation.ALTER,
    ApiKey.ALTER_CLIENT_QUOTAS: AclOperation.ALTER_CONFIGS,
    ApiKey.CREATE_ACLS: AclOperation.ALTER,
    ApiKey.DELETE_ACLS: AclOperation.ALTER,
}


async def answer_forwarded(
    ctx: RequestContext, api_key: int, request: Any, local: Handler, forward: Handler
) -> Any:
    """A metadata-changing request a node forwards to the active controller, authorized for
    the client here, because the controller sees the node's principal (Kafka carries the
    client's in an Envelope, KIP-590, which is not served). The denied items are answered
    by ``local``, this node's own handler, which refuses them without asking the controller;
    only the allowed rest goes to ``forward``, and the two answers are merged in request
    order. A request with nothing denied goes to ``forward`` whole."""
    checks = access(ctx)
    if not checks.enabled:
        return await forward(ctx, request)
    operation = _FORWARDED_CLUSTER_OPERATION.get(api_key)
    if operation is not None:
        if checks.cluster(operation, audit=False):
            return await forward(ctx, request)
        return await local(ctx, request)
    items = _FORWARDED_ITEMS.get(api_key)
    if items is None:
        return await forward(ctx, request)
    field = items.request_field(ctx.api_version)
    entries = list(getattr(request, field))
    allowed = [items.error(checks, ctx, entry) is None for entry in entries]
    if all(allowed):
        return await forward(ctx, request)
    denied_part = dataclasses.replace(
        request, **{field: tuple(e for e, ok in zip(entries, allowed, strict=True) if not ok)}
    )
    refused = await local(ctx, denied_part)
    if not any(allowed):
        return refused
    allowed_part = dataclasses.replace(
        request, **{field: tuple(e for e, ok in zip(entries, allowed, strict=True) if ok)}
    )
    answered = await forward(ctx, allowed_part)
    denied_results = iter(getattr(refused, items.response_field))
    merged = in_request_order(
        entries,
        allowed,
        getattr(answered, items.response_field),
        lambda _: next(denied_results),
    )
    return dataclasses.replace(answered, **{items.response_field: tuple(merged)})
