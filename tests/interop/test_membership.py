"""Broker membership on the wire: BrokerRegistration, BrokerHeartbeat and UnregisterBroker
sent by hand (kio requests through the protocol codec) to a real `tidelog serve` on its
controller listener, as another broker of the cluster would send them.

The broker runs with a PLAINTEXT listener for clients and a CONTROLLER listener
(`controller.listener.names`). A pretend broker registers, is fenced until its heartbeat
reports its registration's offset, is then listed in Metadata and DescribeCluster, takes
leaderships, gives them back in a controlled shutdown, and is unregistered; another one
stops heartbeating and is fenced when its session runs out; another leads a partition and
changes its ISR with AlterPartition.
"""

from __future__ import annotations

import dataclasses
import gc
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from interop_broker import BrokerProcess, free_port, send_request, venv_bin
from interop_data import wait_until
from kio.schema.allocate_producer_ids.v0.request import AllocateProducerIdsRequest
from kio.schema.alter_partition.v2 import request as alter_partition_v2
from kio.schema.alter_partition.v3 import request as alter_partition_v3
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.broker_heartbeat.v1.request import BrokerHeartbeatRequest
from kio.schema.broker_registration.v4.request import BrokerRegistrationRequest, Listener
from kio.schema.describe_cluster.v2.request import DescribeClusterRequest
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.types import BrokerId
from kio.schema.unregister_broker.v0.request import UnregisterBrokerRequest
from kio.static.primitive import i8, i16, i32, i64, u16

from tidelog.protocol import ApiKey, ErrorCode

SESSION_TIMEOUT_MS = 4000
#: Where the pretend brokers say they listen (nothing does; nobody connects there).
PRETEND_PORT = 19092


class ControllerListenerBroker(BrokerProcess):
    """`tidelog serve` with a client listener (`port`) and a controller listener."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir, kind="tidelog")
        self.controller_port = free_port()

    def command(self) -> list[str]:
        overrides = {
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},"
            f"CONTROLLER://127.0.0.1:{self.controller_port}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "broker.session.timeout.ms": str(SESSION_TIMEOUT_MS),
            "broker.heartbeat.interval.ms": "100",
        }
        args = [str(venv_bin() / "tidelog"), "serve", "--data-dir", str(self.data_dir)]
        for key, value in overrides.items():
            args += ["--override", f"{key}={value}"]
        return args

    def to_controller(self, request: Any) -> Any:
        return send_request(self.host, self.controller_port, request, client_id="broker-test")

    def to_broker(self, request: Any) -> Any:
        return send_request(self.host, self.port, request)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerListenerBroker]:
    process = ControllerListenerBroker(tmp_path_factory.mktemp("membership"))
    process.start()
    try:
        yield process
    finally:
        gc.collect()
        process.stop()


def registration(broker_id: int, cluster_id: str, incarnation: uuid.UUID) -> Any:
    return BrokerRegistrationRequest(
        broker_id=BrokerId(broker_id),
        cluster_id=cluster_id,
        incarnation_id=incarnation,
        listeners=(
            Listener(
                name="PLAINTEXT", host="127.0.0.1", port=u16(PRETEND_PORT), security_protocol=i16(0)
            ),
        ),
        features=(),
        rack="rack-b",
    )


def heartbeat(
    broker_id: int, epoch: int, offset: int, *, want_shut_down: bool = False
) -> BrokerHeartbeatRequest:
    return BrokerHeartbeatRequest(
        broker_id=BrokerId(broker_id),
        broker_epoch=i64(epoch),
        current_metadata_offset=i64(offset),
        want_fence=False,
        want_shut_down=want_shut_down,
    )


def describe(node: ControllerListenerBroker, *, include_fenced: bool = False) -> Any:
    response = node.to_broker(
        DescribeClusterRequest(
            include_cluster_authorized_operations=False,
            endpoint_type=i8(1),
            include_fenced_brokers=include_fenced,
        )
    )
    assert response.error_code == ErrorCode.NONE.to_kio()
    return response


def fenced_states(node: ControllerListenerBroker) -> dict[int, bool]:
    return {int(b.broker_id): b.is_fenced for b in describe(node, include_fenced=True).brokers}


def metadata(node: ControllerListenerBroker) -> Any:
    return node.to_broker(
        MetadataRequest(
            topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
        )
    )


def listed(node: ControllerListenerBroker) -> dict[int, tuple[str, int]]:
    return {int(b.node_id): (b.host, int(b.port)) for b in metadata(node).brokers}


def advertised_apis(port: int, node: ControllerListenerBroker) -> set[int]:
    response = send_request(
        node.host,
        port,
        ApiVersionsRequest(client_software_name="membership", client_software_version="1"),
    )
    return {int(entry.api_key) for entry in response.api_keys}


MEMBERSHIP_APIS = {
    ApiKey.BROKER_REGISTRATION,
    ApiKey.BROKER_HEARTBEAT,
    ApiKey.UNREGISTER_BROKER,
    ApiKey.ALLOCATE_PRODUCER_IDS,
}
#: Every API brokers send the controller: membership, and partition leaders' ISR changes.
CONTROLLER_ONLY_APIS = MEMBERSHIP_APIS | {ApiKey.ALTER_PARTITION}


def test_only_the_controller_listener_serves_and_lists_the_membership_apis(
    node: ControllerListenerBroker,
) -> None:
    on_controller = advertised_apis(node.controller_port, node)
    on_broker = advertised_apis(node.port, node)
    assert on_controller >= CONTROLLER_ONLY_APIS
    assert not CONTROLLER_ONLY_APIS & on_broker
    # What clients are offered is the same, plus what brokers send on the controller side.
    assert on_controller - on_broker == CONTROLLER_ONLY_APIS


def test_a_broker_registers_fenced_catches_up_and_shuts_down_in_a_controlled_way(
    node: ControllerListenerBroker,
) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    me = describe(node)
    cluster_id, my_id = me.cluster_id, int(me.controller_id)
    assert [int(b.broker_id) for b in me.brokers] == [my_id]

    wrong = node.to_controller(registration(7, "notThisClusterIdXXXXXX", uuid.uuid4()))
    assert wrong.error_code == ErrorCode.INCONSISTENT_CLUSTER_ID.to_kio()
    (listener,) = registration(7, cluster_id, uuid.uuid4()).listeners
    unknown_protocol = dataclasses.replace(
        registration(7, cluster_id, uuid.uuid4()),
        listeners=(dataclasses.replace(listener, security_protocol=i16(9)),),
    )
    invalid = node.to_controller(unknown_protocol)
    assert invalid.error_code == ErrorCode.INVALID_REQUEST.to_kio()
    assert int(invalid.broker_epoch) == -1
    assert 7 not in fenced_states(node)

    incarnation = uuid.uuid4()
    registered = node.to_controller(registration(7, cluster_id, incarnation))
    assert registered.error_code == ErrorCode.NONE.to_kio()
    epoch = int(registered.broker_epoch)
    assert epoch >= 0
    # The same process asking again (its answer was lost) gets the same epoch.
    again = node.to_controller(registration(7, cluster_id, incarnation))
    assert int(again.broker_epoch) == epoch

    # Fenced: not given to clients yet.
    assert 7 not in listed(node)
    assert fenced_states(node) == {my_id: False, 7: True}
    behind = node.to_controller(heartbeat(7, epoch, epoch - 1))
    assert behind.error_code == ErrorCode.NONE.to_kio()
    assert behind.is_fenced and not behind.is_caught_up
    stale = node.to_controller(heartbeat(7, epoch - 1, epoch))
    assert stale.error_code == ErrorCode.STALE_BROKER_EPOCH.to_kio()

    caught_up = node.to_controller(heartbeat(7, epoch, epoch))
    assert caught_up.error_code == ErrorCode.NONE.to_kio()
    assert caught_up.is_caught_up and not caught_up.is_fenced and not caught_up.should_shut_down
    assert listed(node) == {my_id: ("127.0.0.1", node.port), 7: ("127.0.0.1", PRETEND_PORT)}
    assert fenced_states(node) == {my_id: False, 7: False}
    rack = {int(b.broker_id): b.rack for b in describe(node).brokers}[7]
    assert rack == "rack-b"

    # While it is alive, another process cannot take its id.
    duplicate = node.to_controller(registration(7, cluster_id, uuid.uuid4()))
    assert duplicate.error_code == ErrorCode.DUPLICATE_BROKER_REGISTRATION.to_kio()

    # Partitions are spread over both; broker 7 leads some of them.
    admin = AdminClient({"bootstrap.servers": node.bootstrap, "log_level": 0})
    admin.create_topics([NewTopic("spread", 4, 2)])["spread"].result(timeout=15)

    def leaders() -> list[int]:
        (topic,) = [t for t in metadata(node).topics if t.name == "spread"]
        return [int(p.leader_id) for p in topic.partitions]

    assert 7 in leaders() and my_id in leaders()

    # Controlled shutdown: the leaderships move to this node, then it may go.
    first = node.to_controller(heartbeat(7, epoch, epoch, want_shut_down=True))
    assert first.error_code == ErrorCode.NONE.to_kio()
    assert not first.should_shut_down and not first.is_fenced
    assert leaders() == [my_id] * 4
    answers: list[Any] = []

    def let_go() -> bool:
        answers.append(node.to_controller(heartbeat(7, epoch, epoch, want_shut_down=True)))
        return bool(answers[-1].should_shut_down)

    wait_until(let_go, "the controller to let broker 7 shut down")
    assert answers[-1].is_fenced
    assert 7 not in listed(node)

    gone = node.to_controller(UnregisterBrokerRequest(broker_id=BrokerId(7)))
    assert gone.error_code == ErrorCode.NONE.to_kio()
    assert 7 not in fenced_states(node)
    unknown = node.to_controller(UnregisterBrokerRequest(broker_id=BrokerId(7)))
    assert unknown.error_code == ErrorCode.BROKER_ID_NOT_REGISTERED.to_kio()


def test_a_broker_that_stops_heartbeating_is_fenced_after_its_session(
    node: ControllerListenerBroker,
) -> None:
    cluster_id = describe(node).cluster_id
    registered = node.to_controller(registration(8, cluster_id, uuid.uuid4()))
    epoch = int(registered.broker_epoch)
    assert not node.to_controller(heartbeat(8, epoch, epoch)).is_fenced
    assert 8 in listed(node)
    # Silent from now on: the controller fences it once broker.session.timeout.ms passed.
    wait_until(
        lambda: fenced_states(node).get(8) is True,
        "broker 8 to be fenced",
        timeout=SESSION_TIMEOUT_MS / 1000 + 15,
    )
    assert 8 not in listed(node)
    # This node heartbeats itself all along and stays.
    assert fenced_states(node)[int(describe(node).controller_id)] is False


def test_this_node_unregistered_while_running_registers_again(
    node: ControllerListenerBroker,
) -> None:
    me = describe(node)
    my_id = int(me.controller_id)
    (mine,) = [b for b in describe(node, include_fenced=True).brokers if int(b.broker_id) == my_id]
    gone = node.to_controller(UnregisterBrokerRequest(broker_id=BrokerId(my_id)))
    assert gone.error_code == ErrorCode.NONE.to_kio()
    # Its next heartbeat finds no registration: it registers again and is unfenced.
    wait_until(lambda: fenced_states(node).get(my_id) is False, "this node to register again")
    assert listed(node)[my_id] == ("127.0.0.1", node.port)
    assert mine.is_fenced is False


def test_a_registered_broker_gets_producer_id_blocks_on_the_controller_listener(
    node: ControllerListenerBroker,
) -> None:
    cluster_id = describe(node).cluster_id
    registered = node.to_controller(registration(9, cluster_id, uuid.uuid4()))
    epoch = int(registered.broker_epoch)

    def allocate(broker_id: int, broker_epoch: int) -> Any:
        return node.to_controller(
            AllocateProducerIdsRequest(
                broker_id=BrokerId(broker_id), broker_epoch=i64(broker_epoch)
            )
        )

    first = allocate(9, epoch)
    assert first.error_code == ErrorCode.NONE.to_kio()
    assert int(first.producer_id_len) == 1000
    second = allocate(9, epoch)
    assert int(second.producer_id_start) == int(first.producer_id_start) + 1000
    for stale in (allocate(9, epoch - 1), allocate(99, 0)):
        assert stale.error_code == ErrorCode.STALE_BROKER_EPOCH.to_kio()
        assert int(stale.producer_id_len) == 0
    # Not an API clients are given.
    assert ApiKey.ALLOCATE_PRODUCER_IDS not in advertised_apis(node.port, node)


def alter_partition(
    broker_id: int,
    broker_epoch: int,
    topic_id: uuid.UUID,
    epochs: tuple[int, int],
    isr: list[int],
    *,
    version: int = 3,
) -> Any:
    """AlterPartition for partition 0 of ``topic_id`` at (leader epoch, partition epoch)."""
    leader_epoch, partition_epoch = i32(epochs[0]), i32(epochs[1])
    if version == 3:
        v3 = alter_partition_v3
        members = tuple(v3.BrokerState(broker_id=BrokerId(b)) for b in isr)
        partition: Any = v3.PartitionData(
            partition_index=i32(0),
            leader_epoch=leader_epoch,
            new_isr_with_epochs=members,
            partition_epoch=partition_epoch,
        )
        topic: Any = v3.TopicData(topic_id=topic_id, partitions=(partition,))
        return v3.AlterPartitionRequest(
            broker_id=BrokerId(broker_id), broker_epoch=i64(broker_epoch), topics=(topic,)
        )
    v2 = alter_partition_v2
    partition = v2.PartitionData(
        partition_index=i32(0),
        leader_epoch=leader_epoch,
        new_isr=tuple(BrokerId(b) for b in isr),
        partition_epoch=partition_epoch,
    )
    topic = v2.TopicData(topic_id=topic_id, partitions=(partition,))
    return v2.AlterPartitionRequest(
        broker_id=BrokerId(broker_id), broker_epoch=i64(broker_epoch), topics=(topic,)
    )


def test_a_partition_leader_changes_its_isr_with_alter_partition(
    node: ControllerListenerBroker,
) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    me = describe(node)
    cluster_id, my_id = me.cluster_id, int(me.controller_id)
    registered = node.to_controller(registration(10, cluster_id, uuid.uuid4()))
    epoch = int(registered.broker_epoch)
    assert not node.to_controller(heartbeat(10, epoch, epoch)).is_fenced
    admin = AdminClient({"bootstrap.servers": node.bootstrap, "log_level": 0})
    admin.create_topics(
        [NewTopic("isr-changes", num_partitions=1, replica_assignment=[[10, my_id]])]
    )["isr-changes"].result(timeout=15)

    def partition() -> Any:
        (topic,) = [t for t in metadata(node).topics if t.name == "isr-changes"]
        return topic.topic_id, topic.partitions[0]

    topic_id, first = partition()
    assert (int(first.leader_id), list(first.isr_nodes)) == (10, [10, my_id])

    def answer(request: Any) -> Any:
        # Keep broker 10 alive (and so the leader) through the test.
        assert not node.to_controller(heartbeat(10, epoch, epoch)).is_fenced
        response = node.to_controller(request)
        assert response.error_code == ErrorCode.NONE.to_kio()
        ((result,),) = [t.partitions for t in response.topics]
        return result

    shrunk = answer(alter_partition(10, epoch, topic_id, (0, 0), [10]))
    assert shrunk.error_code == ErrorCode.NONE.to_kio()
    assert (int(shrunk.leader_id), list(shrunk.isr), int(shrunk.partition_epoch)) == (10, [10], 1)
    assert list(partition()[1].isr_nodes) == [10]
    # The same change again carries a partition epoch that is no longer current.
    late = answer(alter_partition(10, epoch, topic_id, (0, 0), [10]))
    assert late.error_code == ErrorCode.INVALID_UPDATE_VERSION.to_kio()
    stale = node.to_controller(alter_partition(10, epoch - 1, topic_id, (0, 1), [10, my_id]))
    assert stale.error_code == ErrorCode.STALE_BROKER_EPOCH.to_kio()
    expanded = answer(alter_partition(10, epoch, topic_id, (0, 1), [10, my_id], version=2))
    assert expanded.error_code == ErrorCode.NONE.to_kio()
    assert (list(expanded.isr), int(expanded.partition_epoch)) == ([10, my_id], 2)
    assert list(partition()[1].isr_nodes) == [10, my_id]
    unknown = answer(alter_partition(10, epoch, uuid.uuid4(), (0, 2), [10]))
    assert unknown.error_code == ErrorCode.UNKNOWN_TOPIC_ID.to_kio()
    # Not an API clients are given.
    assert ApiKey.ALTER_PARTITION not in advertised_apis(node.port, node)
