"""FindCoordinator and the classic group APIs: JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
ListGroups, DescribeGroups, DeleteGroups.

Each handler turns the version's request into the coordinator's request value, runs it
through the group driver (:mod:`tidelog.broker.groups`) and builds the response class of
the request's version with the fields that version has. The rules themselves (states,
generations, errors) are the coordinator's, see ``docs/groups.md``.

* FindCoordinator v0-v3 name one key, v4+ a batch (``coordinator_keys``), each answered
  on its own. Key type 0 (group): this broker, once the group's ``__consumer_offsets``
  partition is loaded; before that (the topic is being created, which the first request
  starts, or loaded) COORDINATOR_NOT_AVAILABLE, and the client asks again. Key type 1
  (transaction): the same with the transactional id's ``__transaction_state``
  partition. Any other type: INVALID_REQUEST. An error answer names node -1, host "", port -1.
* JoinGroup, SyncGroup (a follower waits for the leader's assignment), LeaveGroup and
  DeleteGroups may wait: they answer with a Deferred when the coordinator completes them
  later. Heartbeat, ListGroups and DescribeGroups answer at once.
* LeaveGroup v0-v2 name one member and get one error (the member's when the request as a
  whole succeeded); v3+ a batch with an error per member.
* DeleteGroups answers each distinct group once, in request order.
* Before JoinGroup v7 the protocol name is not nullable: "" stands for none, as in Kafka.
* The client host of a member is the peer address as Kafka prints it ("/127.0.0.1").
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from tidelog.broker.authorization import (
    AUTHORIZED_OPERATIONS_NOT_REQUESTED,
    SUPPORTED_OPERATIONS,
    access,
    in_request_order,
    operation_bits,
)
from tidelog.broker.connection import RequestContext
from tidelog.broker.groups import GroupDriver
from tidelog.broker.handlers.metadata import listed_brokers
from tidelog.broker.handlers.registry import handles
from tidelog.broker.handlers.schema import ZERO_THROTTLE, make, response_module
from tidelog.coordinator import (
    DeleteGroupsResult,
    DescribedGroup,
    HeartbeatRequest,
    JoinGroupRequest,
    JoinGroupResult,
    LeaveGroupRequest,
    LeaveGroupResult,
    MemberIdentity,
    SyncGroupRequest,
    SyncGroupResult,
)
from tidelog.coordinator.api import DeleteGroupResult
from tidelog.metadata.acls import AclOperation, ResourceType
from tidelog.protocol import ApiKey, ErrorCode

#: Every operation a group supports (READ 3, DELETE 6, DESCRIBE 8), which Kafka reports
#: when no authorizer is configured.
GROUP_OPERATIONS = operation_bits(SUPPORTED_OPERATIONS[ResourceType.GROUP])

KEY_TYPE_GROUP = 0
KEY_TYPE_TRANSACTION = 1

_UNAVAILABLE = ErrorCode.COORDINATOR_NOT_AVAILABLE

if TYPE_CHECKING:
    # For annotations only: broker.transactions imports the handlers package (its marker
    # writes), so importing it here would be circular.
    from tidelog.broker.transactions import TransactionDriver


def ms(value: datetime.timedelta) -> int:
    return round(value.total_seconds() * 1000)


def driver_of(ctx: RequestContext) -> GroupDriver | None:
    return ctx.broker.groups


def client_host(ctx: RequestContext) -> str:
    """The peer's address as Kafka shows a member's host ("/127.0.0.1")."""
    host = ctx.peer.rsplit(":", 1)[0] if ":" in ctx.peer else ctx.peer
    return f"/{host}"


# -- FindCoordinator -----------------------------------------------------------------------


def _address(ctx: RequestContext, node: int) -> tuple[str, int] | None:
    """Where a client that came in on this listener reaches broker ``node`` (None: it is
    not listed there)."""
    if node == ctx.broker.node_id:
        return ctx.broker.endpoint(ctx.listener)
    for node_id, host, port, _, _ in listed_brokers(ctx):
        if node_id == node:
            return host, port
    return None


async def _find(ctx: RequestContext, key_type: int, key: str) -> tuple[ErrorCode, int]:
    """The error, and the node that coordinates ``key``: the leader of its partition of
    the internal topic (this node on a single node)."""
    driver: GroupDriver | TransactionDriver | None
    checks = access(ctx)
    if key_type == KEY_TYPE_GROUP:
        driver = driver_of(ctx)
        denied = checks.group_error(AclOperation.DESCRIBE, key)
    elif key_type == KEY_TYPE_TRANSACTION:
        driver = ctx.broker.transactions
        denied = checks.transactional_id_error(AclOperation.DESCRIBE, key)
    else:
        return ErrorCode.INVALID_REQUEST, -1
    if denied is not None:
        return denied, -1
    if driver is None:
        return _UNAVAILABLE, -1
    error = await driver.coordinator_error(key)
    leader = driver.leader_of(key)
    if leader is not None and leader != ctx.broker.node_id:
        # Another node's broker leads that partition and so coordinates the key.
        return ErrorCode.NONE, leader
    return error, ctx.broker.node_id


@handles(ApiKey.FIND_COORDINATOR)
async def handle_find_coordinator(ctx: RequestContext, request: Any) -> object:
    version = ctx.api_version
    module = response_module("find_coordinator", version)

    def where(found: tuple[ErrorCode, int]) -> dict[str, Any]:
        error, node = found
        address = _address(ctx, node)
        if address is None and error is ErrorCode.NONE:
            # Not listed (fenced, or without this listener): the client asks again.
            error = _UNAVAILABLE
        ok = error is ErrorCode.NONE
        host, port = address if address is not None and ok else ("", -1)
        return {
            "error_code": error.to_kio(),
            "error_message": None if ok else error.message,
            "node_id": node if ok else -1,
            "host": host,
            "port": port,
        }

    key_type = int(getattr(request, "key_type", KEY_TYPE_GROUP))
    if version >= 4:
        coordinators = []
        for key in request.coordinator_keys:
            error = await _find(ctx, key_type, key)
            coordinators.append(make(module.Coordinator, key=key, **where(error)))
        return make(
            module.FindCoordinatorResponse,
            throttle_time=ZERO_THROTTLE,
            coordinators=tuple(coordinators),
        )
    error = await _find(ctx, key_type, request.key)
    return make(module.FindCoordinatorResponse, throttle_time=ZERO_THROTTLE, **where(error))


# -- JoinGroup -----------------------------------------------------------------------------


@handles(ApiKey.JOIN_GROUP)
async def handle_join_group(ctx: RequestContext, request: Any) -> object:
    version = ctx.api_version
    module = response_module("join_group", version)

    def build(result: JoinGroupResult) -> object:
        protocol_name = result.protocol_name
        if protocol_name is None and version < 7:
            protocol_name = ""
        members = tuple(
            make(
                module.JoinGroupResponseMember,
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                metadata=m.metadata,
            )
            for m in result.members
        )
        return make(
            module.JoinGroupResponse,
            throttle_time=ZERO_THROTTLE,
            error_code=result.error.to_kio(),
            generation_id=result.generation_id,
            protocol_type=result.protocol_type,
            protocol_name=protocol_name,
            leader=result.leader,
            skip_assignment=result.skip_assignment,
            member_id=result.member_id,
            members=members,
        )

    denied = access(ctx).group_error(AclOperation.READ, request.group_id)
    if denied is not None:
        return build(JoinGroupResult(denied, member_id=request.member_id))
    fallback = JoinGroupResult(_UNAVAILABLE, member_id=request.member_id)
    driver = driver_of(ctx)
    if driver is None:
        return build(fallback)
    rebalance_timeout = getattr(request, "rebalance_timeout", None)
    join = JoinGroupRequest(
        group_id=request.group_id,
        member_id=request.member_id,
        protocol_type=request.protocol_type,
        protocols=tuple((p.name, bytes(p.metadata)) for p in request.protocols),
        session_timeout_ms=ms(request.session_timeout),
        rebalance_timeout_ms=-1 if rebalance_timeout is None else ms(rebalance_timeout),
        group_instance_id=getattr(request, "group_instance_id", None),
        client_id=ctx.client_id,
        client_host=client_host(ctx),
        reason=getattr(request, "reason", None),
        api_version=version,
    )
    coordinator = driver.coordinator
    return driver.respond(
        lambda token, now: coordinator.join_group(token, now, join), fallback, build
    )


# -- SyncGroup -----------------------------------------------------------------------------


@handles(ApiKey.SYNC_GROUP)
async def handle_sync_group(ctx: RequestContext, request: Any) -> object:
    version = ctx.api_version
    module = response_module("sync_group", version)

    def build(result: SyncGroupResult) -> object:
        return make(
            module.SyncGroupResponse,
            throttle_time=ZERO_THROTTLE,
            error_code=result.error.to_kio(),
            protocol_type=result.protocol_type,
            protocol_name=result.protocol_name,
            assignment=result.assignment,
        )

    denied = access(ctx).group_error(AclOperation.READ, request.group_id)
    if denied is not None:
        return build(SyncGroupResult(denied))
    fallback = SyncGroupResult(_UNAVAILABLE)
    driver = driver_of(ctx)
    if driver is None:
        return build(fallback)
    sync = SyncGroupRequest(
        group_id=request.group_id,
        generation_id=int(request.generation_id),
        member_id=request.member_id,
        group_instance_id=getattr(request, "group_instance_id", None),
        protocol_type=getattr(request, "protocol_type", None),
        protocol_name=getattr(request, "protocol_name", None),
        assignments=tuple((a.member_id, bytes(a.assignment)) for a in request.assignments),
    )
    coordinator = driver.coordinator
    return driver.respond(
        lambda token, now: coordinator.sync_group(token, now, sync), fallback, build
    )


# -- Heartbeat -----------------------------------------------------------------------------


@handles(ApiKey.HEARTBEAT)
async def handle_heartbeat(ctx: RequestContext, request: Any) -> object:
    module = response_module("heartbeat", ctx.api_version)
    driver = driver_of(ctx)
    denied = access(ctx).group_error(AclOperation.READ, request.group_id)
    if denied is not None:
        error = denied
    elif driver is None:
        error = _UNAVAILABLE
    else:
        error = driver.coordinator.heartbeat(
            driver.now(),
            HeartbeatRequest(
                group_id=request.group_id,
                generation_id=int(request.generation_id),
                member_id=request.member_id,
                group_instance_id=getattr(request, "group_instance_id", None),
            ),
        )
    return make(module.HeartbeatResponse, throttle_time=ZERO_THROTTLE, error_code=error.to_kio())


# -- LeaveGroup ----------------------------------------------------------------------------


@handles(ApiKey.LEAVE_GROUP)
async def handle_leave_group(ctx: RequestContext, request: Any) -> object:
    version = ctx.api_version
    module = response_module("leave_group", version)

    def build(result: LeaveGroupResult) -> object:
        if version < 3:
            return make(
                module.LeaveGroupResponse,
                throttle_time=ZERO_THROTTLE,
                error_code=result.legacy_error.to_kio(),
            )
        return make(
            module.LeaveGroupResponse,
            throttle_time=ZERO_THROTTLE,
            error_code=result.error.to_kio(),
            members=tuple(
                module.MemberResponse(
                    member_id=m.member_id,
                    group_instance_id=m.group_instance_id,
                    error_code=m.error.to_kio(),
                )
                for m in result.members
            ),
        )

    denied = access(ctx).group_error(AclOperation.READ, request.group_id)
    if denied is not None:
        return build(LeaveGroupResult(denied))
    fallback = LeaveGroupResult(_UNAVAILABLE)
    driver = driver_of(ctx)
    if driver is None:
        return build(fallback)
    if version < 3:
        members: tuple[MemberIdentity, ...] = (MemberIdentity(request.member_id),)
    else:
        members = tuple(
            MemberIdentity(m.member_id, m.group_instance_id, getattr(m, "reason", None))
            for m in request.members
        )
    leave = LeaveGroupRequest(request.group_id, members)
    coordinator = driver.coordinator
    return driver.respond(
        lambda token, now: coordinator.leave_group(token, now, leave), fallback, build
    )


# -- ListGroups ----------------------------------------------------------------------------


@handles(ApiKey.LIST_GROUPS)
async def handle_list_groups(ctx: RequestContext, request: Any) -> object:
    module = response_module("list_groups", ctx.api_version)
    driver = driver_of(ctx)
    if driver is None:
        return make(
            module.ListGroupsResponse,
            throttle_time=ZERO_THROTTLE,
            error_code=_UNAVAILABLE.to_kio(),
            groups=(),
        )
    result = driver.coordinator.list_groups(
        tuple(getattr(request, "states_filter", ())), tuple(getattr(request, "types_filter", ()))
    )
    # Describe on the cluster lists every group; else those the principal may describe.
    checks = access(ctx)
    every_group = checks.cluster(AclOperation.DESCRIBE, audit=False)
    groups = tuple(
        make(
            module.ListedGroup,
            group_id=g.group_id,
            protocol_type=g.protocol_type,
            group_state=g.state,
            group_type=g.group_type,
        )
        for g in result.groups
        if every_group or checks.group(AclOperation.DESCRIBE, g.group_id, audit=False)
    )
    return make(
        module.ListGroupsResponse,
        throttle_time=ZERO_THROTTLE,
        error_code=result.error.to_kio(),
        groups=groups,
    )


# -- DescribeGroups ------------------------------------------------------------------------


@handles(ApiKey.DESCRIBE_GROUPS)
async def handle_describe_groups(ctx: RequestContext, request: Any) -> object:
    version = ctx.api_version
    module = response_module("describe_groups", version)
    driver = driver_of(ctx)
    checks = access(ctx)
    operations_asked = bool(getattr(request, "include_authorized_operations", False))
    described = []
    for group_id in request.groups:
        operations = (
            checks.operations(ResourceType.GROUP, group_id)
            if operations_asked
            else AUTHORIZED_OPERATIONS_NOT_REQUESTED
        )
        denied = checks.group_error(AclOperation.DESCRIBE, group_id)
        if denied is not None:
            group = DescribedGroup(group_id, denied, "")
        elif driver is None:
            group = DescribedGroup(group_id, _UNAVAILABLE, "")
        else:
            group = driver.coordinator.describe_group(group_id, api_version=version)
        members = tuple(
            make(
                module.DescribedGroupMember,
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                member_metadata=m.metadata,
                member_assignment=m.assignment,
            )
            for m in group.members
        )
        described.append(
            make(
                module.DescribedGroup,
                error_code=group.error.to_kio(),
                error_message=None,
                group_id=group.group_id,
                group_state=group.state,
                protocol_type=group.protocol_type,
                protocol_data=group.protocol_data,
                members=members,
                authorized_operations=operations,
            )
        )
    return make(module.DescribeGroupsResponse, throttle_time=ZERO_THROTTLE, groups=tuple(described))


# -- DeleteGroups --------------------------------------------------------------------------


@handles(ApiKey.DELETE_GROUPS)
async def handle_delete_groups(ctx: RequestContext, request: Any) -> object:
    module = response_module("delete_groups", ctx.api_version)
    group_ids = list(dict.fromkeys(request.groups_names))

    def build(result: DeleteGroupsResult) -> object:
        return make(
            module.DeleteGroupsResponse,
            throttle_time=ZERO_THROTTLE,
            results=tuple(
                module.DeletableGroupResult(group_id=g.group_id, error_code=g.error.to_kio())
                for g in result.groups
            ),
        )

    checks = access(ctx)
    allowed = [checks.group(AclOperation.DELETE, g) for g in group_ids]
    permitted = [g for g, ok in zip(group_ids, allowed, strict=True) if ok]

    def answer(result: DeleteGroupsResult) -> object:
        # The denied groups in their request places, the coordinator's answers around them.
        return build(
            DeleteGroupsResult(
                tuple(
                    in_request_order(
                        group_ids,
                        allowed,
                        result.groups,
                        lambda g: DeleteGroupResult(g, ErrorCode.GROUP_AUTHORIZATION_FAILED),
                    )
                )
            )
        )

    fallback = DeleteGroupsResult(tuple(DeleteGroupResult(g, _UNAVAILABLE) for g in permitted))
    driver = driver_of(ctx)
    if driver is None or not permitted:
        return answer(fallback)
    coordinator = driver.coordinator
    return driver.respond(
        lambda token, now: coordinator.delete_groups(token, now, permitted), fallback, answer
    )
