"""ElectLeaders and partition reassignment (AlterPartitionReassignments,
ListPartitionReassignments) from real clients against a real single-node `tidelog serve`.

One node means one replica per partition, which leads it: a preferred election is not
needed, a reassignment to the same broker completes at once, one to a broker that is not
registered is refused, and cancelling when nothing runs says so. Each client is checked
for the error it surfaces, and the partition is checked unchanged (leader, replicas) by
its Metadata afterwards. confluent-kafka (librdkafka) has no reassignment API, so it is
checked on elections only; kafka-python adds a third client for reassignments.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka import ElectionType, KafkaError
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from interop_broker import BrokerProcess, send_request
from java_harness import JavaClient, step
from kafka import KafkaAdminClient
from kafka import TopicPartition as KpTopicPartition
from kafka.errors import (
    ElectionNotNeededError,
    InvalidReplicationAssignmentError,
    NoReassignmentInProgressError,
)
from kio.schema.elect_leaders.v2.request import ElectLeadersRequest, TopicPartitions
from kio.static.primitive import i8, i32

from tidelog.protocol import ErrorCode

TIMEOUT_S = 30.0
NODE = 1  # the node id `tidelog serve` runs as by default


@pytest.fixture
def admin(broker: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


@pytest.fixture
def kp_admin(broker: BrokerProcess) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=30_000)
    yield client
    client.close()


def create(admin: AdminClient, topic: str, partitions: int = 2) -> None:
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(TIMEOUT_S)


def leaders_and_replicas(admin: AdminClient, topic: str) -> dict[int, tuple[int, list[int]]]:
    topics = admin.list_topics(topic, timeout=TIMEOUT_S).topics
    return {p.id: (p.leader, list(p.replicas)) for p in topics[topic].partitions.values()}


# -- confluent-kafka ---------------------------------------------------------------------------


def test_confluent_kafka_preferred_election_is_not_needed(
    admin: AdminClient, topic_name: str
) -> None:
    create(admin, topic_name)
    wanted = [CkTopicPartition(topic_name, 0), CkTopicPartition(topic_name, 1)]
    results = admin.elect_leaders(ElectionType.PREFERRED, wanted).result(TIMEOUT_S)
    errors = {tp.partition: error for tp, error in results.items()}
    assert set(errors) == {0, 1}
    for error in errors.values():
        assert isinstance(error, KafkaError)
        assert error.code() == KafkaError.ELECTION_NOT_NEEDED
    assert leaders_and_replicas(admin, topic_name) == {0: (NODE, [NODE]), 1: (NODE, [NODE])}


def test_confluent_kafka_unclean_election_and_unknown_partition(
    admin: AdminClient, topic_name: str
) -> None:
    create(admin, topic_name, 1)
    wanted = [CkTopicPartition(topic_name, 0), CkTopicPartition(topic_name, 9)]
    results = admin.elect_leaders(ElectionType.UNCLEAN, wanted).result(TIMEOUT_S)
    codes = {tp.partition: error.code() for tp, error in results.items() if error}
    assert codes == {
        0: KafkaError.ELECTION_NOT_NEEDED,
        9: KafkaError.UNKNOWN_TOPIC_OR_PART,
    }


def test_confluent_kafka_election_over_all_partitions_answers_none_needed(
    admin: AdminClient, topic_name: str
) -> None:
    create(admin, topic_name)
    # Every partition of the node is led by its preferred replica: nothing to report.
    assert admin.elect_leaders(ElectionType.PREFERRED, None).result(TIMEOUT_S) == {}


# -- the Java client ---------------------------------------------------------------------------


def test_java_client_elects_and_reassigns(
    java: JavaClient, admin: AdminClient, topic_name: str
) -> None:
    create(admin, topic_name)
    p0, p1 = f"{topic_name}-0", f"{topic_name}-1"
    elected, preferred_all, reassigned, after, cancelled = java.batch(
        step("elect-leaders", type="preferred", partitions=[p0, p1]),
        step("elect-leaders", type="preferred", partitions=None),
        step("reassignments", alter={p0: [NODE], p1: [NODE, 99]}, list="all"),
        step("reassignments", list=[p0, p1]),
        step("reassignments", alter={p0: None}),
    )
    assert elected == [{p0: "ElectionNotNeededException", p1: "ElectionNotNeededException"}]
    assert preferred_all == [{}]
    assert reassigned == [
        {"altered": {p0: None, p1: "InvalidReplicaAssignmentException"}, "listed": {}}
    ]
    assert after == [{"listed": {}}]
    assert cancelled == [{"altered": {p0: "NoReassignmentInProgressException"}}]
    assert leaders_and_replicas(admin, topic_name) == {0: (NODE, [NODE]), 1: (NODE, [NODE])}


def test_java_client_unclean_election_is_not_needed(
    java: JavaClient, admin: AdminClient, topic_name: str
) -> None:
    create(admin, topic_name, 1)
    result = java.one("elect-leaders", {"type": "unclean", "partitions": [f"{topic_name}-0"]})
    assert result == {f"{topic_name}-0": "ElectionNotNeededException"}


# -- kafka-python ----------------------------------------------------------------------------


def test_kafka_python_reassigns_lists_and_cancels(
    kp_admin: KafkaAdminClient, admin: AdminClient, topic_name: str
) -> None:
    create(admin, topic_name)
    p0, p1 = KpTopicPartition(topic_name, 0), KpTopicPartition(topic_name, 1)
    results = kp_admin.alter_partition_reassignments({p0: [NODE], p1: [7]})
    assert results == {p0: None, p1: InvalidReplicationAssignmentError}
    assert kp_admin.list_partition_reassignments() == {}
    assert kp_admin.list_partition_reassignments([p0, p1]) == {}
    assert kp_admin.alter_partition_reassignments({p0: None}) == {p0: NoReassignmentInProgressError}
    # kafka-python does not raise for ELECTION_NOT_NEEDED; the response carries it.
    response = kp_admin.elect_leaders(0, {topic_name: [0]})
    assert [
        (result.topic, p.partition_id, p.error_code)
        for result in response.replica_election_results
        for p in result.partition_result
    ] == [(topic_name, 0, ElectionNotNeededError.errno)]
    assert leaders_and_replicas(admin, topic_name) == {0: (NODE, [NODE]), 1: (NODE, [NODE])}


# -- by hand ---------------------------------------------------------------------------------


def test_an_unknown_election_type_is_an_invalid_request(
    broker: BrokerProcess, admin: AdminClient, topic_name: str
) -> None:
    create(admin, topic_name, 1)
    request = ElectLeadersRequest(
        election_type=i8(7),
        topic_partitions=(TopicPartitions(topic=topic_name, partitions=(i32(0),)),),
    )
    response = send_request(broker.host, broker.port, request)
    assert response.error_code == ErrorCode.INVALID_REQUEST.to_kio()
    ((result,),) = [r.partition_result for r in response.replica_election_results]
    assert (int(result.partition_id), result.error_code) == (0, ErrorCode.INVALID_REQUEST.to_kio())
