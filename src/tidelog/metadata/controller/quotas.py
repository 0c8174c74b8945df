"""Client quotas: AlterClientQuotas and DescribeClientQuotas (KIP-546).

Every entry of an AlterClientQuotas request is one entity and its operations; entries
succeed or fail alone, and an entry's operations commit together or not at all. Checks,
all INVALID_REQUEST with a message as Kafka answers them: the entity must be one Kafka
allows (:func:`tidelog.metadata.quotas.entity_error`), named once in the request; each
key must be one of the entity's kind, named once in the entry, and a value set must be
positive (whole for the byte and connection rates). Setting a key to the value it has,
or removing a key that is not set, writes no record. ``validate_only`` checks and
commits nothing.

DescribeClientQuotas filters the image's entities by components (entity type with an
exact name, the default, or any name); ``strict`` keeps only entities with no other type.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from tidelog.metadata.controller.base import ControllerResult, ControllerView, per_item
from tidelog.metadata.errors import OK, ApiError
from tidelog.metadata.image import MetadataImage
from tidelog.metadata.quotas import (
    CLIENT_ID,
    ENTITY_TYPES,
    IP,
    USER,
    QuotaEntity,
    entity_error,
    quota_entity,
    value_error,
)
from tidelog.metadata.records import ClientQuotaRecord, MetadataRecord
from tidelog.protocol.error_codes import ErrorCode

__all__ = [
    "MATCH_ANY",
    "MATCH_DEFAULT",
    "MATCH_EXACT",
    "AlterQuotaResult",
    "QuotaAlteration",
    "QuotaFilterComponent",
    "alter_client_quotas",
    "describe_client_quotas",
]

#: DescribeClientQuotas match types, as on the wire.
MATCH_EXACT = 0
MATCH_DEFAULT = 1
MATCH_ANY = 2


@dataclass(frozen=True)
class QuotaAlteration:
    """One request entry: the entity as the request gives it, and (key, value) operations,
    a value of None removing the key."""

    entity: tuple[tuple[str, str | None], ...]
    ops: tuple[tuple[str, float | None], ...]


@dataclass(frozen=True)
class AlterQuotaResult:
    entity: tuple[tuple[str, str | None], ...]
    error: ApiError = OK


@dataclass(frozen=True)
class QuotaFilterComponent:
    entity_type: str
    match_type: int
    match: str | None = None


def _invalid(message: str) -> ApiError:
    return ApiError(ErrorCode.INVALID_REQUEST, message)


def _plan(
    image: MetadataImage, alteration: QuotaAlteration
) -> tuple[ApiError, list[MetadataRecord]]:
    problem = entity_error(list(alteration.entity))
    if problem is not None:
        return _invalid(problem), []
    entity = quota_entity(dict(alteration.entity))
    current = image.client_quotas.get(entity, {})
    records: list[MetadataRecord] = []
    keys: set[str] = set()
    for key, value in alteration.ops:
        if key in keys:
            return _invalid(f"Quota key {key} appears more than once in the entry"), []
        keys.add(key)
        problem = value_error(entity, key, value)
        if problem is not None:
            return _invalid(problem), []
        if value is None:
            if key in current:
                records.append(ClientQuotaRecord(entity, key, 0.0, remove=True))
        elif current.get(key) != value:
            records.append(ClientQuotaRecord(entity, key, value))
    return OK, records


def alter_client_quotas(
    view: ControllerView, alterations: Sequence[QuotaAlteration], *, validate_only: bool
) -> ControllerResult[list[AlterQuotaResult]]:
    """One result per entry, in request order."""
    counts: dict[QuotaEntity, int] = {}
    for alteration in alterations:
        if entity_error(list(alteration.entity)) is None:
            entity = quota_entity(dict(alteration.entity))
            counts[entity] = counts.get(entity, 0) + 1
    results: list[AlterQuotaResult] = []
    planned: list[tuple[int, list[MetadataRecord]]] = []
    for index, alteration in enumerate(alterations):
        error, records = _plan(view.image, alteration)
        if error.ok and counts[quota_entity(dict(alteration.entity))] > 1:
            error, records = _invalid("A quota entity cannot be altered twice in one request"), []
        results.append(AlterQuotaResult(alteration.entity, error))
        if records and not validate_only:
            planned.append((index, records))
    return per_item(results, planned, lambda result, error: replace(result, error=error))


def _filter_error(components: Sequence[QuotaFilterComponent]) -> ApiError:
    seen: set[str] = set()
    for component in components:
        if component.entity_type not in ENTITY_TYPES:
            return _invalid(f"Custom entity type {component.entity_type} not supported")
        if component.entity_type in seen:
            return _invalid(
                f"Entity type {component.entity_type} cannot appear more than once in the filter"
            )
        seen.add(component.entity_type)
        if component.match_type == MATCH_EXACT and component.match is None:
            return _invalid(f"Exact match on {component.entity_type} needs a name to match")
        if component.match_type in (MATCH_DEFAULT, MATCH_ANY) and component.match is not None:
            return _invalid(
                f"Match type {component.match_type} on {component.entity_type} takes no name"
            )
        if component.match_type not in (MATCH_EXACT, MATCH_DEFAULT, MATCH_ANY):
            return _invalid(f"Unknown match type {component.match_type}")
    if IP in seen and (USER in seen or CLIENT_ID in seen):
        return _invalid(
            "Invalid entity filter component combination, IP filter component should not "
            "be used with user or clientId filter component"
        )
    return OK


def describe_client_quotas(
    image: MetadataImage, components: Sequence[QuotaFilterComponent], *, strict: bool
) -> tuple[ApiError, list[tuple[QuotaEntity, Mapping[str, float]]]]:
    """The error (OK, or INVALID_REQUEST for a bad filter) and the matching entities with
    their quotas, in a stable order."""
    error = _filter_error(components)
    if not error.ok:
        return error, []
    found = []
    for entity, values in image.client_quotas.items():
        names = dict(entity)
        if strict and len(names) != len(components):
            continue
        if all(_matches(names, component) for component in components):
            found.append((entity, values))
    found.sort(key=lambda item: repr(item[0]))
    return OK, found


def _matches(names: Mapping[str, str | None], component: QuotaFilterComponent) -> bool:
    if component.entity_type not in names:
        return False
    name = names[component.entity_type]
    if component.match_type == MATCH_EXACT:
        return name == component.match
    if component.match_type == MATCH_DEFAULT:
        return name is None
    return True
