"""A metadata image as records, and back: the content of a metadata snapshot (KIP-630).

:func:`snapshot_records` states an image as the metadata records (encoded with
:func:`~tidelog.metadata.records.encode_record`) whose replay from an empty image rebuilds
it exactly; :func:`image_from_snapshot` replays them. Raft stores the list as a
``.checkpoint`` file and ships it with FetchSnapshot; the loader starts from it
(:meth:`~tidelog.metadata.loader.MetadataLoader.load_snapshot`) and carries on with the log
after it.

Order, so that each record replays against what it needs (Kafka writes its image in the
same spirit, features first):

1. FeatureLevelRecord per finalized feature;
2. RegisterBrokerRecord per broker, oldest registration first, with its fenced and
   controlled-shutdown state;
3. per topic (by name): TopicRecord, then a PartitionRecord per partition restating it
   whole, leader and partition epochs included;
4. ConfigRecord per topic config override, then per dynamic broker config (cluster
   default "" and each broker);
5. ProducerIdsRecord with the next producer id, when any block was handed out;
6. UserScramCredentialRecord per user and mechanism;
7. AccessControlEntryRecord per ACL, by id (the ids are kept, so a later removal in the
   log names the same ACL);
8. ClientQuotaRecord per client quota entity and key.

Records that only change or remove state (PartitionChange, RemoveTopic,
BrokerRegistrationChange, UnregisterBroker, RemoveUserScramCredential,
RemoveAccessControlEntry) never appear: the
state they led to is stated whole. :data:`SNAPSHOT_COVERAGE` says, for every record type,
how a snapshot covers it; a test fails when a type is missing from it, so whoever adds a
record type decides how snapshots carry it.

A broker's epoch is the offset of its registration record in the log, which a snapshot's
own offsets (counting from 0) cannot give back. So a snapshot's RegisterBrokerRecord
carries one more JSON field, ``broker_epoch`` (Kafka's RegisterBrokerRecord has a
BrokerEpoch field for the same reason); :func:`decode_record` ignores it, and replay
here applies the record at that offset, so that the image's rule "a registration's epoch
is its record's offset" gives the epoch back. Replay offsets are otherwise synthetic: the
image rebuilt carries the snapshot's last contained offset (its end offset - 1) and epoch.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Final

from tidelog.metadata.errors import MetadataRecordError, MetadataReplayError
from tidelog.metadata.image import (
    BROKER_RESOURCE,
    TOPIC_RESOURCE,
    BrokerRegistration,
    MetadataDelta,
    MetadataImage,
)
from tidelog.metadata.records import (
    AccessControlEntryRecord,
    ClientQuotaRecord,
    ConfigRecord,
    FeatureLevelRecord,
    MetadataRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RecordType,
    RegisterBrokerRecord,
    TopicRecord,
    UserScramCredentialRecord,
    decode_record,
    encode_record,
)

__all__ = [
    "SNAPSHOT_COVERAGE",
    "STATED",
    "image_from_snapshot",
    "snapshot_delta",
    "snapshot_records",
]

#: In :data:`SNAPSHOT_COVERAGE`: a snapshot holds records of this type.
STATED: Final = "stated"

#: How a snapshot covers each record type: :data:`STATED`, or why none of that type is
#: needed (the state it changes is restated by another type).
SNAPSHOT_COVERAGE: Final[Mapping[RecordType, str]] = {
    RecordType.FEATURE_LEVEL: STATED,
    RecordType.REGISTER_BROKER: STATED,
    RecordType.BROKER_REGISTRATION_CHANGE: "fenced and shutdown state are in RegisterBroker",
    RecordType.UNREGISTER_BROKER: "an unregistered broker is absent",
    RecordType.TOPIC: STATED,
    RecordType.PARTITION: STATED,
    RecordType.PARTITION_CHANGE: "each partition is restated whole, epochs included",
    RecordType.REMOVE_TOPIC: "a removed topic is absent",
    RecordType.CONFIG: STATED,
    RecordType.PRODUCER_IDS: STATED,
    RecordType.USER_SCRAM_CREDENTIAL: STATED,
    RecordType.REMOVE_USER_SCRAM_CREDENTIAL: "a removed credential is absent",
    RecordType.ACCESS_CONTROL_ENTRY: STATED,
    RecordType.REMOVE_ACCESS_CONTROL_ENTRY: "a removed ACL is absent",
    # A removal is a ClientQuotaRecord too; a removed key is simply not stated.
    RecordType.CLIENT_QUOTA: STATED,
}

_BROKER_EPOCH: Final = "broker_epoch"
# The producer id block's owner is not part of the image; the record still needs one.
_NO_BROKER: Final = -1


def _records(image: MetadataImage) -> Iterator[tuple[MetadataRecord, int | None]]:
    """The image's records in replay order, each with the broker epoch it states (for a
    registration) or None."""
    for name, level in sorted(image.features.items()):
        yield FeatureLevelRecord(name, level), None
    for registration in sorted(image.brokers.values(), key=lambda r: r.epoch):
        yield _registration_record(registration), registration.epoch
    for name, topic in sorted(image.topics_by_name.items()):
        yield TopicRecord(name, topic.topic_id), None
        for index, part in sorted(topic.partitions.items()):
            yield (
                PartitionRecord(
                    topic.topic_id,
                    index,
                    part.replicas,
                    part.isr,
                    part.leader,
                    part.leader_epoch,
                    part.partition_epoch,
                    part.adding_replicas,
                    part.removing_replicas,
                ),
                None,
            )
    for resource_type, configs in (
        (TOPIC_RESOURCE, image.topic_configs),
        (BROKER_RESOURCE, image.broker_configs),
    ):
        for resource, values in sorted(configs.items()):
            for key, value in sorted(values.items()):
                yield ConfigRecord(resource_type, resource, key, value), None
    if image.next_producer_id > 0:
        yield ProducerIdsRecord(_NO_BROKER, _NO_BROKER, image.next_producer_id), None
    for (user, mechanism), credential in sorted(image.scram_credentials.items()):
        yield (
            UserScramCredentialRecord(
                user,
                mechanism,
                credential.salt,
                credential.stored_key,
                credential.server_key,
                credential.iterations,
            ),
            None,
        )
    for acl_id, acl in sorted(image.acls.items()):
        yield (
            AccessControlEntryRecord(
                acl_id,
                int(acl.resource_type),
                acl.resource_name,
                int(acl.pattern_type),
                acl.principal,
                acl.host,
                int(acl.operation),
                int(acl.permission),
            ),
            None,
        )
    for entity, quotas in sorted(image.client_quotas.items(), key=lambda item: repr(item[0])):
        for key, quota in sorted(quotas.items()):
            yield ClientQuotaRecord(entity, key, quota), None


def _registration_record(registration: BrokerRegistration) -> RegisterBrokerRecord:
    return RegisterBrokerRecord(
        registration.broker_id,
        registration.incarnation_id,
        registration.endpoints,
        registration.rack,
        registration.fenced,
        registration.in_controlled_shutdown,
        registration.log_dirs,
    )


def _with_broker_epoch(value: bytes, epoch: int) -> bytes:
    """A RegisterBrokerRecord's value with ``broker_epoch`` added to its JSON body, in the
    encoding encode_record uses (keys sorted, no spaces)."""
    body = json.loads(value[2:])
    body[_BROKER_EPOCH] = epoch
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return value[:2] + text.encode("utf-8")


def _stated_broker_epoch(value: bytes) -> int:
    epoch = json.loads(value[2:]).get(_BROKER_EPOCH)
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        raise MetadataRecordError(
            f"snapshot RegisterBroker record has broker_epoch {epoch!r}, expected an offset"
        )
    return epoch


def snapshot_records(image: MetadataImage) -> list[bytes]:
    """The encoded records whose replay from an empty image gives ``image`` back (see the
    module docstring for their order)."""
    out: list[bytes] = []
    for record, broker_epoch in _records(image):
        value = encode_record(record)
        out.append(value if broker_epoch is None else _with_broker_epoch(value, broker_epoch))
    return out


def image_from_snapshot(
    records: Iterable[bytes], end_offset: int, epoch: int, *, cluster_id: str | None
) -> MetadataImage:
    """The image a snapshot ending at ``end_offset`` (exclusive) in ``epoch`` states.

    The image carries offset ``end_offset - 1`` (the last offset the snapshot contains)
    and ``epoch``, so the log's batches from ``end_offset`` apply to it next. Raises
    MetadataRecordError for a record that does not decode and MetadataReplayError for
    records that do not replay (a snapshot not written by :func:`snapshot_records`, or
    damaged).
    """
    if end_offset < 1 or epoch < 0:
        raise MetadataReplayError(f"bad snapshot id (offset {end_offset}, epoch {epoch})")
    decoded: list[tuple[MetadataRecord, int | None]] = []
    for value in records:
        record = decode_record(value)
        if isinstance(record, RegisterBrokerRecord):
            broker_epoch = _stated_broker_epoch(bytes(value))
            if broker_epoch >= end_offset:
                raise MetadataReplayError(
                    f"snapshot ending at {end_offset} registers broker {record.broker_id} "
                    f"at the later epoch {broker_epoch}"
                )
            decoded.append((record, broker_epoch))
        else:
            decoded.append((record, None))
    # Each record gets the offset after the previous one, except a registration, which
    # gets its epoch; the records before the first registration count back from it.
    first_epoch = next((e for _, e in decoded if e is not None), None)
    before = next((i for i, (_, e) in enumerate(decoded) if e is not None), len(decoded))
    start = min(0, (first_epoch if first_epoch is not None else 0) - before) - 1
    entries: list[tuple[int, MetadataRecord]] = []
    offset = start
    for record, registered_at in decoded:
        if registered_at is None:
            offset += 1
        elif registered_at <= offset:
            raise MetadataReplayError(
                f"snapshot registrations are not in epoch order ({registered_at} follows {offset})"
            )
        else:
            offset = registered_at
        entries.append((offset, record))
    base = dataclasses.replace(MetadataImage.empty(cluster_id), offset=start)
    image, _ = base.apply(entries)
    return dataclasses.replace(image, offset=end_offset - 1, epoch=epoch)


def snapshot_delta(old: MetadataImage, new: MetadataImage) -> MetadataDelta:
    """What a publisher holding ``old`` must redo to hold ``new`` (an image loaded from a
    snapshot, which may be far ahead): everything in ``new`` counts as changed, and what
    ``old`` has and ``new`` lacks as deleted or unregistered."""
    created = tuple(t for tid, t in new.topics_by_id.items() if tid not in old.topics_by_id)
    deleted = tuple(t for tid, t in old.topics_by_id.items() if tid not in new.topics_by_id)
    created_partitions: list[tuple[str, int]] = []
    changed_partitions: list[tuple[str, int]] = []
    for topic_id, topic in new.topics_by_id.items():
        before = old.topics_by_id.get(topic_id)
        for index in topic.partitions:
            known = before is not None and index in before.partitions
            (changed_partitions if known else created_partitions).append((topic.name, index))
    return MetadataDelta(
        created_topics=created,
        deleted_topics=deleted,
        created_partitions=tuple(created_partitions),
        changed_partitions=tuple(changed_partitions),
        changed_topic_configs=frozenset(
            name for name in (*old.topic_configs, *new.topic_configs) if name in new.topics_by_name
        ),
        changed_broker_configs=frozenset((*old.broker_configs, *new.broker_configs)),
        registered_brokers=tuple(sorted(new.brokers)),
        unregistered_brokers=tuple(sorted(set(old.brokers) - set(new.brokers))),
        producer_ids_changed=True,
        features_changed=True,
        changed_scram_users=frozenset(
            user for user, _ in (*old.scram_credentials, *new.scram_credentials)
        ),
        changed_acls=frozenset((*old.acls, *new.acls)),
        changed_client_quotas=frozenset((*old.client_quotas, *new.client_quotas)),
    )
