"""Kafka's config names Tidelog accepts without acting on them: validation, storage,
describe, and the generated part of docs/configuration.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidelog.metadata import kafka_config_names as kafka_names
from tidelog.metadata.configs import (
    BROKER_CONFIGS,
    TOPIC_CONFIGS,
    BrokerConfig,
    ConfigResourceType,
    ConfigSource,
    ConfigType,
    no_effect_doc_tables,
    validate_broker_config_changes,
    validate_topic_configs,
)
from tidelog.metadata.controller import (
    AlterConfigsResource,
    Controller,
    DescribeConfigsResource,
    IncrementalAlterConfigsResource,
    NewTopic,
)
from tidelog.protocol.error_codes import ErrorCode

BROKER = ConfigResourceType.BROKER
TOPIC = ConfigResourceType.TOPIC
SET = 0
KERBEROS = "sasl.kerberos.min.time.before.relogin"
DOCS = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"


def _describe(controller: Controller, rtype: int, name: str, key: str):  # type: ignore[no-untyped-def]
    [result] = controller.describe_configs(
        [DescribeConfigsResource(rtype, name, (key,))], include_documentation=True
    )
    assert result.error.code is ErrorCode.NONE
    [entry] = result.entries
    return entry


def test_no_effect_key_alter_stores_and_describes(controller: Controller) -> None:
    entry = _describe(controller, BROKER, "1", KERBEROS)
    assert (entry.value, entry.config_source) == ("60000", ConfigSource.DEFAULT_CONFIG)
    assert entry.config_type is ConfigType.LONG and not entry.read_only
    assert "no Kerberos" in (entry.documentation or "")

    [result] = controller.alter_configs([AlterConfigsResource(BROKER, "1", {KERBEROS: "120000"})])
    assert result.error.code is ErrorCode.NONE
    assert controller.image.broker_config("1") == {KERBEROS: "120000"}
    entry = _describe(controller, BROKER, "1", KERBEROS)
    assert (entry.value, entry.config_source) == ("120000", ConfigSource.DYNAMIC_BROKER_CONFIG)

    [result] = controller.incremental_alter_configs(
        [IncrementalAlterConfigsResource(BROKER, "1", [(KERBEROS, SET, "90000")])]
    )
    assert result.error.code is ErrorCode.NONE
    assert _describe(controller, BROKER, "1", KERBEROS).value == "90000"


def test_no_effect_key_survives_a_restart(start_controller) -> None:  # type: ignore[no-untyped-def]
    first = start_controller()
    first.alter_configs([AlterConfigsResource(BROKER, "1", {KERBEROS: "120000"})])
    first.close()
    again = start_controller()
    assert _describe(again, BROKER, "1", KERBEROS).value == "120000"


@pytest.mark.parametrize(
    ("changes", "code", "message"),
    [
        ({"broker.id": "2"}, ErrorCode.INVALID_REQUEST, "Cannot update these configs dynamically"),
        ({"log.dirs": "/x"}, ErrorCode.INVALID_REQUEST, "Set(log.dirs)"),
        ({KERBEROS: "soon"}, ErrorCode.INVALID_REQUEST, "expected an integer"),
        ({"sasl.login.refresh.min.period.seconds": "70000"}, ErrorCode.INVALID_REQUEST, "SHORT"),
        ({"ssl.keystore.location": "/k"}, ErrorCode.INVALID_REQUEST, "per-listener"),
        ({"sasl.kerberos.min.time.before.relogn": "1"}, ErrorCode.INVALID_CONFIG, "unknown"),
        ({"zookeeper.connect": "zk:2181"}, ErrorCode.INVALID_CONFIG, "unknown"),
    ],
)
def test_refusals_on_the_broker_resource(
    controller: Controller, changes: dict[str, str], code: ErrorCode, message: str
) -> None:
    for result in (
        controller.alter_configs([AlterConfigsResource(BROKER, "1", changes)])[0],
        controller.incremental_alter_configs(
            [
                IncrementalAlterConfigsResource(
                    BROKER, "1", [(key, SET, value) for key, value in changes.items()]
                )
            ]
        )[0],
    ):
        assert result.error.code is code
        assert message in (result.error.message or "")
    assert controller.image.broker_config("1") == {}


def test_per_broker_key_is_refused_cluster_wide_and_cluster_wide_key_is_not(
    controller: Controller,
) -> None:
    [per_broker] = controller.alter_configs([AlterConfigsResource(BROKER, "", {KERBEROS: "1"})])
    assert per_broker.error.code is ErrorCode.INVALID_REQUEST
    assert "broker id must be specified" in (per_broker.error.message or "")
    [cluster_wide] = controller.alter_configs(
        [AlterConfigsResource(BROKER, "", {"log.cleaner.threads": "2"})]
    )
    assert cluster_wide.error.code is ErrorCode.NONE
    assert controller.image.broker_config("") == {"log.cleaner.threads": "2"}
    assert _describe(controller, BROKER, "", "log.cleaner.threads").config_source is (
        ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG
    )


def test_no_effect_topic_key(controller: Controller) -> None:
    [created] = controller.create_topics(
        [NewTopic("t", configs={"remote.storage.enable": "false"})]
    )
    assert created.error.code is ErrorCode.NONE
    entry = _describe(controller, TOPIC, "t", "remote.storage.enable")
    assert (entry.value, entry.config_source) == ("false", ConfigSource.TOPIC_CONFIG)
    assert "no tiered storage" in (entry.documentation or "")
    bad = validate_topic_configs({"compression.zstd.level": "high"})
    assert bad is not None and bad.code is ErrorCode.INVALID_CONFIG


def test_static_file_accepts_kafka_keys_and_checks_their_type() -> None:
    config = BrokerConfig({KERBEROS: "5000", "ssl.keystore.password": "secret"})
    assert config.unknown == {} and config.get(KERBEROS) == 5000
    with pytest.raises(ValueError, match=KERBEROS):
        BrokerConfig({KERBEROS: "later"})


def test_passwords_are_sensitive() -> None:
    assert BROKER_CONFIGS["ssl.keystore.password"].sensitive
    assert BROKER_CONFIGS["sasl.jaas.config"].sensitive


def test_zookeeper_era_keys_are_not_kafka_4_names() -> None:
    for name in ("zookeeper.connect", "log.message.format.version", "message.format.version"):
        assert name not in BROKER_CONFIGS and name not in TOPIC_CONFIGS


# Tidelog keys whose update mode differs from Kafka's, on purpose: Tidelog lets these
# change at run time (Kafka: read-only), or has no listener reconfiguration (Kafka:
# per-broker).
_MODE_DIFFERS = {
    "num.partitions",
    "default.replication.factor",
    "log.roll.hours",
    "log.roll.jitter.hours",
    "log.retention.minutes",
    "log.retention.hours",
    "fetch.max.bytes",
    "listeners",
    "listener.security.protocol.map",
}


def test_own_definitions_follow_kafka_names_and_modes() -> None:
    kafka = {row[0]: row for row in kafka_names.BROKER_KEYS}
    tidelog_only = {name for name in BROKER_CONFIGS if name not in kafka}
    # metrics.listener: Kafka exposes JMX, Tidelog an HTTP listener (docs/operations.md);
    # log.format and slow.request.threshold.ms: what Kafka's log4j configuration decides.
    assert tidelog_only == {
        "cluster.id",
        "metrics.listener",
        "log.format",
        "slow.request.threshold.ms",
    }
    differs = {
        name
        for name, definition in BROKER_CONFIGS.items()
        if name in kafka and definition.dynamic != (kafka[name][3] != "read-only")
    }
    assert differs == _MODE_DIFFERS
    topic_kafka = {row[0] for row in kafka_names.TOPIC_KEYS}
    assert set(TOPIC_CONFIGS) == topic_kafka


def test_validate_is_checked_before_scope() -> None:
    # Kafka checks read-only keys first, then types, then the scope.
    error = validate_broker_config_changes({KERBEROS: "x"}, per_broker=False)
    assert error is not None and "expected an integer" in (error.message or "")


def test_docs_list_the_no_effect_keys_as_generated() -> None:
    text = DOCS.read_text()
    generated = text.split("<!-- generated: no-effect keys -->\n", 1)[1]
    generated = generated.split("<!-- end generated -->", 1)[0]
    assert generated == no_effect_doc_tables()
    for name, definition in {**BROKER_CONFIGS, **TOPIC_CONFIGS}.items():
        if definition.no_effect is not None:
            assert f"| `{name}` |" in generated, name
