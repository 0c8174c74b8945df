"""A metadata image stated as snapshot records, and rebuilt from them."""

from __future__ import annotations

import dataclasses
import json
import random
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from metadata_helpers import ControllerFactory

from tidelog.metadata.acls import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from tidelog.metadata.controller import (
    AlterConfigOp,
    IncrementalAlterConfigsResource,
    NewPartitions,
    NewTopic,
)
from tidelog.metadata.controller.cluster import HeartbeatRequest, RegistrationRequest
from tidelog.metadata.controller.scram import ScramDeletion, ScramUpsertion
from tidelog.metadata.errors import MetadataRecordError, MetadataReplayError
from tidelog.metadata.image import BROKER_RESOURCE, TOPIC_RESOURCE, MetadataDelta, MetadataImage
from tidelog.metadata.image_records import (
    SNAPSHOT_COVERAGE,
    STATED,
    image_from_snapshot,
    snapshot_records,
)
from tidelog.metadata.loader import MetadataLoader
from tidelog.metadata.log import MetadataBatch
from tidelog.metadata.records import (
    AccessControlEntryRecord,
    BrokerEndpoint,
    BrokerRegistrationChangeRecord,
    ClientQuotaRecord,
    ConfigRecord,
    FeatureLevelRecord,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RecordType,
    RegisterBrokerRecord,
    RemoveAccessControlEntryRecord,
    RemoveTopicRecord,
    RemoveUserScramCredentialRecord,
    TopicRecord,
    UnregisterBrokerRecord,
    UserScramCredentialRecord,
    decode_record,
)


class RandomHistory:
    """Random but valid metadata operations, as batches of records: every record type,
    tracked against a model of the state so that each one replays."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.offset = 0
        self.topics: dict[uuid.UUID, tuple[str, int]] = {}
        self.brokers: dict[int, int] = {}
        self.scram: set[tuple[str, int]] = set()
        self.acls: set[uuid.UUID] = set()
        self.next_producer_id = 0
        self.names = 0

    def _uuid(self) -> uuid.UUID:
        return uuid.UUID(int=self.rng.getrandbits(128), version=4)

    def _replicas(self) -> tuple[int, ...]:
        return tuple(self.rng.sample(range(1, 6), self.rng.randint(1, 3)))

    def _partition(self, topic_id: uuid.UUID, index: int) -> PartitionRecord:
        replicas = self._replicas()
        return PartitionRecord(
            topic_id,
            index,
            replicas,
            replicas[: self.rng.randint(1, len(replicas))],
            self.rng.choice([*replicas, -1]),
            self.rng.randint(0, 5),
            self.rng.randint(0, 9),
        )

    def _config(self, resource_type: int, resource: str) -> ConfigRecord:
        value = self.rng.choice([None, str(self.rng.randint(0, 99)), "é ü"])
        return ConfigRecord(resource_type, resource, self.rng.choice("abc") + ".ms", value)

    def operation(self) -> list[MetadataRecord]:
        rng = self.rng
        topic_ids = sorted(self.topics)
        kind = rng.choice(
            [
                "feature",
                "register",
                "register",
                "broker_change",
                "unregister",
                "topic",
                "topic",
                "partition",
                "partition_change",
                "remove_topic",
                "config",
                "producer_ids",
                "scram",
                "remove_scram",
                "acl",
                "remove_acl",
                "quota",
            ]
        )
        if kind == "feature":
            return [
                FeatureLevelRecord(
                    rng.choice(["metadata.version", "kraft.version"]), rng.randint(0, 3)
                )
            ]
        if kind == "register":
            broker = rng.randint(1, 5)
            endpoints = tuple(
                BrokerEndpoint(f"L{i}", f"host{broker}", rng.randint(1, 65535), "PLAINTEXT")
                for i in range(rng.randint(0, 2))
            )
            return [
                RegisterBrokerRecord(
                    broker,
                    self._uuid(),
                    endpoints,
                    rng.choice([None, "rack-a"]),
                    rng.random() < 0.5,
                    rng.random() < 0.2,
                    tuple(self._uuid() for _ in range(rng.randint(0, 2))),
                )
            ]
        if kind in ("broker_change", "unregister") and self.brokers:
            broker = rng.choice(sorted(self.brokers))
            epoch = self.brokers[broker]
            if kind == "unregister":
                del self.brokers[broker]
                return [UnregisterBrokerRecord(broker, epoch)]
            return [
                BrokerRegistrationChangeRecord(
                    broker,
                    epoch,
                    rng.choice([None, True, False]),
                    rng.choice([None, True, False]),
                )
            ]
        if kind == "topic":
            self.names += 1
            name, topic_id, count = (
                f"t{self.names % 7}-{self.names}",
                self._uuid(),
                rng.randint(1, 3),
            )
            self.topics[topic_id] = (name, count)
            return [
                TopicRecord(name, topic_id),
                *(self._partition(topic_id, i) for i in range(count)),
                *(self._config(TOPIC_RESOURCE, name) for _ in range(rng.randint(0, 2))),
            ]
        if kind in ("partition", "partition_change", "remove_topic") and topic_ids:
            topic_id = rng.choice(topic_ids)
            name, count = self.topics[topic_id]
            if kind == "remove_topic":
                del self.topics[topic_id]
                return [RemoveTopicRecord(topic_id)]
            if kind == "partition":
                # A new partition, or a partition restated whole.
                index = rng.randint(0, count)
                self.topics[topic_id] = (name, max(count, index + 1))
                return [self._partition(topic_id, index)]
            replicas = self._replicas()
            return [
                PartitionChangeRecord(
                    topic_id,
                    rng.randrange(count),
                    rng.choice([None, *replicas]),
                    rng.choice([None, replicas[:1]]),
                    rng.choice([None, replicas]),
                )
            ]
        if kind == "config":
            if rng.random() < 0.5 and self.topics:
                return [self._config(TOPIC_RESOURCE, rng.choice(list(self.topics.values()))[0])]
            return [self._config(BROKER_RESOURCE, rng.choice(["", "1", "2"]))]
        if kind == "producer_ids":
            self.next_producer_id += 1000
            return [ProducerIdsRecord(rng.randint(1, 5), 0, self.next_producer_id)]
        if kind == "scram":
            credential = (rng.choice(["alice", "bob"]), rng.choice([1, 2]))
            self.scram.add(credential)
            return [
                UserScramCredentialRecord(
                    *credential, rng.randbytes(16), rng.randbytes(32), rng.randbytes(32), 4096
                )
            ]
        if kind == "remove_scram" and self.scram:
            credential = rng.choice(sorted(self.scram))
            self.scram.discard(credential)
            return [RemoveUserScramCredentialRecord(*credential)]
        if kind == "acl":
            acl_id = self._uuid()
            self.acls.add(acl_id)
            prefixed = rng.random() < 0.5
            return [
                AccessControlEntryRecord(
                    acl_id,
                    rng.choice([2, 3, 5]),
                    rng.choice(["orders", "pay", "*"]) if not prefixed else "pay",
                    4 if prefixed else 3,
                    rng.choice(["User:alice", "User:*"]),
                    rng.choice(["*", "10.0.0.1"]),
                    rng.randint(2, 12),
                    rng.choice([2, 3]),
                )
            ]
        if kind == "quota":
            entity = rng.choice(
                [
                    (("user", "alice"),),
                    (("client-id", None),),
                    (("client-id", "app"), ("user", None)),
                    (("ip", "10.0.0.1"),),
                ]
            )
            key = (
                "connection_creation_rate"
                if entity[0][0] == "ip"
                else rng.choice(["producer_byte_rate", "request_percentage"])
            )
            value = float(rng.randint(1, 9) * 1024)
            return [ClientQuotaRecord(entity, key, value, remove=rng.random() < 0.3)]
        if kind == "remove_acl" and self.acls:
            acl_id = rng.choice(sorted(self.acls))
            self.acls.discard(acl_id)
            return [RemoveAccessControlEntryRecord(acl_id)]
        return []

    def batches(self, count: int) -> Iterator[tuple[int, list[tuple[int, MetadataRecord]]]]:
        """``count`` batches as (epoch, entries), epochs rising now and then."""
        epoch = 0
        for _ in range(count):
            entries: list[tuple[int, MetadataRecord]] = []
            for _ in range(self.rng.randint(1, 3)):
                for record in self.operation():
                    if isinstance(record, RegisterBrokerRecord):
                        self.brokers[record.broker_id] = self.offset
                    entries.append((self.offset, record))
                    self.offset += 1
            if not entries:
                continue
            if self.rng.random() < 0.1:
                epoch += 1
            yield epoch, entries
            # A control batch (leader change) between operations now and then.
            if self.rng.random() < 0.05:
                self.offset += 1


def random_image(seed: int, batches: int = 60) -> tuple[MetadataImage, set[RecordType]]:
    """The image after a random history, and the record types the history used."""
    history = RandomHistory(random.Random(seed))
    # A formatted log starts with the metadata version (Kafka's bootstrap records).
    bootstrap = FeatureLevelRecord("metadata.version", 1)
    image, _ = MetadataImage.empty("cluster-x").apply([(0, bootstrap)], epoch=0)
    history.offset = 1
    used = {bootstrap.TYPE}
    for epoch, entries in history.batches(batches):
        image, _ = image.apply(entries, epoch=epoch)
        used.update(record.TYPE for _, record in entries)
    return image, used


def reloaded(image: MetadataImage) -> MetadataImage:
    return image_from_snapshot(
        snapshot_records(image), image.offset + 1, image.epoch, cluster_id=image.cluster_id
    )


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 80))
def test_replaying_a_snapshot_rebuilds_the_image(seed: int, batches: int) -> None:
    image, _ = random_image(seed, batches)
    # Dataclass equality compares every field, every map and every partition's epochs.
    assert reloaded(image) == image


def test_every_record_type_is_covered_by_snapshots() -> None:
    """Fails when a record type is added without saying how snapshots carry it (add it to
    SNAPSHOT_COVERAGE, to snapshot_records, and to RandomHistory above)."""
    assert set(SNAPSHOT_COVERAGE) == set(RecordType)
    used: set[RecordType] = set()
    stated: set[RecordType] = set()
    for seed in range(20):
        image, types = random_image(seed, 200)
        used |= types
        stated |= {decode_record(value).TYPE for value in snapshot_records(image)}
        assert reloaded(image) == image
    assert used == set(RecordType), f"the random history never wrote {set(RecordType) - used}"
    assert stated == {kind for kind, how in SNAPSHOT_COVERAGE.items() if how == STATED}


def test_snapshot_order_and_contents() -> None:
    image, _ = random_image(7, 200)
    kinds = [decode_record(value).TYPE for value in snapshot_records(image)]
    order = [
        RecordType.FEATURE_LEVEL,
        RecordType.REGISTER_BROKER,
        RecordType.TOPIC,
        RecordType.CONFIG,
        RecordType.PRODUCER_IDS,
        RecordType.USER_SCRAM_CREDENTIAL,
        RecordType.ACCESS_CONTROL_ENTRY,
        RecordType.CLIENT_QUOTA,
    ]
    ranks = [order.index(RecordType.TOPIC if k == RecordType.PARTITION else k) for k in kinds]
    assert ranks == sorted(ranks)
    partitions = sum(t.num_partitions for t in image.topics_by_name.values())
    assert kinds.count(RecordType.PARTITION) == partitions
    assert kinds.count(RecordType.TOPIC) == len(image.topics_by_name)
    assert kinds.count(RecordType.REGISTER_BROKER) == len(image.brokers)
    assert kinds.count(RecordType.ACCESS_CONTROL_ENTRY) == len(image.acls) > 0
    quota_keys = sum(len(values) for values in image.client_quotas.values())
    assert kinds.count(RecordType.CLIENT_QUOTA) == quota_keys > 0


def test_the_rebuilt_image_carries_the_snapshot_position() -> None:
    image, _ = random_image(3)
    rebuilt = image_from_snapshot(snapshot_records(image), 5000, 9, cluster_id="other")
    assert (rebuilt.offset, rebuilt.epoch, rebuilt.cluster_id) == (4999, 9, "other")
    assert rebuilt == dataclasses.replace(image, offset=4999, epoch=9, cluster_id="other")


def test_broker_epochs_survive_a_snapshot() -> None:
    entries: list[tuple[int, MetadataRecord]] = [
        (0, FeatureLevelRecord("metadata.version", 1)),
        (1, FeatureLevelRecord("kraft.version", 1)),
        (2, RegisterBrokerRecord(2, uuid.UUID(int=2), ())),
        (40, RegisterBrokerRecord(1, uuid.UUID(int=1), (), fenced=False)),
    ]
    image, _ = MetadataImage.empty().apply(entries, epoch=1)
    # Two features before a registration at offset 0 still replay (offsets count back).
    early, _ = MetadataImage.empty().apply(
        [(0, RegisterBrokerRecord(3, uuid.UUID(int=3), ()))], epoch=0
    )
    for source in (image, early):
        rebuilt = reloaded(source)
        assert {b: r.epoch for b, r in rebuilt.brokers.items()} == {
            b: r.epoch for b, r in source.brokers.items()
        }
        assert rebuilt == source


def test_an_empty_image_is_an_empty_snapshot() -> None:
    assert snapshot_records(MetadataImage.empty()) == []
    rebuilt = image_from_snapshot([], 10, 2, cluster_id="c")
    assert rebuilt == dataclasses.replace(MetadataImage.empty("c"), offset=9, epoch=2)


def _register_value(epoch: object) -> bytes:
    image, _ = MetadataImage.empty().apply([(4, RegisterBrokerRecord(1, uuid.UUID(int=1), ()))])
    [value] = snapshot_records(image)
    body = json.loads(value[2:])
    if epoch is None:
        del body["broker_epoch"]
    else:
        body["broker_epoch"] = epoch
    return value[:2] + json.dumps(body).encode()


@pytest.mark.parametrize("epoch", [None, "4", -1, True])
def test_a_registration_without_a_valid_epoch_is_refused(epoch: object) -> None:
    with pytest.raises(MetadataRecordError, match="broker_epoch"):
        image_from_snapshot([_register_value(epoch)], 10, 0, cluster_id=None)


def test_damaged_snapshots_are_refused() -> None:
    # A registration at or after the snapshot's end cannot be in it.
    with pytest.raises(MetadataReplayError, match="later epoch"):
        image_from_snapshot([_register_value(4)], 4, 0, cluster_id=None)
    # Registrations out of epoch order.
    with pytest.raises(MetadataReplayError, match="epoch order"):
        image_from_snapshot([_register_value(6), _register_value(5)], 10, 0, cluster_id=None)
    # A partition before its topic breaks replay's own rules.
    image, _ = random_image(11)
    values = snapshot_records(image)
    first_partition = next(
        i for i, v in enumerate(values) if decode_record(v).TYPE == RecordType.PARTITION
    )
    with pytest.raises(MetadataReplayError, match="unknown topic"):
        image_from_snapshot(values[first_partition:], 5000, 0, cluster_id=None)
    with pytest.raises(MetadataRecordError):
        image_from_snapshot([b"\x02\x00{"], 10, 0, cluster_id=None)
    with pytest.raises(MetadataReplayError, match="bad snapshot id"):
        image_from_snapshot([], 0, 0, cluster_id=None)


def test_a_controller_history_survives_a_snapshot(
    start_controller: ControllerFactory,
) -> None:
    """Images built by the controller's own operations, snapshotted after each one."""
    controller = start_controller()
    set_, delete = AlterConfigOp.SET, AlterConfigOp.DELETE
    operations = [
        lambda: controller.create_topics(
            [NewTopic("a", 3, configs={"retention.ms": "60000"}), NewTopic("b", 2)]
        ),
        lambda: controller.create_partitions([NewPartitions("b", 5)]),
        lambda: controller.incremental_alter_configs(
            [
                IncrementalAlterConfigsResource(
                    BROKER_RESOURCE, "", [("num.partitions", set_, "4")]
                ),
                IncrementalAlterConfigsResource(
                    TOPIC_RESOURCE, "a", [("retention.ms", delete, None)]
                ),
                IncrementalAlterConfigsResource(
                    TOPIC_RESOURCE, "b", [("cleanup.policy", set_, "compact")]
                ),
            ]
        ),
        lambda: controller.register_broker(
            RegistrationRequest(
                7,
                controller.image.cluster_id,
                uuid.UUID(int=77),
                (BrokerEndpoint("PLAINTEXT", "h7", 9097, "PLAINTEXT"),),
                "r1",
            )
        ),
        lambda: controller.heartbeat(
            HeartbeatRequest(7, controller.image.brokers[7].epoch, controller.image.offset)
        ),
        lambda: controller.allocate_producer_ids(1),
        lambda: controller.delete_topics(["a"]),
        lambda: controller.create_topics([NewTopic("a", 1)]),
        lambda: controller.alter_user_scram_credentials(
            [], [ScramUpsertion("alice", 1, 4096, b"salt" * 4, b"p" * 32)]
        ),
        lambda: controller.alter_user_scram_credentials(
            [ScramDeletion("alice", 1)], [ScramUpsertion("bob", 2, 8192, b"s" * 16, b"q" * 64)]
        ),
        lambda: controller.create_acls(
            [
                AclBinding(
                    ResourceType.GROUP,
                    "g",
                    PatternType.PREFIXED,
                    "User:alice",
                    "*",
                    AclOperation.READ,
                    AclPermissionType.DENY,
                )
            ]
        ),
        lambda: controller.delete_acls([AclBindingFilter(resource_type=ResourceType.GROUP)]),
        lambda: controller.unregister_broker(7),
    ]
    for operation in operations:
        before = controller.image.offset
        operation()
        image = controller.image
        assert image.offset > before, "every operation here commits something"
        assert reloaded(image) == image


def _history_batches(seed: int, count: int) -> list[MetadataBatch]:
    """A random history as the loader reads it from the log: metadata batches, with a
    control batch (leader change) in the gaps the history leaves now and then."""
    history = RandomHistory(random.Random(seed))
    bootstrap = FeatureLevelRecord("metadata.version", 1)
    batches = [MetadataBatch(0, 0, 0, ((0, bootstrap),))]
    history.offset = 1
    for epoch, entries in history.batches(count):
        first = entries[0][0]
        if first > batches[-1].last_offset + 1:
            gap = batches[-1].last_offset + 1
            batches.append(MetadataBatch(gap, gap, epoch, (), is_control=True))
        batches.append(MetadataBatch(first, entries[-1][0], epoch, tuple(entries)))
    if random.Random(seed).random() < 0.5:
        end = batches[-1].last_offset + 1
        batches.append(MetadataBatch(end, end, batches[-1].epoch, (), is_control=True))
    return batches


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 60))
def test_replay_as_one_change_equals_loading_batch_by_batch(seed: int, count: int) -> None:
    batches = _history_batches(seed, count)
    one_by_one = MetadataLoader(MetadataImage.empty("cluster-x"))
    for batch in batches:
        one_by_one.load(batch)
    at_once = MetadataLoader(MetadataImage.empty("cluster-x"))
    told: list[MetadataDelta] = []
    at_once.add_publisher(lambda image, delta: told.append(delta))
    assert at_once.replay(batches) == one_by_one.image
    assert at_once.image.offset == batches[-1].last_offset
    assert len(told) == 1


def test_replay_refuses_batches_out_of_order_and_keeps_the_image() -> None:
    batches = _history_batches(7, 10)
    loader = MetadataLoader(MetadataImage.empty("cluster-x"))
    before = loader.image
    swapped = [batches[0], batches[2], batches[1], *batches[3:]]
    with pytest.raises(MetadataReplayError, match="does not follow"):
        loader.replay(swapped)
    assert loader.image is before
    later = dataclasses.replace(batches[1], epoch=batches[1].epoch + 5)
    with pytest.raises(MetadataReplayError, match="follows the later epoch"):
        loader.replay([batches[0], later, batches[2]])
    assert loader.image is before
