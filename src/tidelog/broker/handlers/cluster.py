"""BrokerRegistration, BrokerHeartbeat, UnregisterBroker and AllocateProducerIds: what
brokers send the controller (Kafka's ``ControllerApis``).

Served on controller listeners only (``controller.listener.names``), where ApiVersions
lists them; a broker listener neither serves nor advertises them, as in Kafka, so what
clients see does not change. Each request becomes one operation of the controller
(:mod:`tidelog.metadata.controller.cluster`), answered once its records are committed.

A listener's security protocol travels as Kafka's id (0 PLAINTEXT, 1 SSL, 2 SASL_PLAINTEXT,
3 SASL_SSL); a registration with another id, or without an incarnation id, gets
INVALID_REQUEST and writes nothing.
"""

from __future__ import annotations

from typing import Any

from tidelog.broker.authorization import access
from tidelog.broker.connection import RequestContext
from tidelog.broker.handlers.registry import handles
from tidelog.broker.handlers.schema import ZERO_THROTTLE, controller, make, response_module
from tidelog.metadata.acls import AclOperation
from tidelog.metadata.controller.cluster import HeartbeatRequest, RegistrationRequest
from tidelog.metadata.records import BrokerEndpoint
from tidelog.protocol import ApiKey, ErrorCode

#: Kafka's security protocol ids (``SecurityProtocol.id``).
SECURITY_PROTOCOLS = {0: "PLAINTEXT", 1: "SSL", 2: "SASL_PLAINTEXT", 3: "SASL_SSL"}


def _registration_request(request: Any) -> RegistrationRequest | str:
    """The controller's request, or why the wire request is invalid."""
    if request.incarnation_id is None:
        return "a registration needs an incarnation id"
    listeners = []
    for listener in request.listeners:
        protocol = SECURITY_PROTOCOLS.get(int(listener.security_protocol))
        if protocol is None:
            return f"listener {listener.name} has unknown security protocol id " + str(
                int(listener.security_protocol)
            )
        listeners.append(BrokerEndpoint(listener.name, listener.host, int(listener.port), protocol))
    return RegistrationRequest(
        broker_id=int(request.broker_id),
        cluster_id=request.cluster_id,
        incarnation_id=request.incarnation_id,
        listeners=tuple(listeners),
        rack=request.rack,
        log_dirs=tuple(d for d in getattr(request, "log_dirs", ()) if d is not None),
    )


def _not_a_node(ctx: RequestContext) -> ErrorCode | None:
    """What nodes send their controller needs ClusterAction on the cluster (Kafka's rule:
    the nodes' own principal belongs in ``super.users`` or gets that ACL)."""
    return access(ctx).cluster_error(AclOperation.CLUSTER_ACTION)


@handles(ApiKey.BROKER_REGISTRATION, controller_only=True)
async def handle_broker_registration(ctx: RequestContext, request: Any) -> object:
    module = response_module("broker_registration", ctx.api_version)
    wanted = _registration_request(request)
    refused = _not_a_node(ctx)
    if refused is not None or isinstance(wanted, str):
        return make(
            module.BrokerRegistrationResponse,
            throttle_time=ZERO_THROTTLE,
            error_code=(refused or ErrorCode.INVALID_REQUEST).to_kio(),
            broker_epoch=-1,
        )
    reply = await ctx.broker.run_blocking(controller(ctx).register_broker, wanted)
    return make(
        module.BrokerRegistrationResponse,
        throttle_time=ZERO_THROTTLE,
        error_code=reply.error.code.to_kio(),
        broker_epoch=reply.broker_epoch,
    )


@handles(ApiKey.BROKER_HEARTBEAT, controller_only=True)
async def handle_broker_heartbeat(ctx: RequestContext, request: Any) -> object:
    module = response_module("broker_heartbeat", ctx.api_version)
    if (refused := _not_a_node(ctx)) is not None:
        return make(
            module.BrokerHeartbeatResponse,
            throttle_time=ZERO_THROTTLE,
            error_code=refused.to_kio(),
            is_caught_up=False,
            is_fenced=True,
            should_shut_down=False,
        )
    wanted = HeartbeatRequest(
        broker_id=int(request.broker_id),
        broker_epoch=int(request.broker_epoch),
        current_metadata_offset=int(request.current_metadata_offset),
        want_fence=bool(request.want_fence),
        want_shut_down=bool(request.want_shut_down),
        offline_log_dirs=tuple(
            d for d in getattr(request, "offline_log_dirs", ()) if d is not None
        ),
    )
    reply = await ctx.broker.run_blocking(controller(ctx).heartbeat, wanted)
    return make(
        module.BrokerHeartbeatResponse,
        throttle_time=ZERO_THROTTLE,
        error_code=reply.error.code.to_kio(),
        is_caught_up=reply.is_caught_up,
        is_fenced=reply.is_fenced,
        should_shut_down=reply.should_shut_down,
    )


@handles(ApiKey.ALLOCATE_PRODUCER_IDS, controller_only=True)
async def handle_allocate_producer_ids(ctx: RequestContext, request: Any) -> object:
    module = response_module("allocate_producer_ids", ctx.api_version)
    if (refused := _not_a_node(ctx)) is not None:
        return make(
            module.AllocateProducerIdsResponse,
            throttle_time=ZERO_THROTTLE,
            error_code=refused.to_kio(),
            producer_id_start=-1,
            producer_id_len=0,
        )
    block = await ctx.broker.run_blocking(
        controller(ctx).allocate_producer_ids, int(request.broker_id), int(request.broker_epoch)
    )
    return make(
        module.AllocateProducerIdsResponse,
        throttle_time=ZERO_THROTTLE,
        error_code=block.error.code.to_kio(),
        producer_id_start=block.first_producer_id,
        producer_id_len=block.length,
    )


@handles(ApiKey.UNREGISTER_BROKER, controller_only=True)
async def handle_unregister_broker(ctx: RequestContext, request: Any) -> object:
    module = response_module("unregister_broker", ctx.api_version)
    # An operator's request (kafka-cluster unregister): Alter on the cluster, as in Kafka.
    if (refused := access(ctx).cluster_error(AclOperation.ALTER)) is not None:
        return make(
            module.UnregisterBrokerResponse,
            throttle_time=ZERO_THROTTLE,
            error_code=refused.to_kio(),
            error_message=refused.message,
        )
    error = await ctx.broker.run_blocking(controller(ctx).unregister_broker, int(request.broker_id))
    return make(
        module.UnregisterBrokerResponse,
        throttle_time=ZERO_THROTTLE,
        error_code=error.code.to_kio(),
        error_message=error.message if not error.ok else None,
    )
