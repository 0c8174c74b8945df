"""Client quotas as metadata: the record, replay into the image, the controller's checks
for AlterClientQuotas, DescribeClientQuotas filters, and Kafka's quota precedence."""

from __future__ import annotations

import pytest

from tidelog.metadata.controller.quotas import (
    MATCH_ANY,
    MATCH_DEFAULT,
    MATCH_EXACT,
    QuotaAlteration,
    QuotaFilterComponent,
    alter_client_quotas,
    describe_client_quotas,
)
from tidelog.metadata.errors import MetadataRecordError, MetadataReplayError
from tidelog.metadata.image import MetadataImage
from tidelog.metadata.quotas import QuotaEntity, resolve_ip_quota, resolve_quota
from tidelog.metadata.records import (
    ClientQuotaRecord,
    MetadataRecord,
    decode_record,
    encode_record,
)
from tidelog.protocol.error_codes import ErrorCode

ALICE: QuotaEntity = (("user", "alice"),)
ALICE_APP: QuotaEntity = (("client-id", "app"), ("user", "alice"))
CLIENT_DEFAULT: QuotaEntity = (("client-id", None),)


class _View:
    def __init__(self, image: MetadataImage) -> None:
        self.image = image


def _replayed(image: MetadataImage, records: list[MetadataRecord]) -> MetadataImage:
    entries = [(image.offset + 1 + i, r) for i, r in enumerate(records)]
    return image.apply(entries)[0]


def _alter(
    image: MetadataImage, *entries: QuotaAlteration, validate_only: bool = False
) -> tuple[list[tuple[ErrorCode, str | None]], MetadataImage, list[MetadataRecord]]:
    result = alter_client_quotas(
        _View(image),  # type: ignore[arg-type]
        entries,
        validate_only=validate_only,
    )
    codes = [(r.error.code, r.error.message) for r in result.response]
    return codes, _replayed(image, list(result.records)), list(result.records)


def test_record_round_trip_and_damage() -> None:
    for record in (
        ClientQuotaRecord(ALICE_APP, "producer_byte_rate", 1024.0),
        ClientQuotaRecord(CLIENT_DEFAULT, "request_percentage", 12.5),
        ClientQuotaRecord((("ip", "10.0.0.1"),), "connection_creation_rate", 0.0, remove=True),
    ):
        assert decode_record(encode_record(record)) == record
    body = encode_record(ClientQuotaRecord(ALICE, "producer_byte_rate", 1.0))
    with pytest.raises(MetadataRecordError, match="value"):
        decode_record(body.replace(b'"value":1.0', b'"value":"x"'))


def test_replay_sets_removes_and_forgets_an_empty_entity() -> None:
    image = _replayed(
        MetadataImage.empty("c"),
        [
            ClientQuotaRecord(ALICE, "producer_byte_rate", 1024.0),
            ClientQuotaRecord(ALICE, "consumer_byte_rate", 2048.0),
        ],
    )
    assert dict(image.client_quotas[ALICE]) == {
        "producer_byte_rate": 1024.0,
        "consumer_byte_rate": 2048.0,
    }
    after, delta = image.apply(
        [(image.offset + 1, ClientQuotaRecord(ALICE, "producer_byte_rate", 0.0, remove=True))]
    )
    assert dict(after.client_quotas[ALICE]) == {"consumer_byte_rate": 2048.0}
    assert delta.changed_client_quotas == {ALICE}
    gone = _replayed(after, [ClientQuotaRecord(ALICE, "consumer_byte_rate", 0.0, remove=True)])
    assert ALICE not in gone.client_quotas
    assert dict(image.client_quotas[ALICE])["producer_byte_rate"] == 1024.0  # unchanged
    with pytest.raises(MetadataReplayError, match="IP tag"):
        _replayed(image, [ClientQuotaRecord((("ip", None), ("user", "a")), "x", 1.0)])


def _entry(entity: dict[str, str | None], **ops: float | None) -> QuotaAlteration:
    return QuotaAlteration(tuple(entity.items()), tuple(ops.items()))


@pytest.mark.parametrize(
    ("entity", "ops", "message"),
    [
        ({}, {"producer_byte_rate": 1.0}, "Invalid empty client quota entity"),
        ({"group": "g"}, {"producer_byte_rate": 1.0}, "Unhandled client quota entity type"),
        ({"ip": "10.0.0.1", "user": "a"}, {"connection_creation_rate": 1.0}, "IP tag"),
        ({"ip": "not-an-address"}, {"connection_creation_rate": 1.0}, "not a valid IP"),
        ({"user": "a"}, {"connection_creation_rate": 5.0}, "Invalid configuration key"),
        ({"ip": None}, {"producer_byte_rate": 5.0}, "Invalid configuration key"),
        ({"user": "a"}, {"fetch_rate": 5.0}, "Invalid configuration key"),
        ({"user": "a"}, {"producer_byte_rate": 0.0}, "must be greater than 0"),
        ({"client-id": "c"}, {"request_percentage": -1.0}, "must be greater than 0"),
        ({"user": "a"}, {"producer_byte_rate": 10.5}, "whole number"),
        ({"ip": None}, {"connection_creation_rate": 2.0**31}, "too large"),
        ({"user": "a"}, {"request_percentage": float("nan")}, "must be greater than 0"),
        ({"user": "a"}, {"request_percentage": float("inf")}, "finite"),
    ],
)
def test_alter_refuses_what_kafka_refuses(
    entity: dict[str, str | None], ops: dict[str, float], message: str
) -> None:
    codes, image, records = _alter(MetadataImage.empty("c"), _entry(entity, **ops))
    ((code, text),) = codes
    assert code == ErrorCode.INVALID_REQUEST and text is not None and message in text
    assert records == [] and not image.client_quotas


def test_alter_entries_succeed_alone_and_validate_only_writes_nothing() -> None:
    good = _entry({"user": "alice", "client-id": "app"}, producer_byte_rate=1024.0)
    ip_default = _entry({"ip": None}, connection_creation_rate=3.0)
    bad = _entry({"user": "bob"}, producer_byte_rate=1024.0, request_percentage=-2.0)
    twice = _entry({"user": "carol"}, producer_byte_rate=1.0)
    codes, image, records = _alter(MetadataImage.empty("c"), good, ip_default, bad, twice, twice)
    assert [c for c, _ in codes] == [
        ErrorCode.NONE,
        ErrorCode.NONE,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.INVALID_REQUEST,
    ]
    assert dict(image.client_quotas) == {
        ALICE_APP: {"producer_byte_rate": 1024.0},
        (("ip", None),): {"connection_creation_rate": 3.0},
    }
    # bob's valid key is not written either: an entry commits whole or not at all.
    assert len(records) == 2
    codes, same, records = _alter(
        image, _entry({"user": "dave"}, consumer_byte_rate=9.0), validate_only=True
    )
    assert codes == [(ErrorCode.NONE, None)] and records == [] and same == image


def test_alter_writes_only_what_changes() -> None:
    start = _replayed(
        MetadataImage.empty("c"), [ClientQuotaRecord(ALICE, "producer_byte_rate", 1024.0)]
    )
    entry = _entry(
        {"user": "alice"},
        producer_byte_rate=1024.0,  # as it is: no record
        consumer_byte_rate=None,  # not set: nothing to remove
        request_percentage=50.0,
    )
    codes, image, records = _alter(start, entry)
    assert codes == [(ErrorCode.NONE, None)]
    assert records == [ClientQuotaRecord(ALICE, "request_percentage", 50.0)]
    codes, image, _ = _alter(image, _entry({"user": "alice"}, producer_byte_rate=None))
    assert dict(image.client_quotas[ALICE]) == {"request_percentage": 50.0}


def _populated() -> MetadataImage:
    return _replayed(
        MetadataImage.empty("c"),
        [
            ClientQuotaRecord(ALICE, "producer_byte_rate", 1.0),
            ClientQuotaRecord((("user", None),), "producer_byte_rate", 2.0),
            ClientQuotaRecord(ALICE_APP, "producer_byte_rate", 3.0),
            ClientQuotaRecord((("client-id", "app"),), "consumer_byte_rate", 4.0),
            ClientQuotaRecord(CLIENT_DEFAULT, "consumer_byte_rate", 5.0),
            ClientQuotaRecord((("ip", "10.0.0.1"),), "connection_creation_rate", 6.0),
        ],
    )


@pytest.mark.parametrize(
    ("components", "strict", "expected"),
    [
        ([], False, 6),
        ([QuotaFilterComponent("user", MATCH_EXACT, "alice")], False, [ALICE, ALICE_APP]),
        ([QuotaFilterComponent("user", MATCH_EXACT, "alice")], True, [ALICE]),
        ([QuotaFilterComponent("user", MATCH_DEFAULT)], False, [(("user", None),)]),
        ([QuotaFilterComponent("user", MATCH_ANY)], True, [ALICE, (("user", None),)]),
        (
            [QuotaFilterComponent("client-id", MATCH_ANY)],
            True,
            [CLIENT_DEFAULT, (("client-id", "app"),)],
        ),
        (
            [
                QuotaFilterComponent("client-id", MATCH_EXACT, "app"),
                QuotaFilterComponent("user", MATCH_ANY),
            ],
            False,
            [ALICE_APP],
        ),
        ([QuotaFilterComponent("ip", MATCH_EXACT, "10.0.0.1")], True, [(("ip", "10.0.0.1"),)]),
        ([QuotaFilterComponent("user", MATCH_EXACT, "nobody")], False, []),
    ],
)
def test_describe_filters(
    components: list[QuotaFilterComponent], strict: bool, expected: int | list[QuotaEntity]
) -> None:
    error, found = describe_client_quotas(_populated(), components, strict=strict)
    assert error.ok
    entities = [entity for entity, _ in found]
    if isinstance(expected, int):
        assert len(entities) == expected
    else:
        assert sorted(entities, key=repr) == sorted(expected, key=repr)


@pytest.mark.parametrize(
    ("components", "message"),
    [
        ([QuotaFilterComponent("group", MATCH_ANY)], "Custom entity type group"),
        (
            [QuotaFilterComponent("user", MATCH_ANY), QuotaFilterComponent("user", MATCH_ANY)],
            "more than once",
        ),
        ([QuotaFilterComponent("user", MATCH_EXACT, None)], "needs a name"),
        ([QuotaFilterComponent("user", MATCH_DEFAULT, "x")], "takes no name"),
        ([QuotaFilterComponent("user", 7)], "Unknown match type"),
        (
            [QuotaFilterComponent("ip", MATCH_ANY), QuotaFilterComponent("user", MATCH_ANY)],
            "IP filter component",
        ),
    ],
)
def test_describe_refuses_bad_filters(components: list[QuotaFilterComponent], message: str) -> None:
    error, found = describe_client_quotas(_populated(), components, strict=False)
    assert error.code == ErrorCode.INVALID_REQUEST and message in (error.message or "")
    assert found == []


# The eight levels, most specific first; each row removes the level above it and
# expects the next one to apply.
_LEVELS: list[QuotaEntity] = [
    (("client-id", "app"), ("user", "alice")),
    (("client-id", None), ("user", "alice")),
    (("user", "alice"),),
    (("client-id", "app"), ("user", None)),
    (("client-id", None), ("user", None)),
    (("user", None),),
    (("client-id", "app"),),
    (("client-id", None),),
]


@pytest.mark.parametrize("level", range(len(_LEVELS)))
def test_resolution_follows_kafkas_precedence(level: int) -> None:
    # Every level from ``level`` down is set, each with its own value; the others
    # (for other users and client ids too) must not be picked.
    quotas = {entity: {"producer_byte_rate": float(i)} for i, entity in enumerate(_LEVELS)}
    present = {e: v for e, v in quotas.items() if _LEVELS.index(e) >= level}
    present[(("client-id", "app"), ("user", "bob"))] = {"producer_byte_rate": 99.0}
    present[(("client-id", "other"),)] = {"producer_byte_rate": 98.0}
    assert resolve_quota(present, "alice", "app", "producer_byte_rate") == (
        _LEVELS[level],
        float(level),
    )


def test_resolution_is_per_key_and_none_without_a_quota() -> None:
    quotas = {
        ALICE_APP: {"producer_byte_rate": 1.0},
        CLIENT_DEFAULT: {"consumer_byte_rate": 2.0},
    }
    assert resolve_quota(quotas, "alice", "app", "consumer_byte_rate") == (CLIENT_DEFAULT, 2.0)
    assert resolve_quota(quotas, "bob", "app", "producer_byte_rate") is None
    assert resolve_quota({}, "alice", "app", "producer_byte_rate") is None
    ips = {(("ip", None),): {"connection_creation_rate": 5.0}}
    assert resolve_ip_quota(ips, "10.0.0.9", "connection_creation_rate") == ((("ip", None),), 5.0)
    ips[(("ip", "10.0.0.9"),)] = {"connection_creation_rate": 1.0}
    assert resolve_ip_quota(ips, "10.0.0.9", "connection_creation_rate") == (
        (("ip", "10.0.0.9"),),
        1.0,
    )
