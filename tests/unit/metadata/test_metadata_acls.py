"""ACLs in the metadata: how the image replays their records."""

from __future__ import annotations

import uuid

import pytest

from tidelog.metadata.acls import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from tidelog.metadata.errors import MetadataReplayError
from tidelog.metadata.image import MetadataImage
from tidelog.metadata.records import AccessControlEntryRecord, RemoveAccessControlEntryRecord

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
