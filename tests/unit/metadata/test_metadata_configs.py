"""Broker and topic configuration: properties syntax, layering, families, describe."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.metadata.configs import (
    BROKER_CONFIGS,
    TOPIC_CONFIGS,
    BrokerConfig,
    ConfigError,
    ConfigSource,
    ConfigSynonym,
    ConfigType,
    Endpoint,
    describe_broker_configs,
    describe_topic_configs,
    parse_overrides,
    parse_properties,
    topic_config_value,
    topic_log_config,
    validate_broker_config_changes,
    validate_topic_configs,
)
from tidelog.protocol.error_codes import ErrorCode
from tidelog.storage.config import CONFIG_KEYS, LogConfig

# -- properties syntax ---------------------------------------------------------------------


def test_properties_separators_comments_and_trimming() -> None:
    text = (
        "# a comment\n"
        "! another comment\n"
        "\n"
        "   num.partitions = 3  \n"
        "log.dirs:/a,/b\n"
        "node.id 7\n"
        "empty.key=\n"
        "only.key\n"
        "url=PLAINTEXT://h:1#not-a-comment\n"
    )
    assert parse_properties(text) == {
        "num.partitions": "3",
        "log.dirs": "/a,/b",
        "node.id": "7",
        "empty.key": "",
        "only.key": "",
        "url": "PLAINTEXT://h:1#not-a-comment",
    }


def test_properties_continuations_and_escapes() -> None:
    text = (
        "listeners=PLAINTEXT://a:1,\\\n"
        "          SSL://b:2\n"
        "path=C:\\\\data\n"
        "tab=x\\ty\n"
        "uni=\\u00e9t\\u00e9\n"
        "key\\=with\\:seps=v\n"
        "odd=ends with two backslashes\\\\\n"
        "next=1\r\n"
        "cr=2\r"
        "last=3"
    )
    values = parse_properties(text)
    assert values["listeners"] == "PLAINTEXT://a:1,SSL://b:2"
    assert values["path"] == "C:\\data"
    assert values["tab"] == "x\ty"
    assert values["uni"] == "été"
    assert values["key=with:seps"] == "v"
    assert values["odd"] == "ends with two backslashes\\"
    assert values["next"] == "1"
    assert values["cr"] == "2"
    assert values["last"] == "3"


def test_properties_comment_after_continuation_is_value() -> None:
    assert parse_properties("a=1\\\n# not a comment\nb=2") == {"a": "1# not a comment", "b": "2"}


def test_properties_bad_unicode_escape() -> None:
    with pytest.raises(ConfigError, match="uXXXX"):
        parse_properties("a=\\u12")


def test_later_line_wins() -> None:
    assert parse_properties("a=1\na=2\n") == {"a": "2"}


@given(
    st.dictionaries(
        st.from_regex(r"[a-z][a-z0-9.]{0,20}", fullmatch=True),
        st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=20),
        max_size=8,
    )
)
def test_properties_round_trip_of_escaped_text(values: dict[str, str]) -> None:
    def escape(text: str) -> str:
        return "".join("\\" + ch if ch in "\\=:#!" else ch for ch in text)

    text = "\n".join(f"{key}={escape(value)}" for key, value in values.items())
    assert parse_properties(text) == values


def test_overrides() -> None:
    assert parse_overrides(["a=1", " b = x=y ", "a=3"]) == {"a": "3", "b": "x=y"}
    with pytest.raises(ConfigError, match="--override"):
        parse_overrides(["novalue"])
    with pytest.raises(ConfigError):
        parse_overrides(["=1"])


def test_load_file_then_overrides_then_flags(tmp_path: Path) -> None:
    path = tmp_path / "server.properties"
    path.write_text("num.partitions=2\nnode.id=3\nlog.dirs=/file\nmystery.key=1\n")
    config = BrokerConfig.load(
        path, ["num.partitions=5", "log.dirs=/override"], {"log.dirs": "/flag", "node.id": None}
    )
    assert config.num_partitions == 5
    assert config.node_id == 3
    assert config.log_dirs == [Path("/flag")]
    assert config.unknown == {"mystery.key": "1"}
    assert any("mystery.key" in warning for warning in config.warnings)


def test_load_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be read"):
        BrokerConfig.load(tmp_path / "absent.properties")


def test_load_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.properties"
    path.write_bytes(b"a=\xff\xfe\n")
    with pytest.raises(ConfigError, match="UTF-8"):
        BrokerConfig.load(path)


# -- values --------------------------------------------------------------------------------


def test_defaults() -> None:
    config = BrokerConfig()
    assert config.listeners == [Endpoint("PLAINTEXT", "127.0.0.1", 9092, "PLAINTEXT")]
    assert config.advertised_listeners == config.listeners
    assert config.node_id == 1
    assert config.cluster_id is None
    assert config.log_dirs == [Path("./tidelog-data")]
    assert config.metadata_log_dir == Path("./tidelog-data")
    assert config.num_partitions == 1
    assert config.default_replication_factor == 1
    assert config.auto_create_topics_enable is True
    assert config.delete_topic_enable is True
    assert config.message_max_bytes == 1048588
    assert config.socket_request_max_bytes == 104857600
    assert config.queued_max_requests == 500
    assert config.fetch_max_bytes == 57671680
    assert config.log_retention_ms == 168 * 3_600_000
    assert config.log_roll_ms == 168 * 3_600_000
    assert config.log_roll_jitter_ms == 0
    assert config.log_retention_check_interval_ms == 300000
    assert config.log_cleaner_enable is True
    assert config.log_cleaner_backoff_ms == 15000
    assert config.log_flush_offset_checkpoint_interval_ms == 60000
    assert config.log_flush_start_offset_checkpoint_interval_ms == 60000
    assert config.log_flush_interval_ms == 2**63 - 1
    assert config.min_insync_replicas == 1
    assert config.producer_id_expiration_ms == 86400000
    assert config.offsets_topic_num_partitions == 50
    assert config.offsets_topic_replication_factor == 1
    assert config.offsets_retention_ms == 10080 * 60_000
    assert config.group_initial_rebalance_delay_ms == 3000
    assert config.group_min_session_timeout_ms == 6000
    assert config.group_max_session_timeout_ms == 1800000
    assert config.default_log_config == LogConfig()


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"log.retention.hours": "2"}, 7_200_000),
        ({"log.retention.minutes": "3", "log.retention.hours": "2"}, 180_000),
        ({"log.retention.ms": "5", "log.retention.minutes": "3"}, 5),
        ({"log.retention.ms": "-1", "log.retention.hours": "2"}, -1),
        ({"log.retention.hours": "-1"}, -1),
        ({"log.retention.minutes": "-5"}, -1),
    ],
)
def test_retention_precedence(values: dict[str, str], expected: int) -> None:
    config = BrokerConfig(values)
    assert config.log_retention_ms == expected
    assert topic_log_config(config, {}).retention_ms == expected


def test_roll_precedence() -> None:
    assert BrokerConfig({"log.roll.hours": "1"}).log_roll_ms == 3_600_000
    config = BrokerConfig({"log.roll.hours": "1", "log.roll.ms": "500"})
    assert config.log_roll_ms == 500
    assert topic_log_config(config, {}).segment_ms == 500
    jitter = BrokerConfig({"log.roll.jitter.hours": "2"})
    assert topic_log_config(jitter, {}).segment_jitter_ms == 7_200_000
    jitter = BrokerConfig({"log.roll.jitter.hours": "2", "log.roll.jitter.ms": "9"})
    assert topic_log_config(jitter, {}).segment_jitter_ms == 9


def test_dynamic_hours_lose_to_static_ms() -> None:
    """The ms key wins over the hours key whatever layer each one comes from."""
    config = BrokerConfig(
        {"log.retention.ms": "1000"}, dynamic_default={"log.retention.hours": "1"}
    )
    assert config.log_retention_ms == 1000


def test_log_dirs_wins_over_log_dir() -> None:
    assert BrokerConfig({"log.dir": "/one"}).log_dirs == [Path("/one")]
    both = BrokerConfig({"log.dir": "/one", "log.dirs": "/a, /b"})
    assert both.log_dirs == [Path("/a"), Path("/b")]
    assert both.metadata_log_dir == Path("/a")
    assert BrokerConfig({"metadata.log.dir": "/m"}).metadata_log_dir == Path("/m")


def test_flush_ms_falls_back_to_scheduler_interval() -> None:
    config = BrokerConfig({"log.flush.scheduler.interval.ms": "2000"})
    assert config.log_flush_interval_ms == 2000
    assert topic_log_config(config, {}).flush_ms == 2000
    config = BrokerConfig(
        {"log.flush.scheduler.interval.ms": "2000", "log.flush.interval.ms": "30"}
    )
    assert topic_log_config(config, {}).flush_ms == 30


def test_listeners() -> None:
    config = BrokerConfig(
        {
            "listeners": "PLAINTEXT://:9092,SSL://[::1]:9093",
            "advertised.listeners": "PLAINTEXT://broker.example:9092",
        }
    )
    assert config.listeners == [
        Endpoint("PLAINTEXT", "", 9092, "PLAINTEXT"),
        Endpoint("SSL", "::1", 9093, "SSL"),
    ]
    assert str(config.listeners[1]) == "SSL://[::1]:9093"
    # A listener advertised.listeners leaves out keeps its own address.
    assert config.advertised_listeners == [
        Endpoint("PLAINTEXT", "broker.example", 9092, "PLAINTEXT"),
        Endpoint("SSL", "::1", 9093, "SSL"),
    ]
    # Controller listeners are served but never given to clients.
    split = BrokerConfig(
        {
            "listeners": "CONTROLLER://127.0.0.1:9093,PLAINTEXT://127.0.0.1:9092",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        }
    )
    assert [e.name for e in split.listeners] == ["CONTROLLER", "PLAINTEXT"]
    assert split.advertised_listeners == [Endpoint("PLAINTEXT", "127.0.0.1", 9092, "PLAINTEXT")]
    mapped = BrokerConfig(
        {"listeners": "INTERNAL://h:1", "listener.security.protocol.map": "INTERNAL:SASL_SSL"}
    )
    assert mapped.listeners == [Endpoint("INTERNAL", "h", 1, "SASL_SSL")]


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("num.partitions", "0", "at least 1"),
        ("num.partitions", "many", "integer"),
        ("num.partitions", "1_000", "integer"),
        ("num.partitions", "3000000000", "INT"),
        ("log.retention.bytes", "1.5", "integer"),
        ("auto.create.topics.enable", "yes", "true or false"),
        ("log.cleaner.min.cleanable.ratio", "1.5", "between"),
        ("log.cleaner.min.cleanable.ratio", "nan", "finite"),
        ("compression.type", "brotli", "one of"),
        ("log.cleanup.policy", "delete,shred", "among"),
        ("log.cleanup.policy", "", "empty"),
        ("log.message.timestamp.type", "createtime", "one of"),
        ("listeners", "PLAINTEXT:9092", "NAME://host:port"),
        ("listeners", "PLAINTEXT://h:99999", "65535"),
        ("listeners", "PLAINTEXT://h:1,PLAINTEXT://h:2", "twice"),
        ("listeners", "FOO://h:1", "listener.security.protocol.map"),
        ("advertised.listeners", "SSL://h:1", "not in listeners"),
        ("advertised.listeners", "PLAINTEXT://0.0.0.0:9092", "cannot be given to clients"),
        ("listeners", "PLAINTEXT://0.0.0.0:9092", "advertised.listeners=PLAINTEXT://"),
        ("controller.listener.names", "CONTROLLER", "not in listeners"),
        ("controller.listener.names", "PLAINTEXT", "a broker needs one"),
        ("inter.broker.listener.name", "INTERNAL", "one of the broker listeners"),
        ("listener.security.protocol.map", "A:NOPE", "LISTENER:PROTOCOL"),
        ("cluster.id", "has space", "characters"),
        ("log.dirs", "", "empty"),
        ("process.roles", "broker,worker", "among"),
    ],
)
def test_bad_values_raise_one_line_error(key: str, value: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        BrokerConfig({key: value})
    message = str(info.value)
    assert "\n" not in message
    assert key in message
    assert reason in message


_QUORUM_NODE = {
    "node.id": "2",
    "listeners": "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    "controller.listener.names": "CONTROLLER",
    "controller.quorum.voters": "1@127.0.0.1:9193,2@127.0.0.1:9093,3@127.0.0.1:9293",
}


def test_a_quorum_node_configuration() -> None:
    config = BrokerConfig({**_QUORUM_NODE, "controller.quorum.election.timeout.ms": "300"})
    assert config.quorum_mode
    assert config.quorum_voters == {
        1: ("127.0.0.1", 9193),
        2: ("127.0.0.1", 9093),
        3: ("127.0.0.1", 9293),
    }
    assert config.raft_config.election_timeout_ms == 300
    assert config.raft_config.fetch_timeout_ms == 2000
    single = BrokerConfig({})
    assert not single.quorum_mode and single.quorum_voters == {}


@pytest.mark.parametrize(
    ("changes", "key", "reason"),
    [
        ({"node.id": "4"}, "controller.quorum.voters", "node.id 4 is not among the voters"),
        (
            {"controller.quorum.voters": "1@h:1,2@h:2,1@h:3"},
            "controller.quorum.voters",
            "voter 1 is listed twice",
        ),
        ({"controller.quorum.voters": "1@h,2@h:2"}, "controller.quorum.voters", "id@host:port"),
        (
            {"controller.listener.names": "", "listeners": "PLAINTEXT://127.0.0.1:9092"},
            "controller.listener.names",
            "needs a controller listener",
        ),
        ({"process.roles": "broker"}, "process.roles", "broker-only and controller-only"),
        ({"process.roles": "controller"}, "process.roles", "not supported yet"),
    ],
)
def test_a_quorum_configuration_that_cannot_run_is_refused(
    changes: dict[str, str], key: str, reason: str
) -> None:
    with pytest.raises(ConfigError) as info:
        BrokerConfig({**_QUORUM_NODE, **changes})
    message = str(info.value)
    assert "\n" not in message
    assert key in message and reason in message


def test_session_timeouts_must_be_ordered() -> None:
    with pytest.raises(ConfigError, match=r"group\.min\.session\.timeout\.ms"):
        BrokerConfig({"group.min.session.timeout.ms": "10", "group.max.session.timeout.ms": "5"})


def test_invalid_dynamic_value_is_skipped_with_warning() -> None:
    config = BrokerConfig({}, dynamic_default={"num.partitions": "zero"})
    assert config.num_partitions == 1
    assert any("num.partitions" in warning for warning in config.warnings)


def test_layers_order() -> None:
    config = BrokerConfig(
        {"num.partitions": "2"},
        dynamic_default={"num.partitions": "3"},
        dynamic_broker={"num.partitions": "4"},
    )
    assert config.lookup("num.partitions") == (4, ConfigSource.DYNAMIC_BROKER_CONFIG)
    config = config.with_dynamic({"num.partitions": "3"}, {})
    assert config.lookup("num.partitions") == (3, ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)
    config = config.with_dynamic({}, {})
    assert config.lookup("num.partitions") == (2, ConfigSource.STATIC_BROKER_CONFIG)
    assert BrokerConfig().lookup("num.partitions") == (1, ConfigSource.DEFAULT_CONFIG)


# -- topic configs ---------------------------------------------------------------------------


def test_every_storage_key_is_a_topic_config() -> None:
    assert set(CONFIG_KEYS) <= set(TOPIC_CONFIGS)


def test_every_topic_default_matches_storage_and_broker() -> None:
    defaults = LogConfig().to_mapping()
    config = BrokerConfig()
    for name in TOPIC_CONFIGS:
        value, source = topic_config_value(config, {}, name)
        assert source is ConfigSource.DEFAULT_CONFIG, name
        if name in defaults:
            expected = LogConfig.from_mapping({name: defaults[name]})
            got = LogConfig.from_mapping(
                {name: str(value) if not isinstance(value, tuple) else ",".join(value)}
            )
            assert got == expected, name


def test_every_synonym_is_a_broker_config() -> None:
    for definition in TOPIC_CONFIGS.values():
        # Kafka has topic keys without a broker default (remote.storage.enable, ...);
        # Tidelog acts only on keys that have one.
        assert definition.synonyms or definition.no_effect, definition.name
        for synonym in definition.synonyms:
            assert synonym in BROKER_CONFIGS, synonym
            assert BROKER_CONFIGS[synonym].dynamic, synonym


def test_topic_log_config_from_broker_and_overrides() -> None:
    config = BrokerConfig(
        {"log.segment.bytes": "2048", "message.max.bytes": "500", "log.cleanup.policy": "compact"}
    )
    log_config = topic_log_config(config, {"segment.bytes": "4096", "retention.ms": "10"})
    assert log_config.segment_bytes == 4096
    assert log_config.retention_ms == 10
    assert log_config.max_message_bytes == 500
    assert log_config.compact and not log_config.delete


def test_validate_topic_configs() -> None:
    assert (
        validate_topic_configs({"retention.ms": "100", "cleanup.policy": "compact,delete"}) is None
    )
    unknown = validate_topic_configs({"retention.mss": "1"})
    assert unknown is not None and unknown.code is ErrorCode.INVALID_CONFIG
    assert "retention.mss" in (unknown.message or "")
    bad = validate_topic_configs({"retention.ms": "soon"})
    assert bad is not None and bad.code is ErrorCode.INVALID_CONFIG
    assert "retention.ms" in (bad.message or "") and "soon" in (bad.message or "")
    null = validate_topic_configs({"retention.ms": None})
    assert null is not None and null.code is ErrorCode.INVALID_CONFIG
    storage_range = validate_topic_configs({"segment.bytes": "13"})
    assert storage_range is not None and storage_range.code is ErrorCode.INVALID_CONFIG


def test_validate_broker_config_changes() -> None:
    assert validate_broker_config_changes({"log.retention.ms": "5", "num.partitions": None}) is None
    unknown = validate_broker_config_changes({"nope": "1"})
    assert unknown is not None and unknown.code is ErrorCode.INVALID_CONFIG
    # Kafka's broker-side validation answers INVALID_REQUEST for a read-only key and for a
    # value its definition refuses.
    for changes in ({"listeners": "PLAINTEXT://h:1"}, {"num.partitions": "-3"}):
        error = validate_broker_config_changes(changes)
        assert error is not None and error.code is ErrorCode.INVALID_REQUEST


# -- describe --------------------------------------------------------------------------------


def _by_name(entries: list) -> dict:  # type: ignore[type-arg]
    return {entry.name: entry for entry in entries}


def test_describe_topic_default_source_and_synonyms() -> None:
    entries = _by_name(describe_topic_configs(BrokerConfig(), {}, include_synonyms=True))
    assert set(entries) == set(TOPIC_CONFIGS)
    retention = entries["retention.ms"]
    assert retention.value == "604800000"
    assert retention.config_source is ConfigSource.DEFAULT_CONFIG
    assert retention.config_type is ConfigType.LONG
    assert not retention.read_only and not retention.is_sensitive
    assert retention.synonyms == (
        ConfigSynonym("log.retention.hours", "168", ConfigSource.DEFAULT_CONFIG),
    )
    assert entries["cleanup.policy"].config_type is ConfigType.LIST
    assert entries["unclean.leader.election.enable"].value == "false"


def test_describe_topic_synonym_order() -> None:
    config = BrokerConfig(
        {"log.retention.minutes": "5", "log.retention.hours": "2"},
        dynamic_default={"log.retention.ms": "7000"},
        dynamic_broker={"log.retention.hours": "3"},
    )
    entry = describe_topic_configs(
        config, {"retention.ms": "100"}, ["retention.ms"], include_synonyms=True
    )[0]
    assert entry.value == "100"
    assert entry.config_source is ConfigSource.TOPIC_CONFIG
    assert entry.synonyms == (
        ConfigSynonym("retention.ms", "100", ConfigSource.TOPIC_CONFIG),
        ConfigSynonym("log.retention.hours", "3", ConfigSource.DYNAMIC_BROKER_CONFIG),
        ConfigSynonym("log.retention.ms", "7000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG),
        ConfigSynonym("log.retention.minutes", "5", ConfigSource.STATIC_BROKER_CONFIG),
        ConfigSynonym("log.retention.hours", "2", ConfigSource.STATIC_BROKER_CONFIG),
        ConfigSynonym("log.retention.hours", "168", ConfigSource.DEFAULT_CONFIG),
    )
    # Without the override the value comes from the broker family (ms wins).
    entry = describe_topic_configs(config, {}, ["retention.ms"], include_synonyms=True)[0]
    assert entry.value == "7000"
    assert entry.config_source is ConfigSource.DYNAMIC_BROKER_CONFIG


def test_describe_topic_static_source_and_documentation() -> None:
    config = BrokerConfig({"log.segment.bytes": "4096"})
    entry = describe_topic_configs(
        config, {}, ["segment.bytes"], include_synonyms=False, include_documentation=True
    )[0]
    assert entry.value == "4096"
    assert entry.config_source is ConfigSource.STATIC_BROKER_CONFIG
    assert entry.synonyms == ()
    assert entry.documentation
    plain = describe_topic_configs(config, {}, ["segment.bytes"])[0]
    assert plain.documentation is None


def test_describe_topic_unknown_keys_left_out() -> None:
    assert describe_topic_configs(BrokerConfig(), {}, ["nope", "flush.ms"])[0].name == "flush.ms"
    assert len(describe_topic_configs(BrokerConfig(), {}, ["nope"])) == 0


def test_describe_broker() -> None:
    config = BrokerConfig(
        {"log.retention.hours": "2", "listeners": "PLAINTEXT://:9999"},
        dynamic_default={"num.partitions": "3"},
        dynamic_broker={"num.partitions": "4"},
    )
    entries = _by_name(describe_broker_configs(config, include_synonyms=True))
    assert set(entries) == set(BROKER_CONFIGS)
    listeners = entries["listeners"]
    assert listeners.value == "PLAINTEXT://:9999"
    assert listeners.read_only
    assert listeners.config_source is ConfigSource.STATIC_BROKER_CONFIG
    partitions = entries["num.partitions"]
    assert partitions.value == "4" and not partitions.read_only
    assert [s.source for s in partitions.synonyms] == [
        ConfigSource.DYNAMIC_BROKER_CONFIG,
        ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG,
        ConfigSource.DEFAULT_CONFIG,
    ]
    # Unset ms key: no value, and the hours synonyms are not its own.
    retention_ms = entries["log.retention.ms"]
    assert retention_ms.value is None
    assert retention_ms.config_source is ConfigSource.DEFAULT_CONFIG
    assert retention_ms.synonyms == ()
    hours = entries["log.retention.hours"]
    assert hours.value == "2"
    assert hours.synonyms == (
        ConfigSynonym("log.retention.hours", "2", ConfigSource.STATIC_BROKER_CONFIG),
        ConfigSynonym("log.retention.hours", "168", ConfigSource.DEFAULT_CONFIG),
    )


def test_describe_cluster_default_resource_hides_per_broker_values() -> None:
    config = BrokerConfig(
        {}, dynamic_default={"num.partitions": "3"}, dynamic_broker={"num.partitions": "4"}
    )
    entry = describe_broker_configs(
        config, ["num.partitions"], per_broker=False, include_synonyms=True
    )[0]
    assert entry.value == "3"
    assert entry.config_source is ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG
    assert ConfigSource.DYNAMIC_BROKER_CONFIG not in [s.source for s in entry.synonyms]


# -- the documentation -------------------------------------------------------------------------

DOCS = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"


def test_every_config_is_documented() -> None:
    text = DOCS.read_text()
    missing = [name for name in [*BROKER_CONFIGS, *TOPIC_CONFIGS] if f"`{name}`" not in text]
    assert missing == []


def test_documented_example_file_is_valid() -> None:
    text = DOCS.read_text()
    example = text.split("```properties\n", 1)[1].split("```", 1)[0]
    config = BrokerConfig(parse_properties(example))
    assert config.unknown == {}
    assert config.log_dirs == [Path("/var/lib/tidelog/a"), Path("/var/lib/tidelog/b")]
    assert config.log_retention_ms == 72 * 3_600_000


def test_documented_describe_example() -> None:
    config = BrokerConfig({"log.retention.hours": "72"})
    [entry] = describe_topic_configs(
        config, {"retention.ms": "3600000"}, ["retention.ms"], include_synonyms=True
    )
    assert entry.synonyms == (
        ConfigSynonym("retention.ms", "3600000", ConfigSource.TOPIC_CONFIG),
        ConfigSynonym("log.retention.hours", "72", ConfigSource.STATIC_BROKER_CONFIG),
        ConfigSynonym("log.retention.hours", "168", ConfigSource.DEFAULT_CONFIG),
    )


_UNITS = {"log.retention.ms": 1, "log.retention.minutes": 60_000, "log.retention.hours": 3_600_000}
_LAYER_NAMES = ("static", "dynamic_default", "dynamic_broker")


@given(
    st.dictionaries(
        st.sampled_from(list(_UNITS)),
        st.tuples(st.sampled_from(_LAYER_NAMES), st.integers(min_value=-3, max_value=10_000)),
    )
)
def test_retention_family_precedence_ignores_layers(
    settings: dict[str, tuple[str, int]],
) -> None:
    layers: dict[str, dict[str, str]] = {name: {} for name in _LAYER_NAMES}
    for key, (layer, value) in settings.items():
        layers[layer][key] = str(value)
    config = BrokerConfig(
        layers["static"],
        dynamic_default=layers["dynamic_default"],
        dynamic_broker=layers["dynamic_broker"],
    )
    expected = 168 * 3_600_000
    for key in _UNITS:
        if key in settings:
            value = settings[key][1]
            expected = -1 if value < 0 else value * _UNITS[key]
            break
    assert config.log_retention_ms == expected
    assert topic_log_config(config, {}).retention_ms == expected
    [entry] = describe_topic_configs(config, {}, ["retention.ms"])
    assert entry.value == str(expected)
