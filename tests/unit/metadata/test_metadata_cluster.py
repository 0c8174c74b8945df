"""Cluster membership on the controller: registration, heartbeats, fencing, controlled
shutdown, unregistration (metadata/controller/cluster.py), sans-io with a fake clock.

Most tests drive :class:`ClusterControl` against an image and commit its records the way
the controller does (append at the next offset, replay), so every rule is checked on the
records it writes; the last ones go through the real :class:`Controller` and its log.
"""

from __future__ import annotations

import random
import uuid
from pathlib import Path

import pytest
from metadata_helpers import ControllerFactory, FakeClock

from tidelog.metadata.configs import BrokerConfig
from tidelog.metadata.controller import ControllerResult, ControllerView, NewTopic, topics
from tidelog.metadata.controller.cluster import (
    ClusterControl,
    HeartbeatReply,
    HeartbeatRequest,
    RegistrationReply,
    RegistrationRequest,
)
from tidelog.metadata.errors import MetadataReplayError
from tidelog.metadata.image import MetadataImage
from tidelog.metadata.loader import MetadataLoader
from tidelog.metadata.records import (
    BrokerEndpoint,
    BrokerRegistrationChangeRecord,
    MetadataRecord,
    PartitionChangeRecord,
    RegisterBrokerRecord,
    UnregisterBrokerRecord,
    decode_record,
    encode_record,
)
from tidelog.protocol import ErrorCode

CLUSTER = "q1w2e3r4t5y6u7i8o9p0aa"
SESSION_MS = 9000
T0 = 1_000_000


def endpoint(broker_id: int) -> BrokerEndpoint:
    return BrokerEndpoint("PLAINTEXT", "127.0.0.1", 9000 + broker_id, "PLAINTEXT")


class Quorum:
    """An image, the controller's cluster control, and the committed log: what a
    controller does with an operation's result, without disk."""

    def __init__(self, session_ms: int = SESSION_MS) -> None:
        self.image = MetadataImage.empty(CLUSTER)
        self.control = ClusterControl(session_ms)
        self.config = BrokerConfig({"num.partitions": "1"})
        self.random = random.Random(7)
        self.log: list[tuple[int, MetadataRecord]] = []
        self.now = T0
        self.incarnations: dict[int, uuid.UUID] = {}

    def view(self) -> ControllerView:
        return ControllerView(
            self.image, self.config, self.config, self.random, next_offset=self.image.offset + 1
        )

    def commit(self, result: ControllerResult) -> object:  # type: ignore[type-arg]
        records = result.records
        if records:
            first = self.image.offset + 1
            entries = [(first + i, record) for i, record in enumerate(records)]
            self.image, _ = self.image.apply(entries)
            self.log.extend(entries)
        return result.response

    # -- operations ---------------------------------------------------------------------

    def register(
        self, broker_id: int, incarnation: uuid.UUID | None = None, cluster_id: str = CLUSTER
    ) -> RegistrationReply:
        if incarnation is None:
            incarnation = uuid.UUID(int=self.random.getrandbits(128), version=4)
        self.incarnations[broker_id] = incarnation
        request = RegistrationRequest(broker_id, cluster_id, incarnation, (endpoint(broker_id),))
        reply = self.commit(self.control.register_broker(self.view(), request, self.now))
        assert isinstance(reply, RegistrationReply)
        return reply

    def beat(
        self,
        broker_id: int,
        *,
        epoch: int | None = None,
        offset: int | None = None,
        want_fence: bool = False,
        want_shut_down: bool = False,
    ) -> HeartbeatReply:
        registration = self.image.brokers.get(broker_id)
        request = HeartbeatRequest(
            broker_id,
            epoch if epoch is not None else (registration.epoch if registration else -1),
            self.image.offset if offset is None else offset,
            want_fence,
            want_shut_down,
        )
        reply = self.commit(self.control.heartbeat(self.view(), request, self.now))
        assert isinstance(reply, HeartbeatReply)
        return reply

    def join(self, broker_id: int) -> int:
        """Register and unfence ``broker_id``; its epoch."""
        reply = self.register(broker_id)
        assert reply.error.ok
        assert not self.beat(broker_id).is_fenced
        return reply.broker_epoch

    def tick(self) -> list[int]:
        fenced = []
        while True:
            result = self.control.fence_one_expired(self.view(), self.now)
            if result.response is None:
                return fenced
            self.commit(result)
            fenced.append(result.response)

    def create_topic(self, name: str, partitions: int, factor: int) -> None:
        [created] = self.commit(
            topics.create_topics(self.view(), [NewTopic(name, partitions, factor)])
        )  # type: ignore[misc]
        assert created.error.ok, created.error

    def leaders(self, name: str) -> list[int]:
        topic = self.image.topic(name)
        assert topic is not None
        return [p.leader for p in topic.partitions.values()]

    def isrs(self, name: str) -> list[tuple[int, ...]]:
        topic = self.image.topic(name)
        assert topic is not None
        return [p.isr for p in topic.partitions.values()]

    def replayed(self) -> MetadataImage:
        return MetadataImage.empty(CLUSTER).apply(self.log)[0]


@pytest.fixture
def quorum() -> Quorum:
    return Quorum()


# -- BrokerRegistration ------------------------------------------------------------------------


def test_a_new_broker_registers_fenced_with_the_offset_of_its_record_as_epoch(
    quorum: Quorum,
) -> None:
    quorum.join(0)
    reply = quorum.register(1)
    assert reply.error.ok
    offset, record = quorum.log[-1]
    assert isinstance(record, RegisterBrokerRecord) and record.fenced
    assert reply.broker_epoch == offset
    registration = quorum.image.brokers[1]
    assert registration.epoch == offset and registration.fenced
    assert registration.endpoints == (endpoint(1),)
    assert registration.incarnation_id == quorum.incarnations[1]


def test_registration_from_another_cluster_is_refused(quorum: Quorum) -> None:
    reply = quorum.register(1, cluster_id="someOtherClusterIdxxxx")
    assert reply.error.code is ErrorCode.INCONSISTENT_CLUSTER_ID
    assert quorum.log == [] and 1 not in quorum.image.brokers


def test_same_incarnation_registering_again_gets_the_same_epoch_and_writes_nothing(
    quorum: Quorum,
) -> None:
    first = quorum.register(1)
    quorum.beat(1)
    written = len(quorum.log)
    again = quorum.register(1, quorum.incarnations[1])
    assert again == first and len(quorum.log) == written
    # Still unfenced: a retried registration does not undo the heartbeat.
    assert not quorum.image.brokers[1].fenced
    # The same incarnation with other listeners is registered anew.
    request = RegistrationRequest(
        1, CLUSTER, quorum.incarnations[1], (endpoint(1), endpoint(11)), rack="r1"
    )
    amended = quorum.commit(quorum.control.register_broker(quorum.view(), request, quorum.now))
    assert isinstance(amended, RegistrationReply) and amended.broker_epoch > first.broker_epoch
    assert quorum.image.brokers[1].rack == "r1" and quorum.image.brokers[1].fenced


def test_a_new_incarnation_while_the_old_one_is_live_is_refused(quorum: Quorum) -> None:
    epoch = quorum.join(1)
    quorum.now += SESSION_MS
    reply = quorum.register(1)  # another process, new incarnation id
    assert reply.error.code is ErrorCode.DUPLICATE_BROKER_REGISTRATION
    assert quorum.image.brokers[1].epoch == epoch
    # Once the old session has run out, the new process may take the id over.
    quorum.now += 1
    reply = quorum.register(1)
    assert reply.error.ok and reply.broker_epoch > epoch
    assert quorum.image.brokers[1].fenced


def test_a_new_incarnation_of_a_fenced_broker_is_accepted(quorum: Quorum) -> None:
    quorum.join(1)
    assert quorum.beat(1, want_fence=True).is_fenced
    assert quorum.register(1).error.ok


# -- BrokerHeartbeat ---------------------------------------------------------------------------


def test_heartbeat_with_a_stale_or_unknown_epoch_is_refused(quorum: Quorum) -> None:
    assert quorum.beat(5, epoch=0).error.code is ErrorCode.STALE_BROKER_EPOCH
    old = quorum.register(1).broker_epoch
    quorum.beat(1, want_fence=True)
    new = quorum.register(1).broker_epoch
    assert new != old
    written = len(quorum.log)
    reply = quorum.beat(1, epoch=old)
    assert reply.error.code is ErrorCode.STALE_BROKER_EPOCH
    assert len(quorum.log) == written and quorum.image.brokers[1].fenced
    assert quorum.beat(1, epoch=new).error.ok


def test_a_fenced_broker_is_unfenced_once_it_has_caught_up_to_its_registration(
    quorum: Quorum,
) -> None:
    epoch = quorum.register(1).broker_epoch
    behind = quorum.beat(1, offset=epoch - 1)
    assert behind.error.ok and behind.is_fenced and not behind.is_caught_up
    assert quorum.image.brokers[1].fenced
    caught_up = quorum.beat(1, offset=epoch)
    assert caught_up.is_caught_up and not caught_up.is_fenced
    _, record = quorum.log[-1]
    assert record == BrokerRegistrationChangeRecord(1, epoch, fenced=False)
    assert not quorum.image.brokers[1].fenced
    # A broker that asks to be fenced is.
    assert quorum.beat(1, want_fence=True).is_fenced
    assert quorum.image.brokers[1].fenced


def test_a_broker_silent_for_the_session_timeout_is_fenced_and_its_leaderships_move(
    quorum: Quorum,
) -> None:
    quorum.join(1)
    quorum.join(2)
    quorum.create_topic("t", 4, 2)
    assert set(quorum.leaders("t")) == {1, 2}
    quorum.now += SESSION_MS
    quorum.beat(2)
    assert quorum.tick() == []  # exactly the timeout: still alive
    quorum.now += 1
    assert quorum.tick() == [1]
    assert quorum.image.brokers[1].fenced and not quorum.image.brokers[2].fenced
    assert quorum.leaders("t") == [2, 2, 2, 2]
    assert quorum.isrs("t") == [(2,), (2,), (2,), (2,)]
    # Fenced brokers have no session to run out; the other one still has one.
    assert quorum.control.next_deadline(quorum.image, quorum.now) == (
        quorum.now - 1 + SESSION_MS + 1
    )
    assert quorum.tick() == []


def test_only_an_active_controller_fences_and_a_new_one_gives_a_full_session(
    quorum: Quorum,
) -> None:
    quorum.join(1)
    quorum.control.deactivate()
    quorum.now += 10 * SESSION_MS
    assert quorum.tick() == [] and not quorum.image.brokers[1].fenced
    # Becoming active: the broker was never heard from by this controller, so it gets a
    # whole session from now before it is fenced.
    quorum.control.activate()
    assert quorum.tick() == []
    quorum.now += SESSION_MS + 1
    assert quorum.tick() == [1]


# -- controlled shutdown -----------------------------------------------------------------------


def test_controlled_shutdown_moves_leaderships_then_lets_the_broker_go(quorum: Quorum) -> None:
    quorum.join(1)
    quorum.join(2)
    quorum.create_topic("t", 2, 2)
    assert 1 in quorum.leaders("t")
    reply = quorum.beat(1, want_shut_down=True)
    assert reply.error.ok and not reply.is_fenced and not reply.should_shut_down
    assert reply.in_controlled_shutdown and quorum.image.brokers[1].in_controlled_shutdown
    # Its leaderships moved to the other ISR member, and it left the ISRs.
    assert quorum.leaders("t") == [2, 2] and quorum.isrs("t") == [(2,), (2,)]
    # Not before broker 2 has seen those changes.
    stale = quorum.image.offset - 1
    quorum.beat(2, offset=stale)
    assert not quorum.beat(1, want_shut_down=True).should_shut_down
    quorum.beat(2)
    final = quorum.beat(1, want_shut_down=True)
    assert final.should_shut_down and final.is_fenced
    assert quorum.image.brokers[1].fenced
    # It stays told to shut down.
    assert quorum.beat(1, want_shut_down=True).should_shut_down


def test_controlled_shutdown_of_the_only_broker_leaves_its_partitions_leaderless(
    quorum: Quorum,
) -> None:
    quorum.join(0)
    quorum.create_topic("t", 2, 1)
    epochs = [p.leader_epoch for p in quorum.image.topic("t").partitions.values()]  # type: ignore[union-attr]
    first = quorum.beat(0, want_shut_down=True)
    assert not first.should_shut_down and not first.is_fenced
    # Nobody to move the leaderships to: no leader, the ISR keeps its last member.
    assert quorum.leaders("t") == [-1, -1] and quorum.isrs("t") == [(0,), (0,)]
    second = quorum.beat(0, want_shut_down=True)
    assert second.should_shut_down and second.is_fenced
    # The restarted broker registers, catches up, and leads them again.
    quorum.join(0)
    assert quorum.leaders("t") == [0, 0]
    after = [p.leader_epoch for p in quorum.image.topic("t").partitions.values()]  # type: ignore[union-attr]
    assert after == [e + 2 for e in epochs]


def test_a_broker_leading_nothing_shuts_down_at_once(quorum: Quorum) -> None:
    quorum.join(1)
    reply = quorum.beat(1, want_shut_down=True)
    assert reply.should_shut_down and reply.is_fenced


# -- UnregisterBroker --------------------------------------------------------------------------


def test_unregister_removes_the_registration_and_moves_its_leaderships(quorum: Quorum) -> None:
    reply = quorum.commit(quorum.control.unregister_broker(quorum.view(), 3))
    assert reply.code is ErrorCode.BROKER_ID_NOT_REGISTERED  # type: ignore[attr-defined]
    quorum.join(1)
    quorum.join(2)
    quorum.create_topic("t", 2, 2)
    epoch = quorum.image.brokers[1].epoch
    reply = quorum.commit(quorum.control.unregister_broker(quorum.view(), 1))
    assert reply.ok  # type: ignore[attr-defined]
    assert 1 not in quorum.image.brokers
    assert quorum.log[-1][1] == UnregisterBrokerRecord(1, epoch)
    assert quorum.leaders("t") == [2, 2]
    assert quorum.beat(1, epoch=epoch).error.code is ErrorCode.STALE_BROKER_EPOCH


# -- leaders are chosen among unfenced brokers -------------------------------------------------


def test_fenced_brokers_are_not_chosen_as_leaders(quorum: Quorum) -> None:
    quorum.join(1)
    quorum.register(2)  # fenced: not caught up yet
    quorum.create_topic("t", 4, 1)
    assert quorum.leaders("t") == [1, 1, 1, 1]
    # Two replicas asked, one unfenced broker: refused.
    view = quorum.view()
    [refused] = topics.create_topics(view, [NewTopic("u", 1, 2)]).response
    assert refused.error.code is ErrorCode.INVALID_REPLICATION_FACTOR
    # A manual assignment may name the fenced broker, which then is neither leader nor ISR.
    [made] = quorum.commit(topics.create_topics(view, [NewTopic("v", assignments={0: [2, 1]})]))  # type: ignore[misc]
    assert made.error.ok
    part = quorum.image.partition("v", 0)
    assert part is not None and part.leader == 1 and part.isr == (1,)
    # Only fenced brokers: nobody could lead it.
    [none] = topics.create_topics(quorum.view(), [NewTopic("w", assignments={0: [2]})]).response
    assert none.error.code is ErrorCode.INVALID_REPLICA_ASSIGNMENT


# -- records and replay ------------------------------------------------------------------------


def test_membership_records_round_trip() -> None:
    records: list[MetadataRecord] = [
        RegisterBrokerRecord(
            3,
            uuid.UUID(int=5),
            (endpoint(3),),
            "rack-a",
            fenced=False,
            in_controlled_shutdown=True,
            log_dirs=(uuid.UUID(int=9),),
        ),
        BrokerRegistrationChangeRecord(3, 17, fenced=True),
        BrokerRegistrationChangeRecord(3, 17, in_controlled_shutdown=True),
        UnregisterBrokerRecord(3, 17),
    ]
    for record in records:
        assert decode_record(encode_record(record)) == record
    # A registration written before fencing existed reads as Kafka's default: fenced.
    old = b"\x01\x00" + (
        b'{"broker_id":1,"endpoints":[],"incarnation_id":"'
        + str(uuid.UUID(int=1)).encode()
        + b'","rack":null}'
    )
    decoded = decode_record(old)
    assert isinstance(decoded, RegisterBrokerRecord) and decoded.fenced


def test_a_change_for_another_registration_does_not_replay() -> None:
    image, _ = MetadataImage.empty().apply([(0, RegisterBrokerRecord(1, uuid.UUID(int=1), ()))])
    with pytest.raises(MetadataReplayError):
        image.apply([(1, BrokerRegistrationChangeRecord(1, 5, fenced=False))])
    with pytest.raises(MetadataReplayError):
        image.apply([(1, UnregisterBrokerRecord(2, 0))])
    _, delta = image.apply([(1, BrokerRegistrationChangeRecord(1, 0, fenced=False))])
    assert delta.changed_brokers == (1,)


def test_the_image_rebuilt_from_the_records_equals_the_live_one(quorum: Quorum) -> None:
    quorum.join(1)
    quorum.join(2)
    quorum.register(3)
    quorum.create_topic("t", 3, 2)
    quorum.beat(1, want_shut_down=True)
    quorum.now += SESSION_MS + 1
    quorum.beat(1, want_shut_down=True)
    quorum.beat(3)
    quorum.tick()
    quorum.commit(quorum.control.unregister_broker(quorum.view(), 1))
    assert any(isinstance(r, PartitionChangeRecord) for _, r in quorum.log)
    assert quorum.replayed() == quorum.image


# -- through the controller and its log --------------------------------------------------------


def test_the_single_node_registers_itself_unfenced_through_the_same_path(
    start_controller: ControllerFactory,
) -> None:
    controller = start_controller()
    me = controller.image.brokers[controller.node_id]
    assert not me.fenced and controller.broker_epoch == me.epoch
    controller.create_topics([NewTopic("t", 2)])
    leaders = [p.leader for p in controller.image.topic("t").partitions.values()]  # type: ignore[union-attr]
    assert leaders == [controller.node_id] * 2
    controller.close()
    # Restarted: a new incarnation, a new epoch, unfenced again, still leading.
    again = start_controller()
    registration = again.image.brokers[again.node_id]
    assert registration.epoch > me.epoch and registration.incarnation_id != me.incarnation_id
    assert not registration.fenced
    topic = again.image.topic("t")
    assert topic is not None
    assert [(p.leader, p.leader_epoch) for p in topic.partitions.values()] == [
        (again.node_id, 0)
    ] * 2


def test_controller_fences_a_silent_broker_on_tick_and_replays_to_the_same_image(
    start_controller: ControllerFactory, clock: FakeClock, data_dir: Path
) -> None:
    controller = start_controller(broker_session_timeout_ms="5000")
    cluster_id = controller.image.cluster_id
    reply = controller.register_broker(
        RegistrationRequest(7, cluster_id, uuid.UUID(int=77, version=4), (endpoint(7),))
    )
    assert reply.error.ok and reply.broker_epoch == controller.image.brokers[7].epoch
    beat = controller.heartbeat(HeartbeatRequest(7, reply.broker_epoch, controller.image.offset))
    assert not beat.is_fenced and not controller.image.brokers[7].fenced
    assert controller.tick(clock.now) == []
    clock.now += 5001
    controller.heartbeat(
        HeartbeatRequest(controller.node_id, controller.broker_epoch, controller.image.offset)
    )
    assert controller.tick(clock.now) == [7]
    assert controller.image.brokers[7].fenced
    assert not controller.image.brokers[controller.node_id].fenced
    assert controller.unregister_broker(7).ok and 7 not in controller.image.brokers
    # Replaying the metadata log gives the live image.
    loader = MetadataLoader(MetadataImage.empty(cluster_id))
    assert loader.replay(controller.metadata_log.batches()) == controller.image
