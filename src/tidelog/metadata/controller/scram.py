"""SCRAM credentials: AlterUserScramCredentials and DescribeUserScramCredentials (KIP-554).

The client sends, per upsertion, a salt and the salted password; the controller derives
the stored key and server key and commits only those (a UserScramCredentialRecord).
Checks, with Kafka's codes and messages: a (user, mechanism) altered twice in one request
is DUPLICATE_RESOURCE; an empty user name, an empty salt or salted password, or an
iteration count outside [4096, 16384] is UNACCEPTABLE_CREDENTIAL; an unknown mechanism is
UNSUPPORTED_SASL_MECHANISM; deleting a credential that does not exist is
RESOURCE_NOT_FOUND. A user with any failed change keeps all its credentials as they were:
the changes of one user commit together or not at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from tidelog.metadata.controller.base import ControllerResult, ControllerView, per_item
from tidelog.metadata.errors import OK, ApiError
from tidelog.metadata.image import MetadataImage
from tidelog.metadata.records import (
    MetadataRecord,
    RemoveUserScramCredentialRecord,
    UserScramCredentialRecord,
)
from tidelog.metadata.scram import (
    MAX_ITERATIONS,
    MIN_ITERATIONS,
    credential_from_salted_password,
    mechanism_by_type,
)
from tidelog.protocol.error_codes import ErrorCode

__all__ = [
    "AlterScramResult",
    "DescribeScramResult",
    "ScramDeletion",
    "ScramUpsertion",
    "alter_user_scram_credentials",
    "describe_user_scram_credentials",
]


@dataclass(frozen=True)
class ScramDeletion:
    name: str
    mechanism: int


@dataclass(frozen=True)
class ScramUpsertion:
    name: str
    mechanism: int
    iterations: int
    salt: bytes
    salted_password: bytes


@dataclass(frozen=True)
class AlterScramResult:
    user: str
    error: ApiError = OK


@dataclass(frozen=True)
class DescribeScramResult:
    user: str
    error: ApiError = OK
    #: (mechanism type id, iterations) of each credential the user has
    credentials: tuple[tuple[int, int], ...] = ()


def _check(
    image: MetadataImage, change: ScramDeletion | ScramUpsertion
) -> tuple[ApiError, MetadataRecord | None]:
    if not change.name:
        return ApiError(ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty"), None
    mechanism = mechanism_by_type(change.mechanism)
    if mechanism is None:
        return ApiError(ErrorCode.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism"), None
    if isinstance(change, ScramDeletion):
        if image.scram_credential(change.name, change.mechanism) is None:
            return (
                ApiError(
                    ErrorCode.RESOURCE_NOT_FOUND,
                    "Attempt to delete a user credential that does not exist",
                ),
                None,
            )
        return OK, RemoveUserScramCredentialRecord(change.name, change.mechanism)
    if change.iterations < MIN_ITERATIONS:
        return ApiError(ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too few iterations"), None
    if change.iterations > MAX_ITERATIONS:
        return ApiError(ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too many iterations"), None
    if not change.salt or not change.salted_password:
        return (
            ApiError(
                ErrorCode.UNACCEPTABLE_CREDENTIAL, "Salt and salted password must not be empty"
            ),
            None,
        )
    credential = credential_from_salted_password(
        mechanism, change.salt, change.salted_password, change.iterations
    )
    return OK, UserScramCredentialRecord(
        change.name,
        change.mechanism,
        credential.salt,
        credential.stored_key,
        credential.server_key,
        credential.iterations,
    )


def alter_user_scram_credentials(
    view: ControllerView,
    deletions: Sequence[ScramDeletion],
    upsertions: Sequence[ScramUpsertion],
) -> ControllerResult[list[AlterScramResult]]:
    """One result per user named, in the order users first appear (deletions first)."""
    changes: list[ScramDeletion | ScramUpsertion] = [*deletions, *upsertions]
    seen: dict[tuple[str, int], int] = {}
    for change in changes:
        key = (change.name, change.mechanism)
        seen[key] = seen.get(key, 0) + 1
    users: dict[str, ApiError] = {}
    records: dict[str, list[MetadataRecord]] = {}
    for change in changes:
        if seen[(change.name, change.mechanism)] > 1:
            error, record = (
                ApiError(
                    ErrorCode.DUPLICATE_RESOURCE,
                    "A user credential cannot be altered twice in the same request",
                ),
                None,
            )
        else:
            error, record = _check(view.image, change)
        if change.name not in users or (users[change.name].ok and not error.ok):
            users[change.name] = error
        if record is not None:
            records.setdefault(change.name, []).append(record)
    results = [AlterScramResult(user, error) for user, error in users.items()]
    planned = [
        (index, records[result.user])
        for index, result in enumerate(results)
        if result.error.ok and result.user in records
    ]
    return per_item(results, planned, lambda result, error: replace(result, error=error))


def describe_user_scram_credentials(
    image: MetadataImage, users: Sequence[str] | None
) -> list[DescribeScramResult]:
    """Every user with credentials when ``users`` is None or empty, else those named."""
    by_user: dict[str, list[tuple[int, int]]] = {}
    for (user, mechanism), credential in sorted(image.scram_credentials.items()):
        by_user.setdefault(user, []).append((mechanism, credential.iterations))
    if not users:
        return [DescribeScramResult(user, OK, tuple(infos)) for user, infos in by_user.items()]
    counts: dict[str, int] = {}
    for user in users:
        counts[user] = counts.get(user, 0) + 1
    results = []
    for user in dict.fromkeys(users):
        if counts[user] > 1:
            error = ApiError(
                ErrorCode.DUPLICATE_RESOURCE,
                "Cannot describe SCRAM credentials for the same user twice in a single request",
            )
            results.append(DescribeScramResult(user, error))
        elif user not in by_user:
            error = ApiError(
                ErrorCode.RESOURCE_NOT_FOUND,
                "Attempt to describe a user credential that does not exist",
            )
            results.append(DescribeScramResult(user, error))
        else:
            results.append(DescribeScramResult(user, OK, tuple(by_user[user])))
    return results
