"""ACLs in the metadata: how the image replays their records, and the controller's
CreateAcls, DeleteAcls and DescribeAcls."""

from __future__ import annotations

import dataclasses
import uuid

import pytest
from metadata_helpers import ControllerFactory

from tidelog.metadata.acls import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    acl_binding_error,
)
from tidelog.metadata.controller import Controller
from tidelog.metadata.controller.acls import AclDeleteResult
from tidelog.metadata.errors import OK, MetadataReplayError
from tidelog.metadata.image import MetadataImage
from tidelog.metadata.records import AccessControlEntryRecord, RemoveAccessControlEntryRecord
from tidelog.protocol.error_codes import ErrorCode

ACL_ID = uuid.UUID(int=1)


def entry(
    acl_id: uuid.UUID = ACL_ID, operation: int = AclOperation.READ
) -> AccessControlEntryRecord:
    return AccessControlEntryRecord(
        acl_id,
        ResourceType.TOPIC,
        "orders",
        PatternType.LITERAL,
        "User:alice",
        "*",
        operation,
        AclPermissionType.ALLOW,
    )


def test_the_image_holds_acls_by_id_and_the_delta_names_them() -> None:
    image, delta = MetadataImage.empty().apply([(0, entry())])
    assert image.acls == {
        ACL_ID: AclBinding(
            ResourceType.TOPIC,
            "orders",
            PatternType.LITERAL,
            "User:alice",
            "*",
            AclOperation.READ,
            AclPermissionType.ALLOW,
        )
    }
    assert delta.changed_acls == {ACL_ID} and not delta.empty
    image, delta = image.apply([(1, RemoveAccessControlEntryRecord(ACL_ID))])
    assert dict(image.acls) == {}
    assert delta.changed_acls == {ACL_ID}


@pytest.mark.parametrize(
    ("records", "reason"),
    [
        ([entry(), entry()], "used twice"),
        ([RemoveAccessControlEntryRecord(ACL_ID)], "does not exist"),
        ([entry(operation=99)], "not a valid AclOperation"),
    ],
)
def test_a_record_that_breaks_the_rules_is_refused(
    records: list[AccessControlEntryRecord | RemoveAccessControlEntryRecord], reason: str
) -> None:
    with pytest.raises(MetadataReplayError, match=reason):
        MetadataImage.empty().apply(enumerate(records))


# -- the controller ------------------------------------------------------------------------

ALICE_READ = AclBinding(
    ResourceType.TOPIC,
    "orders",
    PatternType.LITERAL,
    "User:alice",
    "*",
    AclOperation.READ,
    AclPermissionType.ALLOW,
)
BOB_PREFIXED = dataclasses.replace(
    ALICE_READ, resource_name="pay", pattern_type=PatternType.PREFIXED, principal="User:bob"
)


def test_create_acls_commits_one_record_per_new_acl(controller: Controller) -> None:
    assert controller.create_acls([ALICE_READ, BOB_PREFIXED]) == [OK, OK]
    assert sorted(controller.image.acls.values(), key=str) == sorted(
        [ALICE_READ, BOB_PREFIXED], key=str
    )
    offset = controller.image.offset
    # An ACL that exists (or appears twice) is accepted without a second record.
    assert controller.create_acls([ALICE_READ, ALICE_READ]) == [OK, OK]
    assert controller.image.offset == offset
    assert len(controller.image.acls) == 2


def test_an_invalid_binding_is_refused_alone(controller: Controller) -> None:
    bad = dataclasses.replace(ALICE_READ, operation=AclOperation.ANY)
    no_principal = dataclasses.replace(ALICE_READ, principal="alice")
    results = controller.create_acls([bad, ALICE_READ, no_principal])
    assert [r.code for r in results] == [
        ErrorCode.INVALID_REQUEST,
        ErrorCode.NONE,
        ErrorCode.INVALID_REQUEST,
    ]
    assert results[0].message == acl_binding_error(bad)
    assert results[2].message == acl_binding_error(no_principal)
    assert list(controller.image.acls.values()) == [ALICE_READ]


def test_delete_acls_reports_per_filter_and_removes_each_acl_once(
    controller: Controller,
) -> None:
    controller.create_acls([ALICE_READ, BOB_PREFIXED])
    by_topic = AclBindingFilter(resource_type=ResourceType.TOPIC)
    match_payments = AclBindingFilter(
        resource_type=ResourceType.TOPIC,
        resource_name="payments",
        pattern_type=PatternType.MATCH,
    )
    unknown = AclBindingFilter(operation=AclOperation.UNKNOWN)
    results = controller.delete_acls([match_payments, by_topic, unknown])
    assert results[0] == AclDeleteResult(OK, (BOB_PREFIXED,))
    assert results[1].error == OK
    assert set(results[1].deleted) == {ALICE_READ, BOB_PREFIXED}
    assert results[2].error.code is ErrorCode.INVALID_REQUEST
    assert dict(controller.image.acls) == {}
    assert controller.delete_acls([by_topic]) == [AclDeleteResult(OK, ())]


def test_describe_acls_filters_the_image(controller: Controller) -> None:
    controller.create_acls([ALICE_READ, BOB_PREFIXED])
    assert controller.describe_acls(AclBindingFilter()).acls == (ALICE_READ, BOB_PREFIXED)
    assert controller.describe_acls(AclBindingFilter(principal="User:bob")).acls == (BOB_PREFIXED,)
    literal = AclBindingFilter(pattern_type=PatternType.LITERAL, resource_name="pay")
    assert controller.describe_acls(literal).acls == ()
    unknown = AclBindingFilter(resource_type=ResourceType.UNKNOWN)
    assert controller.describe_acls(unknown).error.code is ErrorCode.INVALID_REQUEST


def test_acls_survive_a_restart(start_controller: ControllerFactory) -> None:
    first = start_controller()
    first.create_acls([ALICE_READ, BOB_PREFIXED])
    first.delete_acls([AclBindingFilter(principal="User:alice")])
    acls = dict(first.image.acls)
    first.close()
    assert dict(start_controller().image.acls) == acls == {next(iter(acls)): BOB_PREFIXED}
