"""Per-API authorization through the handlers: each API family allowed, denied, and the
Metadata filtering, for principals with ACLs (docs/security.md, "What each API checks");
then the handlers' answers against a reference model of Kafka's rules over random ACLs."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidelog.broker.authorization import SUPPORTED_OPERATIONS, operation_bits
from tidelog.broker.broker import Broker
from tidelog.broker.handlers import HANDLERS
from tidelog.broker.reply import Deferred, EncodedResponse, join_parts
from tidelog.metadata.acls import (
    STANDARD_AUTHORIZER,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from tidelog.metadata.controller import NewTopic
from tidelog.protocol import ApiKey, ErrorCode, decode_response, encode_response
from tidelog.security.authorizer import Authorizer
from tidelog.security.principal import KafkaPrincipal

from .admin_fixtures import create_topics_request, schema, timeout
from .conftest import FakeClock, context, make_batch, produce_request, stored_batches
from .test_fetch_helpers import Want, decode_body, fetch_request, make
from .test_groups import (
    commit_request,
    find_request,
    heartbeat_request,
    join_request,
    running,
    sync_request,
)

E = ErrorCode
Op = AclOperation
TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
TXN = ResourceType.TRANSACTIONAL_ID
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
LITERAL, PREFIXED = PatternType.LITERAL, PatternType.PREFIXED

AUTHZ = {"authorizer.class.name": STANDARD_AUTHORIZER, "super.users": "User:admin"}
ADMIN = KafkaPrincipal.user("admin")
ALICE = KafkaPrincipal.user("alice")
BOB = KafkaPrincipal.user("bob")


def acl(
    resource_type: ResourceType,
    name: str,
    operation: AclOperation,
    *,
    principal: str = "User:alice",
    permission: AclPermissionType = ALLOW,
    pattern: PatternType = LITERAL,
) -> AclBinding:
    return AclBinding(resource_type, name, pattern, principal, "*", operation, permission)


def grant(broker: Broker, *bindings: AclBinding) -> None:
    assert broker.controller is not None
    errors = broker.controller.create_acls(list(bindings))
    assert all(error.ok for error in errors), errors


def topics(broker: Broker, *names: str) -> None:
    assert broker.controller is not None
    created = broker.controller.create_topics([NewTopic(name, 1, 1) for name in names])
    assert all(result.error.ok for result in created), created


async def as_user(
    broker: Broker, principal: KafkaPrincipal, api_key: ApiKey, version: int, request: Any
) -> Any:
    """The response of ``request`` sent by ``principal``, as a client decodes it."""
    ctx = context(broker, api_key, version, principal=principal, peer="10.0.0.7:5000")
    reply = await HANDLERS[api_key](ctx, request)
    if isinstance(reply, Deferred):
        reply = await reply.waiter
    if isinstance(reply, EncodedResponse):
        try:
            return decode_body(api_key, version, join_parts(reply.parts))
        finally:
            reply.close()
    frame = encode_response(ctx.header, reply)
    _, decoded = decode_response(
        memoryview(frame)[4:], api_key=int(api_key), api_version=version, correlation_id=1
    )
    return decoded


def send(
    broker: Broker, principal: KafkaPrincipal, api_key: ApiKey, version: int, request: Any
) -> Any:
    return asyncio.run(as_user(broker, principal, api_key, version, request))


def metadata_request(version: int, names: list[str] | None, **flags: Any) -> Any:
    module = schema("metadata", version)
    wanted = (
        None
        if names is None
        else tuple(make(module.MetadataRequestTopic, name=n, topic_id=None) for n in names)
    )
    values = {
        "allow_auto_topic_creation": True,
        "include_cluster_authorized_operations": False,
        "include_topic_authorized_operations": False,
        **flags,
    }
    return make(module.MetadataRequest, topics=wanted, **values)


def list_offsets_request(name: str) -> Any:
    module = schema("list_offsets", 7)
    partition = module.ListOffsetsPartition(
        partition_index=0, current_leader_epoch=-1, timestamp=-1
    )
    return module.ListOffsetsRequest(
        replica_id=-1,
        isolation_level=0,
        topics=(module.ListOffsetsTopic(name=name, partitions=(partition,)),),
    )


def create_acls_request(topic: str) -> Any:
    """CreateAcls v3 of one ACL: alice may do everything on ``topic``."""
    module = schema("create_acls", 3)
    creation = module.AclCreation(
        resource_type=int(TOPIC),
        resource_name=topic,
        resource_pattern_type=int(LITERAL),
        principal="User:alice",
        host="*",
        operation=int(Op.ALL),
        permission_type=int(ALLOW),
    )
    return module.CreateAclsRequest(creations=(creation,))


def produce_errors(response: Any) -> dict[str, int]:
    return {t.name: p.error_code for t in response.responses for p in t.partition_responses}


# -- Produce, Fetch, ListOffsets -------------------------------------------------------


def test_produce_fetch_and_list_offsets_check_the_topic(start_admin_broker: Any) -> None:
    broker = start_admin_broker(AUTHZ)
    topics(broker, "orders", "audit")
    grant(broker, acl(TOPIC, "orders", Op.WRITE), acl(TOPIC, "orders", Op.READ))
    batch = make_batch([b"a", b"b"])

    wrote = send(broker, ALICE, ApiKey.PRODUCE, 9, produce_request(9, {"orders": {0: batch}}))
    assert produce_errors(wrote) == {"orders": E.NONE}
    both = produce_request(9, {"orders": {0: batch}, "audit": {0: batch}})
    assert produce_errors(send(broker, ALICE, ApiKey.PRODUCE, 9, both)) == {
        "orders": E.NONE,
        "audit": E.TOPIC_AUTHORIZATION_FAILED,
    }
    refused = send(broker, BOB, ApiKey.PRODUCE, 9, produce_request(9, {"orders": {0: batch}}))
    assert produce_errors(refused) == {"orders": E.TOPIC_AUTHORIZATION_FAILED}
    assert len(stored_batches(broker, "orders")) == 2
    assert stored_batches(broker, "audit") == []
    # A transactional write needs Write on its transactional id first, whatever the topic.
    txn = produce_request(9, {"orders": {0: batch}}, transactional_id="tx-1")
    assert produce_errors(send(broker, ALICE, ApiKey.PRODUCE, 9, txn)) == {
        "orders": E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    }

    for version in (12, 17):
        wants = [Want("orders"), Want("audit")]
        fetched = send(broker, ALICE, ApiKey.FETCH, version, fetch_request(broker, version, wants))
        by_topic = {
            (t.topic if version < 13 else broker.topic_name_of(t.topic_id)): t.partitions[0]
            for t in fetched.responses
        }
        assert by_topic["orders"].error_code == E.NONE
        assert by_topic["orders"].high_watermark == 4
        assert by_topic["audit"].error_code == E.TOPIC_AUTHORIZATION_FAILED
        assert by_topic["audit"].records in (None, b"")
    # A follower fetch needs ClusterAction, which only the super user has here.
    follower = fetch_request(broker, 12, [Want("orders")], replica_id=2)
    [denied] = send(broker, ALICE, ApiKey.FETCH, 12, follower).responses
    assert denied.partitions[0].error_code == E.TOPIC_AUTHORIZATION_FAILED
    [admitted] = send(broker, ADMIN, ApiKey.FETCH, 12, follower).responses
    assert admitted.partitions[0].error_code == E.NOT_LEADER_OR_FOLLOWER

    # ListOffsets: Describe, which Alice's Read implies.
    [listed] = send(broker, ALICE, ApiKey.LIST_OFFSETS, 7, list_offsets_request("orders")).topics
    assert (listed.partitions[0].error_code, listed.partitions[0].offset) == (E.NONE, 4)
    [hidden] = send(broker, BOB, ApiKey.LIST_OFFSETS, 7, list_offsets_request("orders")).topics
    assert hidden.partitions[0].error_code == E.TOPIC_AUTHORIZATION_FAILED


def test_denials_are_logged_once_in_kafkas_authorizer_log_shape(
    start_admin_broker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    broker = start_admin_broker(AUTHZ)
    topics(broker, "orders")
    caplog.set_level(logging.INFO, logger="tidelog.authorizer")
    send(broker, BOB, ApiKey.PRODUCE, 9, produce_request(9, {"orders": {0: make_batch()}}))
    lines = [r.getMessage() for r in caplog.records if r.name == "tidelog.authorizer"]
    assert lines == [
        "Principal = User:bob is Denied operation = Write from host = 10.0.0.7 on resource = "
        "Topic:LITERAL:orders for request = Produce"
    ]
    # Filtering a listing is not a denial worth a line (Kafka logs it neither).
    caplog.clear()
    send(broker, BOB, ApiKey.METADATA, 12, metadata_request(12, None))
    assert [r for r in caplog.records if r.name == "tidelog.authorizer"] == []


# -- Metadata --------------------------------------------------------------------------


def test_metadata_hides_what_may_not_be_described(start_admin_broker: Any) -> None:
    broker = start_admin_broker({**AUTHZ, "auto.create.topics.enable": "true"})
    topics(broker, "orders", "pay-eu", "payments", "secret")
    grant(
        broker,
        acl(TOPIC, "orders", Op.READ),
        acl(TOPIC, "pay", Op.DESCRIBE, pattern=PREFIXED),
        acl(TOPIC, "payments", Op.DESCRIBE, permission=DENY),
    )
    for version in (1, 9, 12):
        every = send(broker, ALICE, ApiKey.METADATA, version, metadata_request(version, None))
        assert sorted(t.name for t in every.topics) == ["orders", "pay-eu"]
        assert (
            send(broker, BOB, ApiKey.METADATA, version, metadata_request(version, None)).topics
            == ()
        )
        flags = {"allow_auto_topic_creation": False} if version >= 4 else {}
        named = send(
            broker,
            ALICE,
            ApiKey.METADATA,
            version,
            metadata_request(version, ["payments", "secret", "orders", "nope"], **flags),
        )
        errors = {t.name: t.error_code for t in named.topics}
        assert errors["orders"] == E.NONE
        assert errors["payments"] == errors["secret"] == E.TOPIC_AUTHORIZATION_FAILED
        # Denied before existence is looked at: an unknown name is no different.
        assert errors["nope"] == E.TOPIC_AUTHORIZATION_FAILED
        [denied] = [t for t in named.topics if t.name == "payments"]
        assert denied.partitions == ()

    # Auto-creation: Describe lets Alice see that pay-new is missing, Create is needed.
    wanted = metadata_request(12, ["pay-new"], allow_auto_topic_creation=True)
    [refused] = send(broker, ALICE, ApiKey.METADATA, 12, wanted).topics
    assert refused.error_code == E.TOPIC_AUTHORIZATION_FAILED
    assert broker.image.topic("pay-new") is None
    grant(broker, acl(TOPIC, "pay-", Op.CREATE, pattern=PREFIXED))
    [created] = send(broker, ALICE, ApiKey.METADATA, 12, wanted).topics
    assert created.error_code == E.LEADER_NOT_AVAILABLE
    assert broker.image.topic("pay-new") is not None


def test_metadata_authorized_operations_are_the_principals(start_admin_broker: Any) -> None:
    broker = start_admin_broker(AUTHZ)
    topics(broker, "orders")
    grant(broker, acl(TOPIC, "orders", Op.READ), acl(TOPIC, "orders", Op.ALTER_CONFIGS))
    request = metadata_request(
        12,
        ["orders"],
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=True,
    )
    [topic] = send(broker, ALICE, ApiKey.METADATA, 12, request).topics
    assert topic.topic_authorized_operations == operation_bits(
        [Op.READ, Op.DESCRIBE, Op.ALTER_CONFIGS, Op.DESCRIBE_CONFIGS]
    )
    cluster = schema("describe_cluster", 1).DescribeClusterRequest(
        include_cluster_authorized_operations=True, endpoint_type=1
    )
    assert (
        send(broker, ALICE, ApiKey.DESCRIBE_CLUSTER, 1, cluster).cluster_authorized_operations == 0
    )
    everything = operation_bits(SUPPORTED_OPERATIONS[CLUSTER])
    assert (
        send(broker, ADMIN, ApiKey.DESCRIBE_CLUSTER, 1, cluster).cluster_authorized_operations
        == everything
    )
    grant(broker, acl(CLUSTER, "kafka-cluster", Op.DESCRIBE))
    assert send(
        broker, ALICE, ApiKey.DESCRIBE_CLUSTER, 1, cluster
    ).cluster_authorized_operations == operation_bits([Op.DESCRIBE])


# -- Groups ----------------------------------------------------------------------------


def test_group_apis_check_the_group_and_the_topics(
    start_admin_broker: Any, clock: FakeClock
) -> None:
    async def scenario() -> None:
        # The group harness readies the coordinator as User:ANONYMOUS.
        with_harness = {**AUTHZ, "super.users": "User:admin;User:ANONYMOUS"}
        async with running(start_admin_broker, with_harness) as broker:
            topics(broker, "secret")
            grant(broker, acl(GROUP, "billing", Op.READ), acl(TOPIC, "orders", Op.READ))

            find = find_request(4, ["billing"])
            [bob_find] = (await as_user(broker, BOB, ApiKey.FIND_COORDINATOR, 4, find)).coordinators
            assert (bob_find.error_code, bob_find.node_id) == (E.GROUP_AUTHORIZATION_FAILED, -1)
            [found] = (await as_user(broker, ALICE, ApiKey.FIND_COORDINATOR, 4, find)).coordinators
            assert found.error_code == E.NONE

            joined = await as_user(broker, BOB, ApiKey.JOIN_GROUP, 9, join_request(9, "billing"))
            assert joined.error_code == E.GROUP_AUTHORIZATION_FAILED

            offsets = {("orders", 0): 5, ("secret", 0): 7}
            committed = await as_user(
                broker, ALICE, ApiKey.OFFSET_COMMIT, 8, commit_request(8, "billing", offsets)
            )
            assert {t.name: t.partitions[0].error_code for t in committed.topics} == {
                "orders": E.NONE,
                "secret": E.TOPIC_AUTHORIZATION_FAILED,
            }
            by_bob = await as_user(
                broker, BOB, ApiKey.OFFSET_COMMIT, 8, commit_request(8, "billing", offsets)
            )
            assert {p.error_code for t in by_bob.topics for p in t.partitions} == {
                E.GROUP_AUTHORIZATION_FAILED
            }
            # The admin commits for another group and for the secret topic too.
            await as_user(
                broker, ADMIN, ApiKey.OFFSET_COMMIT, 8, commit_request(8, "billing", offsets)
            )
            await as_user(
                broker, ADMIN, ApiKey.OFFSET_COMMIT, 8, commit_request(8, "other", offsets)
            )

            module = schema("offset_fetch", 7)
            every = module.OffsetFetchRequest(group_id="billing", topics=None)
            fetched = await as_user(broker, ALICE, ApiKey.OFFSET_FETCH, 7, every)
            assert [t.name for t in fetched.topics] == ["orders"]
            named = module.OffsetFetchRequest(
                group_id="billing",
                topics=(module.OffsetFetchRequestTopic(name="secret", partition_indexes=(0,)),),
            )
            [secret] = (await as_user(broker, ALICE, ApiKey.OFFSET_FETCH, 7, named)).topics
            assert secret.partitions[0].error_code == E.TOPIC_AUTHORIZATION_FAILED
            bobs = await as_user(broker, BOB, ApiKey.OFFSET_FETCH, 7, every)
            assert bobs.error_code == E.GROUP_AUTHORIZATION_FAILED

            listing = schema("list_groups", 4).ListGroupsRequest(states_filter=())
            listed = await as_user(broker, ALICE, ApiKey.LIST_GROUPS, 4, listing)
            assert [g.group_id for g in listed.groups] == ["billing"]
            everyone = await as_user(broker, ADMIN, ApiKey.LIST_GROUPS, 4, listing)
            assert sorted(g.group_id for g in everyone.groups) == ["billing", "other"]

            describe = schema("describe_groups", 5).DescribeGroupsRequest(
                groups=("billing", "other"), include_authorized_operations=True
            )
            mine, theirs = (
                await as_user(broker, ALICE, ApiKey.DESCRIBE_GROUPS, 5, describe)
            ).groups
            assert mine.error_code == E.NONE
            assert mine.authorized_operations == operation_bits([Op.READ, Op.DESCRIBE])
            assert theirs.error_code == E.GROUP_AUTHORIZATION_FAILED

            delete = schema("delete_groups", 2).DeleteGroupsRequest(groups_names=("billing",))
            [result] = (await as_user(broker, ALICE, ApiKey.DELETE_GROUPS, 2, delete)).results
            assert result.error_code == E.GROUP_AUTHORIZATION_FAILED

            # The rest of the group protocol: Read on the group, refused before anything.
            sync = sync_request(5, "billing", 1, "m-1", {})
            assert (await as_user(broker, BOB, ApiKey.SYNC_GROUP, 5, sync)).error_code == (
                E.GROUP_AUTHORIZATION_FAILED
            )
            beat = heartbeat_request(4, "billing", 1, "m-1")
            assert (await as_user(broker, BOB, ApiKey.HEARTBEAT, 4, beat)).error_code == (
                E.GROUP_AUTHORIZATION_FAILED
            )
            leaving = schema("leave_group", 4)
            leave = leaving.LeaveGroupRequest(
                group_id="billing", members=(leaving.MemberIdentity(member_id="m-1"),)
            )
            assert (await as_user(broker, BOB, ApiKey.LEAVE_GROUP, 4, leave)).error_code == (
                E.GROUP_AUTHORIZATION_FAILED
            )
            # OffsetDelete: Delete on the group, then Read on each topic.
            grant(broker, acl(GROUP, "billing", Op.DELETE))
            module = schema("offset_delete", 0)
            request = module.OffsetDeleteRequest(
                group_id="billing",
                topics=tuple(
                    module.OffsetDeleteRequestTopic(
                        name=t, partitions=(module.OffsetDeleteRequestPartition(partition_index=0),)
                    )
                    for t in ("orders", "secret")
                ),
            )
            deleted = await as_user(broker, ALICE, ApiKey.OFFSET_DELETE, 0, request)
            assert deleted.error_code == E.NONE
            assert [(t.name, t.partitions[0].error_code) for t in deleted.topics] == [
                ("orders", E.NONE),
                ("secret", E.TOPIC_AUTHORIZATION_FAILED),
            ]
            by_bob = await as_user(broker, BOB, ApiKey.OFFSET_DELETE, 0, request)
            assert (by_bob.error_code, by_bob.topics) == (E.GROUP_AUTHORIZATION_FAILED, ())
            fetched = await as_user(broker, ADMIN, ApiKey.OFFSET_FETCH, 7, every)
            assert [t.name for t in fetched.topics] == ["secret"]

    asyncio.run(scenario())


# -- Topic and config administration ---------------------------------------------------


def test_topic_and_config_administration(start_admin_broker: Any) -> None:
    broker = start_admin_broker(AUTHZ)
    topics(broker, "orders")
    grant(
        broker,
        acl(TOPIC, "team-", Op.CREATE, pattern=PREFIXED),
        acl(TOPIC, "orders", Op.DESCRIBE_CONFIGS),
    )
    wanted = create_topics_request(7, [{"name": "team-a", "partitions": 1}, {"name": "ops"}])
    created = send(broker, ALICE, ApiKey.CREATE_TOPICS, 7, wanted).topics
    assert [(t.name, t.error_code) for t in created] == [
        ("team-a", E.NONE),
        ("ops", E.TOPIC_AUTHORIZATION_FAILED),
    ]
    assert broker.image.topic("ops") is None
    # The new topic's configs are for those who may describe them.
    assert (created[0].configs, created[0].topic_config_error_code) == (
        (),
        E.TOPIC_AUTHORIZATION_FAILED,
    )
    by_admin = create_topics_request(7, [{"name": "team-c", "partitions": 1}])
    [theirs] = send(broker, ADMIN, ApiKey.CREATE_TOPICS, 7, by_admin).topics
    assert theirs.configs and theirs.topic_config_error_code == E.NONE

    delete = schema("delete_topics", 6).DeleteTopicsRequest(
        topics=(schema("delete_topics", 6).DeleteTopicState(name="team-a", topic_id=None),),
        timeout=timeout(),
    )
    [refused] = send(broker, ALICE, ApiKey.DELETE_TOPICS, 6, delete).responses
    assert refused.error_code == E.TOPIC_AUTHORIZATION_FAILED
    assert broker.image.topic("team-a") is not None

    module = schema("create_partitions", 3)
    more = module.CreatePartitionsRequest(
        topics=(module.CreatePartitionsTopic(name="orders", count=3, assignments=None),),
        timeout=timeout(),
        validate_only=False,
    )
    [grown] = send(broker, ALICE, ApiKey.CREATE_PARTITIONS, 3, more).results
    assert grown.error_code == E.TOPIC_AUTHORIZATION_FAILED
    assert len(broker.image.topic("orders").partitions) == 1

    module = schema("describe_configs", 4)
    resources = (
        module.DescribeConfigsResource(
            resource_type=2, resource_name="orders", configuration_keys=None
        ),
        module.DescribeConfigsResource(resource_type=4, resource_name="", configuration_keys=None),
    )
    request = module.DescribeConfigsRequest(
        resources=resources, include_synonyms=False, include_documentation=False
    )
    topic, cluster = send(broker, ALICE, ApiKey.DESCRIBE_CONFIGS, 4, request).results
    assert topic.error_code == E.NONE and topic.configs
    assert (cluster.error_code, cluster.configs) == (E.CLUSTER_AUTHORIZATION_FAILED, ())
    topic, cluster = send(broker, BOB, ApiKey.DESCRIBE_CONFIGS, 4, request).results
    assert (topic.error_code, topic.configs) == (E.TOPIC_AUTHORIZATION_FAILED, ())

    module = schema("incremental_alter_configs", 1)
    change = module.AlterableConfig(name="retention.ms", config_operation=0, value="1000")
    alter = module.IncrementalAlterConfigsRequest(
        resources=(
            module.AlterConfigsResource(resource_type=2, resource_name="orders", configs=(change,)),
        ),
        validate_only=False,
    )
    [altered] = send(broker, ALICE, ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, alter).responses
    assert altered.error_code == E.TOPIC_AUTHORIZATION_FAILED
    [altered] = send(broker, ADMIN, ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, alter).responses
    assert altered.error_code == E.NONE


def test_acl_apis_need_describe_and_alter_on_the_cluster(start_admin_broker: Any) -> None:
    broker = start_admin_broker(AUTHZ)
    module = schema("describe_acls", 3)
    everything = module.DescribeAclsRequest(
        resource_type_filter=1,
        resource_name_filter=None,
        pattern_type_filter=1,
        principal_filter=None,
        host_filter=None,
        operation=1,
        permission_type=1,
    )
    assert send(broker, ALICE, ApiKey.DESCRIBE_ACLS, 3, everything).error_code == (
        E.CLUSTER_AUTHORIZATION_FAILED
    )
    request = create_acls_request("orders")
    [result] = send(broker, ALICE, ApiKey.CREATE_ACLS, 3, request).results
    assert result.error_code == E.CLUSTER_AUTHORIZATION_FAILED
    assert dict(broker.image.acls) == {}
    grant(broker, acl(CLUSTER, "kafka-cluster", Op.DESCRIBE))
    assert send(broker, ALICE, ApiKey.DESCRIBE_ACLS, 3, everything).error_code == E.NONE


# -- Producer ids and transactions -----------------------------------------------------


def init_producer_id(transactional_id: str | None) -> Any:
    return schema("init_producer_id", 4).InitProducerIdRequest(
        transactional_id=transactional_id,
        transaction_timeout=timeout(),
        producer_id=-1,
        producer_epoch=-1,
    )


def test_init_producer_id_needs_idempotent_write_or_write_on_some_topic(
    start_admin_broker: Any,
) -> None:
    broker = start_admin_broker(AUTHZ)
    ask = init_producer_id(None)
    assert send(broker, ALICE, ApiKey.INIT_PRODUCER_ID, 4, ask).error_code == (
        E.CLUSTER_AUTHORIZATION_FAILED
    )
    # KIP-679: Write on any topic is enough, here through a prefix nothing denies.
    grant(broker, acl(TOPIC, "events-", Op.WRITE, pattern=PREFIXED))
    answer = send(broker, ALICE, ApiKey.INIT_PRODUCER_ID, 4, ask)
    assert answer.error_code == E.NONE and answer.producer_id >= 0
    # Bob has IdempotentWrite on the cluster instead.
    grant(broker, acl(CLUSTER, "kafka-cluster", Op.IDEMPOTENT_WRITE, principal="User:bob"))
    assert send(broker, BOB, ApiKey.INIT_PRODUCER_ID, 4, ask).error_code == E.NONE
    transactional = init_producer_id("tx-1")
    assert send(broker, ALICE, ApiKey.INIT_PRODUCER_ID, 4, transactional).error_code == (
        E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    )


# -- Reference model -------------------------------------------------------------------

NAMES = ["a", "ab", "abc", "b", "ba"]
PRINCIPALS = ["User:alice", "User:bob", "User:*"]


def reference_allows(
    acls: list[AclBinding], principal: str, operation: AclOperation, name: str, everyone: bool
) -> bool:
    """Kafka's decision for a topic, written straight from the rules (no index)."""

    def matches(a: AclBinding) -> bool:
        if a.pattern_type == PREFIXED:
            return name.startswith(a.resource_name)
        return a.resource_name in (name, "*")

    on_resource = [a for a in acls if a.resource_type == TOPIC and matches(a)]
    mine = [a for a in on_resource if a.principal in (principal, "User:*")]
    if any(a.permission == DENY and a.operation in (operation, Op.ALL) for a in mine):
        return False
    implied = {Op.READ, Op.WRITE, Op.DELETE, Op.ALTER} if operation == Op.DESCRIBE else set()
    if any(a.permission == ALLOW and a.operation in {operation, Op.ALL, *implied} for a in mine):
        return True
    return not on_resource and everyone


acl_strategy = st.builds(
    lambda name, op, principal, permission, pattern: AclBinding(
        TOPIC, name, pattern, principal, "*", op, permission
    ),
    st.sampled_from([*NAMES, "*"]),
    st.sampled_from([Op.READ, Op.WRITE, Op.DESCRIBE, Op.ALL, Op.CREATE]),
    st.sampled_from(PRINCIPALS),
    st.sampled_from([ALLOW, DENY]),
    st.sampled_from([LITERAL, PREFIXED]),
).filter(lambda a: not (a.pattern_type == PREFIXED and a.resource_name == "*"))


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    acls=st.lists(acl_strategy, max_size=6),
    everyone=st.booleans(),
    principal=st.sampled_from(["User:alice", "User:bob"]),
    named=st.lists(st.sampled_from([*NAMES, "zz"]), min_size=1, max_size=4, unique=True),
)
def test_handlers_answer_as_the_reference_model(
    start_admin_broker: Any,
    acls: list[AclBinding],
    everyone: bool,
    principal: str,
    named: list[str],
) -> None:
    broker = _model_broker(start_admin_broker)
    broker.authorizer = Authorizer(acls, allow_everyone_if_no_acl_found=everyone)
    who = KafkaPrincipal.user(principal.split(":", 1)[1])

    def allowed(op: AclOperation, name: str) -> bool:
        return reference_allows(acls, principal, op, name, everyone)

    def expected(operation: AclOperation) -> dict[str, int]:
        """Per named topic: denied first, then whether it exists (NAMES do, "zz" not)."""
        return {
            n: (
                E.TOPIC_AUTHORIZATION_FAILED
                if not allowed(operation, n)
                else E.NONE
                if n in NAMES
                else E.UNKNOWN_TOPIC_OR_PARTITION
            )
            for n in named
        }

    every = send(broker, who, ApiKey.METADATA, 12, metadata_request(12, None))
    assert sorted(t.name for t in every.topics) == [n for n in NAMES if allowed(Op.DESCRIBE, n)]
    request = metadata_request(12, named, allow_auto_topic_creation=False)
    answered = send(broker, who, ApiKey.METADATA, 12, request).topics
    assert {t.name: t.error_code for t in answered} == expected(Op.DESCRIBE)

    batches = {n: {0: make_batch()} for n in named}
    produced = send(broker, who, ApiKey.PRODUCE, 9, produce_request(9, batches))
    assert produce_errors(produced) == expected(Op.WRITE)

    request = fetch_request(broker, 12, [Want(n) for n in named], max_wait_ms=0)
    fetched = send(broker, who, ApiKey.FETCH, 12, request)
    assert {t.topic: t.partitions[0].error_code for t in fetched.responses} == expected(Op.READ)

    listed = {}
    for n in named:
        [topic] = send(broker, who, ApiKey.LIST_OFFSETS, 7, list_offsets_request(n)).topics
        listed[n] = topic.partitions[0].error_code
    assert listed == expected(Op.DESCRIBE)


_MODEL_BROKERS: dict[int, Broker] = {}


def _model_broker(start_admin_broker: Any) -> Broker:
    """One broker with the topics of NAMES per test (hypothesis runs many examples in one
    test; each example sets its own authorizer)."""
    key = id(start_admin_broker)
    if key not in _MODEL_BROKERS:
        _MODEL_BROKERS.clear()
        broker = start_admin_broker(AUTHZ)
        topics(broker, *NAMES)
        _MODEL_BROKERS[key] = broker
    return _MODEL_BROKERS[key]


# -- Transactions ----------------------------------------------------------------------


def test_transaction_apis_check_the_transactional_id_group_and_topics(
    start_admin_broker: Any,
) -> None:
    from .test_transactions_api import CONFIG, add_errors, add_request, init_request
    from .test_transactions_api import running as with_coordinators

    async def scenario() -> None:
        # The coordinators' harness readies their topics as User:ANONYMOUS.
        harness = {**AUTHZ, **CONFIG, "super.users": "User:admin;User:ANONYMOUS"}
        async with with_coordinators(start_admin_broker(harness)) as broker:
            topics(broker, "secret")
            grant(
                broker,
                acl(TXN, "tx-a", Op.WRITE),
                acl(TOPIC, "t", Op.WRITE),
                acl(TOPIC, "t", Op.READ),
                acl(GROUP, "g", Op.READ),
            )
            init = await as_user(broker, ALICE, ApiKey.INIT_PRODUCER_ID, 4, init_request(4, "tx-a"))
            assert init.error_code == E.NONE
            pid, epoch = init.producer_id, init.producer_epoch
            refused = await as_user(
                broker, BOB, ApiKey.INIT_PRODUCER_ID, 4, init_request(4, "tx-a")
            )
            assert refused.error_code == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            await as_user(broker, ADMIN, ApiKey.INIT_PRODUCER_ID, 4, init_request(4, "tx-b"))

            both = add_request(3, "tx-a", pid, epoch, {"t": [0], "secret": [0]})
            answer = await as_user(broker, ALICE, ApiKey.ADD_PARTITIONS_TO_TXN, 3, both)
            assert add_errors(answer) == {
                ("t", 0): E.OPERATION_NOT_ATTEMPTED,
                ("secret", 0): E.TOPIC_AUTHORIZATION_FAILED,
            }
            by_bob = await as_user(broker, BOB, ApiKey.ADD_PARTITIONS_TO_TXN, 3, both)
            assert set(add_errors(by_bob).values()) == {E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}
            mine = add_request(3, "tx-a", pid, epoch, {"t": [0]})
            added = await as_user(broker, ALICE, ApiKey.ADD_PARTITIONS_TO_TXN, 3, mine)
            assert add_errors(added) == {("t", 0): E.NONE}
            # v4 is what brokers send each other: ClusterAction.
            verify = add_request(4, "tx-a", pid, epoch, {"t": [0]})
            assert (
                await as_user(broker, ALICE, ApiKey.ADD_PARTITIONS_TO_TXN, 4, verify)
            ).error_code == E.CLUSTER_AUTHORIZATION_FAILED

            module = schema("add_offsets_to_txn", 3)

            def add_offsets(group: str) -> Any:
                return module.AddOffsetsToTxnRequest(
                    transactional_id="tx-a", producer_id=pid, producer_epoch=epoch, group_id=group
                )

            denied = await as_user(broker, ALICE, ApiKey.ADD_OFFSETS_TO_TXN, 3, add_offsets("h"))
            assert denied.error_code == E.GROUP_AUTHORIZATION_FAILED
            done = await as_user(broker, ALICE, ApiKey.ADD_OFFSETS_TO_TXN, 3, add_offsets("g"))
            assert done.error_code == E.NONE

            described = schema("describe_transactions", 0).DescribeTransactionsRequest(
                transactional_ids=("tx-a", "tx-b")
            )
            a, b = (
                await as_user(broker, ALICE, ApiKey.DESCRIBE_TRANSACTIONS, 0, described)
            ).transaction_states
            assert (a.error_code, a.transaction_state) == (E.NONE, "Ongoing")
            # __consumer_offsets is in the transaction too, but Alice may not describe it.
            assert [t.topic for t in a.topics] == ["t"]
            assert b.error_code == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            listing = schema("list_transactions", 0).ListTransactionsRequest(
                state_filters=(), producer_id_filters=()
            )
            listed = await as_user(broker, ALICE, ApiKey.LIST_TRANSACTIONS, 0, listing)
            assert [t.transactional_id for t in listed.transaction_states] == ["tx-a"]
            everything = await as_user(broker, ADMIN, ApiKey.LIST_TRANSACTIONS, 0, listing)
            assert sorted(t.transactional_id for t in everything.transaction_states) == [
                "tx-a",
                "tx-b",
            ]

            end = schema("end_txn", 3).EndTxnRequest(
                transactional_id="tx-a", producer_id=pid, producer_epoch=epoch, committed=False
            )
            assert (
                await as_user(broker, BOB, ApiKey.END_TXN, 3, end)
            ).error_code == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            assert (await as_user(broker, ALICE, ApiKey.END_TXN, 3, end)).error_code == E.NONE

    asyncio.run(scenario())


# -- Cluster-wide and broker-to-broker APIs --------------------------------------------


def test_cluster_apis_need_their_cluster_operation(start_admin_broker: Any) -> None:
    broker = start_admin_broker(AUTHZ)
    topics(broker, "orders")
    grant(broker, acl(TOPIC, "orders", Op.READ))

    module = schema("describe_log_dirs", 4)
    logs = module.DescribeLogDirsRequest(topics=None)
    assert send(broker, ALICE, ApiKey.DESCRIBE_LOG_DIRS, 4, logs).error_code == (
        E.CLUSTER_AUTHORIZATION_FAILED
    )
    assert send(broker, ADMIN, ApiKey.DESCRIBE_LOG_DIRS, 4, logs).results

    scram = schema("describe_user_scram_credentials", 0).DescribeUserScramCredentialsRequest(
        users=None
    )
    assert send(broker, ALICE, ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, scram).error_code == (
        E.CLUSTER_AUTHORIZATION_FAILED
    )

    markers = schema("write_txn_markers", 1)
    request = markers.WriteTxnMarkersRequest(
        markers=(
            markers.WritableTxnMarker(
                producer_id=7,
                producer_epoch=0,
                transaction_result=True,
                topics=(markers.WritableTxnMarkerTopic(name="orders", partition_indexes=(0,)),),
                coordinator_epoch=0,
            ),
        )
    )
    [marker] = send(broker, ALICE, ApiKey.WRITE_TXN_MARKERS, 1, request).markers
    assert marker.topics[0].partitions[0].error_code == E.CLUSTER_AUTHORIZATION_FAILED
    assert stored_batches(broker, "orders") == []

    # A consumer's OffsetForLeaderEpoch: Describe on the topic (KIP-320).
    epochs = schema("offset_for_leader_epoch", 4)
    asked = epochs.OffsetForLeaderEpochRequest(
        replica_id=-2,
        topics=(
            epochs.OffsetForLeaderTopic(
                topic="orders",
                partitions=(
                    epochs.OffsetForLeaderPartition(
                        partition=0, current_leader_epoch=-1, leader_epoch=0
                    ),
                ),
            ),
        ),
    )
    [mine] = send(broker, ALICE, ApiKey.OFFSET_FOR_LEADER_EPOCH, 4, asked).topics
    assert mine.partitions[0].error_code == E.NONE
    [theirs] = send(broker, BOB, ApiKey.OFFSET_FOR_LEADER_EPOCH, 4, asked).topics
    assert theirs.partitions[0].error_code == E.TOPIC_AUTHORIZATION_FAILED

    deletion = schema("delete_records", 2)
    delete = deletion.DeleteRecordsRequest(
        topics=(
            deletion.DeleteRecordsTopic(
                name="orders",
                partitions=(deletion.DeleteRecordsPartition(partition_index=0, offset=0),),
            ),
        ),
        timeout=timeout(),
    )
    [kept] = send(broker, ALICE, ApiKey.DELETE_RECORDS, 2, delete).topics
    assert kept.partitions[0].error_code == E.TOPIC_AUTHORIZATION_FAILED

    producers = schema("describe_producers", 0)
    described = producers.DescribeProducersRequest(
        topics=(producers.TopicRequest(name="orders", partition_indexes=(0,)),)
    )
    [visible] = send(broker, ALICE, ApiKey.DESCRIBE_PRODUCERS, 0, described).topics
    assert visible.partitions[0].error_code == E.NONE
    [hidden] = send(broker, BOB, ApiKey.DESCRIBE_PRODUCERS, 0, described).topics
    assert hidden.partitions[0].error_code == E.TOPIC_AUTHORIZATION_FAILED


# -- Requests a quorum node forwards ---------------------------------------------------


def test_a_forwarded_request_carries_only_what_the_client_may_do(start_admin_broker: Any) -> None:
    """The active controller sees the forwarding node's principal, so the node answers the
    client's denied items itself and forwards only the rest (quorum.py's forwarding)."""
    from tidelog.broker.authorization import answer_forwarded

    broker = start_admin_broker(AUTHZ)
    grant(broker, acl(TOPIC, "team-", Op.CREATE, pattern=PREFIXED))
    forwarded: list[Any] = []

    async def to_controller(ctx: Any, request: Any) -> Any:
        # What the active controller does with it: the handler, as the (super user) node.
        forwarded.append(request)
        node = context(broker, ApiKey(ctx.header.api_key), ctx.api_version, principal=ADMIN)
        return await HANDLERS[ApiKey(ctx.header.api_key)](node, request)

    def forward(principal: KafkaPrincipal, api_key: ApiKey, version: int, request: Any) -> Any:
        ctx = context(broker, api_key, version, principal=principal)
        response = asyncio.run(
            answer_forwarded(ctx, api_key, request, HANDLERS[api_key], to_controller)
        )
        frame = encode_response(ctx.header, response)
        return decode_response(
            memoryview(frame)[4:], api_key=int(api_key), api_version=version, correlation_id=1
        )[1]

    request = create_topics_request(7, [{"name": "team-a"}, {"name": "ops"}, {"name": "team-b"}])
    answer = forward(ALICE, ApiKey.CREATE_TOPICS, 7, request)
    assert [(t.name, t.error_code) for t in answer.topics] == [
        ("team-a", E.NONE),
        ("ops", E.TOPIC_AUTHORIZATION_FAILED),
        ("team-b", E.NONE),
    ]
    [sent] = forwarded
    assert [t.name for t in sent.topics] == ["team-a", "team-b"]
    assert broker.image.topic("ops") is None

    # Everything denied: nothing goes to the controller; nothing denied: all of it goes.
    forwarded.clear()
    only_ops = create_topics_request(7, [{"name": "ops"}])
    [refused] = forward(BOB, ApiKey.CREATE_TOPICS, 7, only_ops).topics
    assert refused.error_code == E.TOPIC_AUTHORIZATION_FAILED
    acls = create_acls_request("ops")
    [result] = forward(ALICE, ApiKey.CREATE_ACLS, 3, acls).results
    assert result.error_code == E.CLUSTER_AUTHORIZATION_FAILED
    assert forwarded == []
    [created] = forward(ADMIN, ApiKey.CREATE_ACLS, 3, acls).results
    assert created.error_code == E.NONE
    assert forwarded == [acls]


def test_client_quotas_need_the_cluster_configs_permissions_also_when_forwarded(
    start_admin_broker: Any,
) -> None:
    """DescribeClientQuotas needs DescribeConfigs on the cluster, AlterClientQuotas
    AlterConfigs; a node that forwards AlterClientQuotas checks the client before it goes
    to the controller (which would see the node's principal)."""
    from tidelog.broker.authorization import answer_forwarded

    broker = start_admin_broker(AUTHZ)
    quotas = schema("alter_client_quotas", 1)
    change = quotas.AlterClientQuotasRequest(
        entries=(
            quotas.EntryData(
                entity=(quotas.EntityData(entity_type="user", entity_name="alice"),),
                ops=(quotas.OpData(key="producer_byte_rate", value=1e9, remove=False),),
            ),
        ),
        validate_only=False,
    )
    forwarded: list[Any] = []

    async def to_controller(ctx: Any, request: Any) -> Any:
        forwarded.append(request)
        node = context(broker, ApiKey.ALTER_CLIENT_QUOTAS, 1, principal=ADMIN)
        return await HANDLERS[ApiKey.ALTER_CLIENT_QUOTAS](node, request)

    def forward(principal: KafkaPrincipal) -> Any:
        ctx = context(broker, ApiKey.ALTER_CLIENT_QUOTAS, 1, principal=principal)
        local = HANDLERS[ApiKey.ALTER_CLIENT_QUOTAS]
        return asyncio.run(
            answer_forwarded(ctx, ApiKey.ALTER_CLIENT_QUOTAS, change, local, to_controller)
        )

    describe = schema("describe_client_quotas", 1)
    everything = describe.DescribeClientQuotasRequest(components=(), strict=False)
    denied = send(broker, ALICE, ApiKey.DESCRIBE_CLIENT_QUOTAS, 1, everything)
    assert denied.error_code == E.CLUSTER_AUTHORIZATION_FAILED and denied.entries is None
    [refused] = forward(ALICE).entries
    assert refused.error_code == E.CLUSTER_AUTHORIZATION_FAILED
    assert forwarded == [] and not broker.image.client_quotas

    # DescribeConfigs alone lets alice read quotas, not change them.
    grant(broker, acl(CLUSTER, "kafka-cluster", Op.DESCRIBE_CONFIGS))
    assert send(broker, ALICE, ApiKey.DESCRIBE_CLIENT_QUOTAS, 1, everything).entries == ()
    [refused] = forward(ALICE).entries
    assert refused.error_code == E.CLUSTER_AUTHORIZATION_FAILED and forwarded == []

    grant(broker, acl(CLUSTER, "kafka-cluster", Op.ALTER_CONFIGS))
    [done] = forward(ALICE).entries
    assert done.error_code == E.NONE and forwarded == [change]
    [entry] = send(broker, ALICE, ApiKey.DESCRIBE_CLIENT_QUOTAS, 1, everything).entries
    assert [(e.entity_type, e.entity_name) for e in entry.entity] == [("user", "alice")]
    assert [(v.key, v.value) for v in entry.values] == [("producer_byte_rate", 1e9)]


def test_leadership_and_reassignment_apis_need_the_cluster(start_admin_broker: Any) -> None:
    broker = start_admin_broker(AUTHZ)
    topics(broker, "orders")
    elect = schema("elect_leaders", 2)
    election = elect.ElectLeadersRequest(
        election_type=0,
        topic_partitions=(elect.TopicPartitions(topic="orders", partitions=(0,)),),
        timeout=timeout(),
    )
    refused = send(broker, ALICE, ApiKey.ELECT_LEADERS, 2, election)
    assert refused.error_code == E.CLUSTER_AUTHORIZATION_FAILED
    [topic] = refused.replica_election_results
    assert topic.partition_result[0].error_code == E.CLUSTER_AUTHORIZATION_FAILED
    assert send(broker, ADMIN, ApiKey.ELECT_LEADERS, 2, election).error_code == E.NONE

    alter = schema("alter_partition_reassignments", 1)
    moves = alter.AlterPartitionReassignmentsRequest(
        timeout=timeout(),
        allow_replication_factor_change=False,
        topics=(
            alter.ReassignableTopic(
                name="orders", partitions=(alter.ReassignablePartition(partition_index=0),)
            ),
        ),
    )
    moved = send(broker, ALICE, ApiKey.ALTER_PARTITION_REASSIGNMENTS, 1, moves)
    assert (moved.error_code, moved.responses) == (E.CLUSTER_AUTHORIZATION_FAILED, ())
    listing = schema("list_partition_reassignments", 0).ListPartitionReassignmentsRequest(
        timeout=timeout(), topics=None
    )
    assert send(broker, ALICE, ApiKey.LIST_PARTITION_REASSIGNMENTS, 0, listing).error_code == (
        E.CLUSTER_AUTHORIZATION_FAILED
    )
    grant(broker, acl(CLUSTER, "kafka-cluster", Op.DESCRIBE))
    assert send(broker, ALICE, ApiKey.LIST_PARTITION_REASSIGNMENTS, 0, listing).error_code == (
        E.NONE
    )

    isr = schema("alter_partition", 3).AlterPartitionRequest(broker_id=1, topics=())
    from tidelog.broker.handlers.registry import CONTROLLER_HANDLERS

    ctx = context(broker, ApiKey.ALTER_PARTITION, 3, principal=ALICE)
    answer = asyncio.run(CONTROLLER_HANDLERS[ApiKey.ALTER_PARTITION](ctx, isr))
    assert answer.error_code == E.CLUSTER_AUTHORIZATION_FAILED
