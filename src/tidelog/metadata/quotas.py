"""Client quotas (KIP-13, KIP-124, KIP-546): the entities they are set on, the keys they
set, and which quota applies to a client.

A quota entity is a set of (entity type, name) pairs, a name of None being the default
of that type: ``{user: alice}``, ``{user: alice, client-id: None}`` (alice's default for
any client id), ``{client-id: None}``, ``{ip: 10.0.0.1}``. :data:`QuotaEntity` keeps the
pairs sorted by type so that one entity has one spelling.

:func:`resolve_quota` is the lookup Kafka's default quota callback does for a connection's
(user, client id): the first of eight entities, most specific first, that sets the key.
:func:`resolve_ip_quota` is the same for ``connection_creation_rate`` of an address.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Final

__all__ = [
    "CLIENT_ID",
    "ENTITY_TYPES",
    "IP",
    "IP_QUOTA_KEYS",
    "USER",
    "USER_CLIENT_QUOTA_KEYS",
    "QuotaEntity",
    "describe_entity",
    "entity_error",
    "quota_entity",
    "resolve_ip_quota",
    "resolve_quota",
    "value_error",
]

USER: Final = "user"
CLIENT_ID: Final = "client-id"
IP: Final = "ip"
ENTITY_TYPES: Final = (USER, CLIENT_ID, IP)

#: Quota keys of user and client-id entities, with whether the value must be whole (Kafka
#: declares the byte rates LONG and the others DOUBLE).
USER_CLIENT_QUOTA_KEYS: Final[Mapping[str, bool]] = {
    "producer_byte_rate": True,
    "consumer_byte_rate": True,
    "request_percentage": False,
    "controller_mutation_rate": False,
}
#: Quota keys of ip entities (Kafka declares connection_creation_rate INT).
IP_QUOTA_KEYS: Final[Mapping[str, bool]] = {"connection_creation_rate": True}
_INTEGRAL_LIMIT = {"connection_creation_rate": 2**31 - 1}
_LONG_LIMIT = 2**63 - 1

#: (entity type, name or None for the type's default), sorted by type.
QuotaEntity = tuple[tuple[str, str | None], ...]


def quota_entity(pairs: Mapping[str, str | None]) -> QuotaEntity:
    return tuple(sorted(pairs.items()))


def describe_entity(entity: QuotaEntity) -> str:
    """Kafka's way of naming an entity in messages: ``user=alice, client-id=<default>``."""
    return ", ".join(f"{kind}={'<default>' if name is None else name}" for kind, name in entity)


def entity_error(pairs: list[tuple[str, str | None]]) -> str | None:
    """Why an entity as a request gives it is not one a quota may be set on, or None.

    Kafka allows user, client-id, user with client-id, and ip alone; an ip name must be
    an address (no name lookup is done: the controller's answer must not depend on DNS).
    """
    if not pairs:
        return "Invalid empty client quota entity"
    seen: set[str] = set()
    for kind, name in pairs:
        if kind not in ENTITY_TYPES:
            return f"Unhandled client quota entity type: {kind}"
        if kind in seen:
            return f"Entity type {kind} appears more than once in the client quota entity"
        seen.add(kind)
        if kind == IP and name is not None and not _is_address(name):
            return f"{name} is not a valid IP address"
    if IP in seen and len(seen) > 1:
        return "Invalid quota entity combination, IP tag with USER or CLIENT_ID is not allowed"
    return None


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def value_error(entity: QuotaEntity, key: str, value: float | None) -> str | None:
    """Why ``key`` (set to ``value``, or removed when None) is refused on ``entity``, or
    None: the key must be one of the entity's kind and the value positive, and whole
    where Kafka's config type is integral."""
    keys = IP_QUOTA_KEYS if entity[0][0] == IP else USER_CLIENT_QUOTA_KEYS
    if key not in keys:
        return f"Invalid configuration key {key} for {describe_entity(entity)}"
    if value is None:
        return None
    if not value > 0.0:  # also refuses NaN
        return f"Quota {key} must be greater than 0"
    if keys[key]:
        if value > _INTEGRAL_LIMIT.get(key, _LONG_LIMIT):
            return f"Proposed value for {key} is too large"
        if value != int(value):
            return f"Quota {key} must be a whole number, not {value}"
    elif value == float("inf"):
        return f"Quota {key} must be finite"
    return None


def resolve_quota(
    quotas: Mapping[QuotaEntity, Mapping[str, float]],
    user: str,
    client_id: str,
    key: str,
) -> tuple[QuotaEntity, float] | None:
    """The quota ``key`` that applies to a connection of ``user`` with ``client_id``: the
    entity it comes from and its value, or None when no entity sets it (no quota).

    Kafka's precedence, most specific first::

        /users/<user>/clients/<client-id>
        /users/<user>/clients/<default>
        /users/<user>
        /users/<default>/clients/<client-id>
        /users/<default>/clients/<default>
        /users/<default>
        /clients/<client-id>
        /clients/<default>
    """
    for entity in _precedence(user, client_id):
        values = quotas.get(entity)
        if values is not None and key in values:
            return entity, values[key]
    return None


def _precedence(user: str, client_id: str) -> tuple[QuotaEntity, ...]:
    return (
        ((CLIENT_ID, client_id), (USER, user)),
        ((CLIENT_ID, None), (USER, user)),
        ((USER, user),),
        ((CLIENT_ID, client_id), (USER, None)),
        ((CLIENT_ID, None), (USER, None)),
        ((USER, None),),
        ((CLIENT_ID, client_id),),
        ((CLIENT_ID, None),),
    )


def resolve_ip_quota(
    quotas: Mapping[QuotaEntity, Mapping[str, float]], address: str, key: str
) -> tuple[QuotaEntity, float] | None:
    """The ip quota ``key`` for ``address``: its own entity, else the ip default."""
    for entity in (((IP, address),), ((IP, None),)):
        values = quotas.get(entity)
        if values is not None and key in values:
            return entity, values[key]
    return None
