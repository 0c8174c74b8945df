"""The controller's partition operations, sans-io over a committed image of several
brokers: AlterPartition (controller/isr.py), elections and unclean election
(controller/elections.py, leaders.py), reassignment (controller/reassignment.py), and the
controller's rebalance timer. Every rule is checked on the records the operation
commits, replayed into the image."""

from __future__ import annotations

import logging
import uuid

import pytest
from metadata_helpers import Cluster, ControllerFactory, FakeClock

from tidelog.metadata.controller import NewTopic, topics
from tidelog.metadata.controller.cluster import (
    ClusterControl,
    HeartbeatRequest,
    RegistrationRequest,
)
from tidelog.metadata.controller.elections import (
    ElectionType,
    elect_leaders,
    imbalanced_partitions,
    rebalance_leaders,
)
from tidelog.metadata.controller.isr import (
    AlterPartitionItem,
    AlterPartitionRequest,
    IsrMember,
    alter_partition,
)
from tidelog.metadata.controller.reassignment import (
    ReassignmentRequest,
    alter_partition_reassignments,
    list_partition_reassignments,
)
from tidelog.metadata.image import PartitionImage
from tidelog.metadata.image_records import image_from_snapshot, snapshot_records
from tidelog.metadata.records import (
    BrokerEndpoint,
    ConfigRecord,
    PartitionChangeRecord,
    PartitionRecord,
)
from tidelog.protocol import ErrorCode

TOPIC_RESOURCE = 2


def make_topic(cluster: Cluster, name: str, assignment: dict[int, tuple[int, ...]]) -> uuid.UUID:
    (result,) = cluster.commit(
        topics.create_topics(cluster.view(), [NewTopic(name, assignments=assignment)])
    )
    assert result.error.ok, result.error
    assert result.topic_id is not None
    return result.topic_id


def part(cluster: Cluster, name: str, index: int = 0) -> PartitionImage:
    found = cluster.image.partition(name, index)
    assert found is not None
    return found


def set_partition(
    cluster: Cluster,
    name: str,
    index: int,
    *,
    leader: int | None = None,
    isr: tuple[int, ...] | None = None,
) -> None:
    topic_id = cluster.image.topics_by_name[name].topic_id
    cluster.apply(PartitionChangeRecord(topic_id, index, leader, isr))


# -- AlterPartition ----------------------------------------------------------------------------


def isr_request(
    cluster: Cluster,
    name: str,
    isr: tuple[int, ...],
    *,
    broker: int | None = None,
    leader_epoch: int | None = None,
    partition_epoch: int | None = None,
    member_epochs: dict[int, int] | None = None,
) -> AlterPartitionRequest:
    p = part(cluster, name)
    sender = p.leader if broker is None else broker
    epochs = member_epochs or {}
    return AlterPartitionRequest(
        sender,
        cluster.image.brokers[sender].epoch,
        (
            AlterPartitionItem(
                cluster.image.topics_by_name[name].topic_id,
                0,
                p.leader_epoch if leader_epoch is None else leader_epoch,
                p.partition_epoch if partition_epoch is None else partition_epoch,
                tuple(IsrMember(b, epochs.get(b, -1)) for b in isr),
            ),
        ),
    )


def test_alter_partition_shrinks_and_expands_the_isr() -> None:
    cluster = Cluster(3)
    make_topic(cluster, "t", {0: (1, 2, 3)})
    before = part(cluster, "t")
    reply = cluster.commit(alter_partition(cluster.view(), isr_request(cluster, "t", (1, 2))))
    (result,) = reply.results
    after = part(cluster, "t")
    assert reply.error.ok and result.error.ok
    assert after.isr == (1, 2) and after.partition_epoch == before.partition_epoch + 1
    assert after.leader_epoch == before.leader_epoch
    assert (result.leader, result.leader_epoch, result.partition_epoch, result.isr) == (
        1,
        after.leader_epoch,
        after.partition_epoch,
        (1, 2),
    )
    cluster.commit(alter_partition(cluster.view(), isr_request(cluster, "t", (1, 2, 3))))
    assert part(cluster, "t").isr == (1, 2, 3)


def test_alter_partition_without_change_writes_nothing() -> None:
    cluster = Cluster(2)
    make_topic(cluster, "t", {0: (1, 2)})
    result = alter_partition(cluster.view(), isr_request(cluster, "t", (1, 2)))
    assert result.records == [] and result.response.results[0].error.ok


def test_stale_broker_epoch_refuses_the_whole_request() -> None:
    cluster = Cluster(2)
    make_topic(cluster, "t", {0: (1, 2)})
    request = isr_request(cluster, "t", (1,))
    stale = AlterPartitionRequest(1, request.broker_epoch - 1, request.items)
    reply = alter_partition(cluster.view(), stale)
    assert reply.response.error.code is ErrorCode.STALE_BROKER_EPOCH
    assert reply.records == [] and reply.response.results == ()


def test_alter_partition_checks_in_kafkas_order() -> None:
    cluster = Cluster(4)
    make_topic(cluster, "t", {0: (1, 2, 3)})
    p = part(cluster, "t")
    set_partition(cluster, "t", 0, isr=(1, 2, 3))  # partition epoch 1

    def code(request: AlterPartitionRequest) -> ErrorCode:
        return alter_partition(cluster.view(), request).response.results[0].error.code

    assert code(isr_request(cluster, "t", (1,), partition_epoch=5)) is ErrorCode.NOT_CONTROLLER
    assert code(isr_request(cluster, "t", (2,), broker=2)) is ErrorCode.INVALID_REQUEST
    cluster.apply(
        PartitionChangeRecord(cluster.image.topics_by_name["t"].topic_id, 0, leader=2),
        PartitionChangeRecord(cluster.image.topics_by_name["t"].topic_id, 0, leader=1),
    )
    assert part(cluster, "t").leader_epoch == p.leader_epoch + 2
    assert (
        code(isr_request(cluster, "t", (1,), leader_epoch=p.leader_epoch))
        is ErrorCode.FENCED_LEADER_EPOCH
    )
    assert (
        code(isr_request(cluster, "t", (1,), partition_epoch=1)) is ErrorCode.INVALID_UPDATE_VERSION
    )
    assert code(isr_request(cluster, "t", (1, 1))) is ErrorCode.INVALID_REQUEST
    assert code(isr_request(cluster, "t", (1, 4))) is ErrorCode.INVALID_REQUEST
    assert code(isr_request(cluster, "t", (2, 3))) is ErrorCode.INVALID_REQUEST
    cluster.set_fenced(3)
    assert code(isr_request(cluster, "t", (1, 3))) is ErrorCode.INELIGIBLE_REPLICA
    epoch_of_2 = cluster.image.brokers[2].epoch
    stale_member = isr_request(cluster, "t", (1, 2), member_epochs={2: epoch_of_2 + 1})
    assert code(stale_member) is ErrorCode.INELIGIBLE_REPLICA
    assert code(isr_request(cluster, "t", (1, 2), member_epochs={2: epoch_of_2})) is ErrorCode.NONE


def test_unknown_topic_id_and_partition() -> None:
    cluster = Cluster(1)
    topic_id = make_topic(cluster, "t", {0: (1,)})
    epoch = cluster.image.brokers[1].epoch
    items = (
        AlterPartitionItem(uuid.UUID(int=99), 0, 0, 0, (IsrMember(1),)),
        AlterPartitionItem(topic_id, 7, 0, 0, (IsrMember(1),)),
    )
    reply = alter_partition(cluster.view(), AlterPartitionRequest(1, epoch, items)).response
    assert [r.error.code for r in reply.results] == [
        ErrorCode.UNKNOWN_TOPIC_ID,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ]


# -- unclean election on fencing and unfencing ---------------------------------------------------


def test_fencing_the_last_isr_member_leaves_no_leader_by_default() -> None:
    cluster = Cluster(2)
    make_topic(cluster, "t", {0: (1, 2)})
    cluster.commit(alter_partition(cluster.view(), isr_request(cluster, "t", (1,))))
    control = ClusterControl(9000)
    registration = cluster.image.brokers[1]
    cluster.commit(
        control.heartbeat(
            cluster.view(),
            HeartbeatRequest(1, registration.epoch, cluster.image.offset, want_fence=True),
            0,
        )
    )
    assert (part(cluster, "t").leader, part(cluster, "t").isr) == (-1, (1,))


@pytest.mark.parametrize("where", ["topic", "broker"])
def test_unclean_election_when_enabled_elects_a_live_replica_and_warns(
    where: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = {"unclean.leader.election.enable": "true"} if where == "broker" else {}
    cluster = Cluster(2, config=config)
    make_topic(cluster, "t", {0: (1, 2)})
    if where == "topic":
        cluster.apply(ConfigRecord(TOPIC_RESOURCE, "t", "unclean.leader.election.enable", "true"))
    cluster.commit(alter_partition(cluster.view(), isr_request(cluster, "t", (1,))))
    control = ClusterControl(9000)
    registration = cluster.image.brokers[1]
    with caplog.at_level(logging.WARNING):
        cluster.commit(
            control.heartbeat(
                cluster.view(),
                HeartbeatRequest(1, registration.epoch, cluster.image.offset, want_fence=True),
                0,
            )
        )
    assert (part(cluster, "t").leader, part(cluster, "t").isr) == (2, (2,))
    assert "unclean leader election" in caplog.text


# -- ElectLeaders --------------------------------------------------------------------------------


def test_preferred_election() -> None:
    cluster = Cluster(3)
    make_topic(cluster, "t", {0: (1, 2, 3), 1: (2, 3, 1), 2: (3, 1, 2)})
    set_partition(cluster, "t", 0, leader=2)
    set_partition(cluster, "t", 2, leader=1, isr=(1, 2))
    result = elect_leaders(
        cluster.view(), ElectionType.PREFERRED, [("t", 0), ("t", 1), ("t", 2), ("u", 0), ("t", 0)]
    )
    assert [(r.partition, r.error.code) for r in cluster.commit(result)] == [
        (0, ErrorCode.NONE),
        (1, ErrorCode.ELECTION_NOT_NEEDED),
        (2, ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE),
        (0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
    ]
    assert part(cluster, "t", 0).leader == 1
    assert part(cluster, "t", 2).leader == 1


def test_preferred_election_of_all_partitions_leaves_out_those_not_needed() -> None:
    cluster = Cluster(2)
    make_topic(cluster, "t", {0: (1, 2), 1: (2, 1)})
    set_partition(cluster, "t", 1, leader=1)
    results = cluster.commit(elect_leaders(cluster.view(), ElectionType.PREFERRED, None))
    assert [(r.topic, r.partition, r.error.code) for r in results] == [("t", 1, ErrorCode.NONE)]
    assert part(cluster, "t", 1).leader == 2
    assert cluster.commit(elect_leaders(cluster.view(), ElectionType.PREFERRED, None)) == []


def test_unclean_election_on_demand() -> None:
    cluster = Cluster(3)
    make_topic(cluster, "t", {0: (1, 2, 3), 1: (1, 2, 3), 2: (1, 2, 3)})
    set_partition(cluster, "t", 1, leader=-1, isr=(1,))
    set_partition(cluster, "t", 2, leader=-1, isr=(1,))
    cluster.set_fenced(1)
    cluster.set_fenced(3)
    # Partition 2: every replica fenced but 2 ... which is then fenced too below.
    results = cluster.commit(
        elect_leaders(cluster.view(), ElectionType.UNCLEAN, [("t", 0), ("t", 1)])
    )
    assert [r.error.code for r in results] == [ErrorCode.ELECTION_NOT_NEEDED, ErrorCode.NONE]
    assert (part(cluster, "t", 1).leader, part(cluster, "t", 1).isr) == (2, (2,))
    cluster.set_fenced(2)
    (none_left,) = elect_leaders(cluster.view(), ElectionType.UNCLEAN, [("t", 2)]).response
    assert none_left.error.code is ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE


def test_unclean_election_prefers_a_clean_leader() -> None:
    cluster = Cluster(3)
    make_topic(cluster, "t", {0: (1, 2, 3)})
    set_partition(cluster, "t", 0, leader=-1, isr=(1, 3))
    cluster.set_fenced(1)
    cluster.commit(elect_leaders(cluster.view(), ElectionType.UNCLEAN, [("t", 0)]))
    assert (part(cluster, "t").leader, part(cluster, "t").isr) == (3, (1, 3))


# -- automatic rebalance ---------------------------------------------------------------------


def test_rebalance_moves_back_leaderships_over_the_imbalance_percentage() -> None:
    cluster = Cluster(2, config={"leader.imbalance.per.broker.percentage": "40"})
    make_topic(cluster, "t", {0: (1, 2), 1: (1, 2), 2: (1, 2), 3: (2, 1), 4: (2, 1)})
    # Broker 1 lost 1 of its 3 (33%: under 40%); broker 2 lost 1 of 2 (50%: over).
    set_partition(cluster, "t", 0, leader=2)
    set_partition(cluster, "t", 3, leader=1)
    assert imbalanced_partitions(cluster.view()) == [("t", 3)]
    cluster.commit(rebalance_leaders(cluster.view()))
    assert part(cluster, "t", 3).leader == 2 and part(cluster, "t", 0).leader == 2
    assert imbalanced_partitions(cluster.view()) == []


def test_rebalance_skips_preferred_replicas_out_of_the_isr_or_fenced() -> None:
    cluster = Cluster(2, config={"leader.imbalance.per.broker.percentage": "0"})
    make_topic(cluster, "t", {0: (1, 2), 1: (1, 2)})
    set_partition(cluster, "t", 0, leader=2, isr=(2,))
    set_partition(cluster, "t", 1, leader=2)
    assert imbalanced_partitions(cluster.view()) == [("t", 1)]
    cluster.set_fenced(1)
    assert imbalanced_partitions(cluster.view()) == []


def test_controller_tick_rebalances_every_interval(start_controller: ControllerFactory) -> None:
    controller = start_controller(**{"leader.imbalance.check.interval.seconds": "10"})
    controller.create_topics([NewTopic("t", 1, 1)])
    now = 1_000_000
    controller.tick(now)
    assert controller.next_deadline(now) == now + 10_000
    # One broker leads every partition it prefers: nothing to do, nothing written.
    offset = controller.image.offset
    controller.tick(now + 10_000)
    assert controller.image.offset == offset
    assert controller.next_deadline(now + 10_000) == now + 20_000


def test_controller_tick_moves_a_leadership_back_to_its_preferred_broker(
    start_controller: ControllerFactory, clock: FakeClock
) -> None:
    controller = start_controller(
        **{
            "leader.imbalance.check.interval.seconds": "10",
            "broker.session.timeout.ms": "600000",
        }
    )
    endpoint = BrokerEndpoint("PLAINTEXT", "127.0.0.1", 9002, "PLAINTEXT")
    registration = RegistrationRequest(
        2, controller.image.cluster_id, uuid.UUID(int=2), (endpoint,), None
    )
    epoch = controller.register_broker(registration).broker_epoch
    assert not controller.heartbeat(HeartbeatRequest(2, epoch, controller.image.offset)).is_fenced
    (created,) = controller.create_topics([NewTopic("t", assignments={0: (2, 1)})])
    assert created.error.ok and created.topic_id is not None

    def current() -> PartitionImage:
        found = controller.image.partition("t", 0)
        assert found is not None
        return found

    assert current().leader == 2
    # Broker 2 is fenced and comes back: broker 1 keeps the leadership it took over.
    controller.heartbeat(HeartbeatRequest(2, epoch, controller.image.offset, want_fence=True))
    assert current().leader == 1
    controller.heartbeat(HeartbeatRequest(2, epoch, controller.image.offset))
    controller.alter_partition(
        AlterPartitionRequest(
            1,
            controller.broker_epoch,
            (
                AlterPartitionItem(
                    created.topic_id,
                    0,
                    current().leader_epoch,
                    current().partition_epoch,
                    (IsrMember(1), IsrMember(2)),
                ),
            ),
        )
    )
    assert current().isr == (1, 2)
    now = clock.now
    controller.tick(now)
    assert current().leader == 1
    controller.tick(now + 10_000)
    assert current().leader == 2


# -- reassignment ------------------------------------------------------------------------------


def reassign(
    cluster: Cluster, name: str, index: int, replicas: tuple[int, ...] | None, **options: bool
) -> ErrorCode:
    (result,) = cluster.commit(
        alter_partition_reassignments(
            cluster.view(), [ReassignmentRequest(name, index, replicas)], **options
        )
    )
    return result.error.code


def test_reassignment_runs_until_the_target_is_in_sync() -> None:
    cluster = Cluster(4)
    make_topic(cluster, "t", {0: (1, 2, 3)})
    assert reassign(cluster, "t", 0, (2, 3, 4)) is ErrorCode.NONE
    p = part(cluster, "t")
    assert (p.replicas, p.adding_replicas, p.removing_replicas) == ((2, 3, 4, 1), (4,), (1,))
    assert p.leader == 1 and p.isr == (1, 2, 3)
    (ongoing,) = list_partition_reassignments(cluster.image, None)
    assert (ongoing.replicas, ongoing.adding_replicas, ongoing.removing_replicas) == (
        (2, 3, 4, 1),
        (4,),
        (1,),
    )
    # Broker 4 catches up: the leader adds it to the ISR, which completes the move.
    reply = cluster.commit(alter_partition(cluster.view(), isr_request(cluster, "t", (1, 2, 3, 4))))
    p = part(cluster, "t")
    assert (p.replicas, p.isr, p.adding_replicas, p.removing_replicas) == (
        (2, 3, 4),
        (2, 3, 4),
        (),
        (),
    )
    assert p.leader == 2
    (result,) = reply.results
    assert (result.leader, result.isr, result.leader_epoch) == (2, (2, 3, 4), p.leader_epoch)
    assert list_partition_reassignments(cluster.image, None) == []


def test_reassignment_within_the_isr_completes_at_once() -> None:
    cluster = Cluster(3)
    make_topic(cluster, "t", {0: (1, 2, 3)})
    assert reassign(cluster, "t", 0, (3, 2)) is ErrorCode.NONE
    p = part(cluster, "t")
    assert (p.replicas, p.isr, p.leader, p.reassigning) == ((3, 2), (2, 3), 3, False)
    offset = cluster.image.offset
    assert reassign(cluster, "t", 0, (3, 2)) is ErrorCode.NONE
    assert cluster.image.offset == offset  # the same replicas: nothing written


def test_cancel_returns_to_the_original_replicas() -> None:
    cluster = Cluster(4)
    make_topic(cluster, "t", {0: (1, 2)})
    assert reassign(cluster, "t", 0, None) is ErrorCode.NO_REASSIGNMENT_IN_PROGRESS
    assert reassign(cluster, "t", 0, (3, 4)) is ErrorCode.NONE
    # A second target replaces the first; the original set is still (1, 2).
    assert reassign(cluster, "t", 0, (2, 4)) is ErrorCode.NONE
    p = part(cluster, "t")
    assert (p.replicas, p.adding_replicas, p.removing_replicas) == ((2, 4, 1), (4,), (1,))
    assert reassign(cluster, "t", 0, None) is ErrorCode.NONE
    p = part(cluster, "t")
    # The original brokers, in the order the reassignment left them (as Kafka's revert).
    assert (p.replicas, p.isr, p.leader, p.reassigning) == ((2, 1), (1, 2), 1, False)


def test_reassignment_changes_the_replication_factor() -> None:
    cluster = Cluster(3)
    make_topic(cluster, "t", {0: (1,)})
    code = reassign(cluster, "t", 0, (1, 2), allow_replication_factor_change=False)
    assert code is ErrorCode.INVALID_REPLICATION_FACTOR
    assert reassign(cluster, "t", 0, (1, 2, 3)) is ErrorCode.NONE
    assert part(cluster, "t").adding_replicas == (2, 3)
    cluster.commit(alter_partition(cluster.view(), isr_request(cluster, "t", (1, 2, 3))))
    assert part(cluster, "t").replicas == (1, 2, 3) and not part(cluster, "t").reassigning
    assert cluster.image.topics_by_name["t"].replication_factor == 3


def test_invalid_reassignments() -> None:
    cluster = Cluster(2, max_replication_factor=None)
    make_topic(cluster, "t", {0: (1,)})
    assert reassign(cluster, "t", 0, ()) is ErrorCode.INVALID_REPLICA_ASSIGNMENT
    assert reassign(cluster, "t", 0, (1, 1)) is ErrorCode.INVALID_REPLICA_ASSIGNMENT
    assert reassign(cluster, "t", 0, (1, 9)) is ErrorCode.INVALID_REPLICA_ASSIGNMENT
    assert reassign(cluster, "t", 3, (1,)) is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert reassign(cluster, "u", 0, (1,)) is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    twice = alter_partition_reassignments(
        cluster.view(), [ReassignmentRequest("t", 0, (1,)), ReassignmentRequest("t", 0, (2,))]
    )
    assert [r.error.code for r in twice.response] == [ErrorCode.INVALID_REQUEST] * 2
    quorum = Cluster(2, max_replication_factor=1)
    make_topic(quorum, "t", {0: (1,)})
    assert reassign(quorum, "t", 0, (1, 2)) is ErrorCode.INVALID_REPLICATION_FACTOR
    assert reassign(quorum, "t", 0, (2,)) is ErrorCode.NONE


def test_list_reassignments_of_named_partitions() -> None:
    cluster = Cluster(3)
    make_topic(cluster, "t", {0: (1,), 1: (2,)})
    reassign(cluster, "t", 1, (3,))
    listed = list_partition_reassignments(cluster.image, [("t", [0, 1, 5]), ("nope", [0])])
    assert [(r.topic, r.partition, r.replicas) for r in listed] == [("t", 1, (3, 2))]


def test_a_reassignment_under_way_survives_a_snapshot() -> None:
    cluster = Cluster(3)
    make_topic(cluster, "t", {0: (1,)})
    reassign(cluster, "t", 0, (2, 3))
    image = cluster.image
    rebuilt = image_from_snapshot(
        snapshot_records(image), image.offset, 1, cluster_id=image.cluster_id
    )
    assert rebuilt.partition("t", 0) == part(cluster, "t")
    assert part(cluster, "t").adding_replicas == (2, 3)


def test_reassignment_fields_survive_replay_and_restatement() -> None:
    cluster = Cluster(3)
    topic_id = make_topic(cluster, "t", {0: (1,)})
    reassign(cluster, "t", 0, (2,))
    p = part(cluster, "t")
    restated = PartitionRecord(
        topic_id, 0, p.replicas, p.isr, p.leader, p.leader_epoch, p.partition_epoch, (2,), (1,)
    )
    cluster.apply(restated)
    assert part(cluster, "t") == p
