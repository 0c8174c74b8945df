"""Cluster membership: brokers register with their listeners.

A RegisterBroker record carries a new incarnation id (drawn from the injected random
source) every time the broker starts; the broker's epoch is the offset that record gets
in the metadata log, so it is known only once the record is committed.
"""

from __future__ import annotations

from collections.abc import Sequence

from tidelog.metadata.configs import Endpoint
from tidelog.metadata.controller.base import ControllerResult, ControllerView
from tidelog.metadata.errors import OK, ApiError
from tidelog.metadata.records import BrokerEndpoint, RegisterBrokerRecord
from tidelog.runtime.system import random_uuid

__all__ = ["register_broker"]


def register_broker(
    view: ControllerView, broker_id: int, listeners: Sequence[Endpoint]
) -> ControllerResult[ApiError]:
    """Register ``broker_id`` with its advertised ``listeners``; the reply is the error
    (OK once committed; the epoch is then in the image's registration)."""
    endpoints = tuple(
        BrokerEndpoint(e.name, e.host, e.port, e.security_protocol) for e in listeners
    )
    record = RegisterBrokerRecord(broker_id, random_uuid(view.random), endpoints)
    return ControllerResult(OK, ((0, (record,)),), lambda errors: errors[0])
