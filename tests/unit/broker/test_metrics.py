"""The broker's metrics: what the request path counts, and the text a scrape renders from the
live logs and a copy of the group coordinator's state (parsed back with Prometheus' own
parser)."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tidelog.broker.app import BrokerApp
from tidelog.broker.broker import Broker
from tidelog.broker.fetch_response import PartitionResult, TopicResult, encode_fetch_response
from tidelog.broker.handlers.produce import handle_produce
from tidelog.broker.metrics import (
    BrokerMetrics,
    GroupState,
    QuorumFigures,
    ScrapeState,
    TransactionFigures,
    api_name,
    error_codes,
)
from tidelog.metadata.configs import BrokerConfig
from tidelog.metadata.image import MetadataImage, PartitionImage, TopicImage
from tidelog.protocol import ApiKey, ErrorCode
from tidelog.storage import ConfigError, LogManager

from .conftest import add_topic, context, make_batch, produce_request

Sample = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: bytes) -> Sample:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text.decode())
        for sample in family.samples
    }


def value(sample: Sample, name: str, **labels: str) -> float | None:
    return sample.get((name, frozenset(labels.items())))


def produce(broker: Broker, topics: dict[Any, dict[int, bytes | None]]) -> Any:
    request = produce_request(9, topics, acks=1)
    return asyncio.run(handle_produce(context(broker, ApiKey.PRODUCE, 9), request))


def test_produce_counts_appended_bytes_and_records_per_topic(broker: Broker) -> None:
    metrics = BrokerMetrics()
    broker.metrics = metrics
    add_topic(broker, "orders", partitions=2)
    first, second = make_batch([b"a", b"b", b"c"]), make_batch([b"d"])
    produce(broker, {"orders": {0: first, 1: second}, "missing": {0: make_batch()}})
    produce(broker, {"orders": {0: make_batch([b"e", b"f"])}})
    sample = parse(metrics.render(metrics.gather_requests()))
    size = len(first) + len(second) + len(make_batch([b"e", b"f"]))
    assert value(sample, "kafka_server_bytes_in_total", topic="orders") == size
    assert value(sample, "kafka_server_messages_in_total", topic="orders") == 6
    # Nothing was appended to the unknown topic.
    assert value(sample, "kafka_server_messages_in_total", topic="missing") is None


def test_scrape_reports_logs_partitions_and_group_lag(broker: Broker) -> None:
    metrics = BrokerMetrics()
    add_topic(broker, "orders", partitions=2)
    batch = make_batch([b"x"] * 5)
    orders0 = broker.partitions.get("orders", 0)
    orders1 = broker.partitions.get("orders", 1)
    assert orders0 is not None and orders1 is not None
    orders0.append(bytearray(batch))
    closed = add_topic(broker, "closing") and broker.partitions.get("closing", 0)
    assert closed is not None
    closed.log.close()
    state = ScrapeState(
        partitions=[
            ("orders", 0, orders0.log, 5),
            ("orders", 1, orders1.log, 0),
            ("closing", 0, closed.log, 0),
        ],
        missing=[("gone", 3)],
        groups=[
            GroupState("billing", "Stable", 2, [("orders", 0, 2), ("orders", 1, 0), ("old", 0, 9)]),
            GroupState("ahead", "Empty", 0, [("orders", 0, 7)]),
        ],
        bytes_in={},
        bytes_out={"orders": 1234},
    )
    sample = parse(metrics.render(state))
    tp0 = {"topic": "orders", "partition": "0"}
    assert value(sample, "kafka_log_size_bytes", **tp0) == len(batch)
    assert value(sample, "kafka_log_segments", **tp0) == 1
    assert value(sample, "kafka_topic_partition_current_offset", **tp0) == 5
    assert value(sample, "kafka_topic_partition_oldest_offset", **tp0) == 0
    assert value(sample, "kafka_log_size_bytes", topic="orders", partition="1") == 0
    assert value(sample, "kafka_server_bytes_out_total", topic="orders") == 1234
    assert value(sample, "kafka_server_leader_partitions") == 3
    # The partition whose log is closed and the one the metadata names but no log serves.
    assert value(sample, "kafka_controller_offline_partitions") == 2
    assert value(sample, "kafka_log_size_bytes", topic="closing", partition="0") is None
    assert value(sample, "kafka_server_under_replicated_partitions") == 0
    assert value(sample, "kafka_controller_active_controller") == 1

    billing = {"consumergroup": "billing"}
    assert value(sample, "kafka_consumergroup_state", state="Stable", **billing) == 1
    assert value(sample, "kafka_consumergroup_members", **billing) == 2
    assert value(sample, "kafka_consumergroup_current_offset", **billing, **tp0) == 2
    assert value(sample, "kafka_consumergroup_lag", **billing, **tp0) == 3
    assert value(sample, "kafka_consumergroup_lag", topic="orders", partition="1", **billing) == 0
    # An offset of a partition this broker has no log for: committed, but no lag to tell.
    old = {"topic": "old", "partition": "0", **billing}
    assert value(sample, "kafka_consumergroup_current_offset", **old) == 9
    assert value(sample, "kafka_consumergroup_lag", **old) is None
    assert value(sample, "kafka_consumergroup_lag_sum", **billing) == 3
    # A commit past the high watermark is not a negative lag.
    ahead = {"consumergroup": "ahead", **tp0}
    assert value(sample, "kafka_consumergroup_lag", **ahead) == 0


def test_requests_count_times_and_error_names() -> None:
    metrics = BrokerMetrics()
    metrics.request_done(ApiKey.PRODUCE, [], 0.004, 0.001, 0.003)
    metrics.request_done(
        ApiKey.PRODUCE,
        [ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.NOT_LEADER_OR_FOLLOWER],
        0.002,
        0.002,
        0.0,
    )
    metrics.request_done(ApiKey.FIND_COORDINATOR, [15], 0.0001, 0.0001, 0.0)
    metrics.observe_fsync(0.0007)
    sample = parse(metrics.render(metrics.gather_requests()))
    assert value(sample, "kafka_network_requests_total", api="Produce") == 2
    assert value(sample, "kafka_network_requests_total", api="FindCoordinator") == 1
    errors = "kafka_network_request_errors_total"
    assert value(sample, errors, api="Produce", error="NOT_LEADER_OR_FOLLOWER") == 2
    assert value(sample, errors, api="FindCoordinator", error="COORDINATOR_NOT_AVAILABLE") == 1
    total = "kafka_network_request_total_time_seconds"
    assert value(sample, f"{total}_count", api="Produce") == 2
    assert value(sample, f"{total}_sum", api="Produce") == pytest.approx(0.006)
    assert value(sample, f"{total}_bucket", api="Produce", le="0.0025") == 1
    # Buckets hold what is at most their bound (Prometheus' le), the bound included.
    assert value(sample, f"{total}_bucket", api="FindCoordinator", le="0.0001") == 1
    assert value(sample, f"{total}_bucket", api="Produce", le="+Inf") == 2
    remote = "kafka_network_request_remote_time_seconds"
    assert value(sample, f"{remote}_sum", api="Produce") == pytest.approx(0.003)
    assert value(sample, "kafka_log_flush_time_seconds_count") == 1
    assert value(sample, "kafka_log_flush_time_seconds_bucket", le="0.001") == 1
    assert value(sample, "kafka_log_flush_time_seconds_bucket", le="0.0005") == 0
    # No series per child creation time: they would double the scrape.
    assert not any(name.endswith("_created") for name, _ in sample)


def test_error_codes_of_responses(broker: Broker) -> None:
    add_topic(broker, "orders")
    response = produce(broker, {"orders": {0: make_batch(), 5: make_batch()}, "nope": {0: None}})
    assert sorted(error_codes(response)) == [3, 3]  # UNKNOWN_TOPIC_OR_PARTITION twice
    fetch = encode_fetch_response(
        12,
        [TopicResult("orders", None, [PartitionResult(0), PartitionResult(1, error_code=1)])],
        error_code=0,
    )
    assert error_codes(fetch) == [1]
    assert error_codes(encode_fetch_response(12, [], error_code=70)) == [70]


def test_api_names_are_kafkas() -> None:
    assert api_name(ApiKey.PRODUCE) == "Produce"
    assert api_name(ApiKey.API_VERSIONS) == "ApiVersions"
    assert api_name(ApiKey.OFFSET_COMMIT) == "OffsetCommit"


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("", None),
        ("http://127.0.0.1:9404", ("127.0.0.1", 9404)),
        ("http://:9404", ("", 9404)),
        ("HTTP://[::1]:0", ("::1", 0)),
    ],
)
def test_metrics_listener_values(text: str, address: tuple[str, int] | None) -> None:
    assert BrokerConfig({"metrics.listener": text}).metrics_listener == address


@pytest.mark.parametrize(
    "text",
    ["9404", "127.0.0.1:9404", "https://h:9404", "http://h:port", "http://h:70000", "http://h:1/x"],
)
def test_metrics_listener_refuses(text: str) -> None:
    with pytest.raises(ConfigError, match="expected http://host:port"):
        BrokerConfig({"metrics.listener": text})


def test_every_fsync_round_reaches_the_observer(tmp_path: Path, clock: Any) -> None:
    rounds: list[float] = []
    logs = LogManager([tmp_path / "logs"], clock=clock, on_sync=rounds.append)
    logs.open()
    try:
        log = logs.get_or_create_log("orders", 0)
        log.append(bytearray(make_batch()))
        assert log.sync()
        log.append(bytearray(make_batch()))
        assert log.sync()
        # Nothing new to make durable: no fsync round, nothing observed.
        log.sync()
        assert len(rounds) == 2 and all(seconds >= 0 for seconds in rounds)
    finally:
        logs.close()


async def _get(port: int, path: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
    await writer.drain()
    answer = await reader.read()
    writer.close()
    head, _, body = answer.decode().partition("\r\n\r\n")
    return int(head.split(" ", 2)[1]), body


def test_ready_says_why_not_in_one_line(tmp_path: Path) -> None:
    config = BrokerConfig(
        {
            "log.dirs": str(tmp_path / "data"),
            "listeners": "PLAINTEXT://127.0.0.1:0",
            "metrics.listener": "http://127.0.0.1:0",
        }
    )

    async def scenario() -> list[tuple[int, str]]:
        app = BrokerApp(config)
        assert app.not_ready_reason() == "starting: metadata and logs are being loaded"
        await app.start()
        try:
            assert app.metrics_server is not None
            port = app.metrics_server.port
            answers = [await _get(port, "/ready"), await _get(port, "/health")]
            assert app.broker is not None
            app.broker.begin_stopping()
            answers.append(await _get(port, "/ready"))
            return answers
        finally:
            await app.stop()

    assert asyncio.run(scenario()) == [
        (200, "ready\n"),
        (200, "up\n"),
        (503, "not ready: stopping\n"),
    ]


def test_request_queue_size_and_time_split_over_a_real_connection(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request is in the listener's queue from the moment it is taken until its answer
    is sent, deferred or not; a client that hangs up takes its unanswered ones away."""
    from tidelog.broker.handlers import HANDLERS, api_versions
    from tidelog.broker.reply import Deferred

    from .test_server import _serve, api_versions_v3

    metrics = BrokerMetrics()
    broker.metrics = metrics
    original = api_versions.handle_api_versions
    release = asyncio.Event()
    handled: list[int] = []

    async def held(ctx: Any, request: Any) -> Any:
        response = await original(ctx, request)
        handled.append(ctx.header.correlation_id)

        async def later() -> Any:
            await release.wait()
            return response

        return Deferred(later())

    monkeypatch.setitem(HANDLERS, ApiKey.API_VERSIONS, held)

    def queued() -> dict[str, int]:
        return metrics.gather_requests().queues

    async def until(check: Any) -> None:
        for _ in range(500):
            if check():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("condition not reached")

    async def scenario() -> None:
        async for _, connect in _serve(broker):
            client = await connect()
            await client.send(api_versions_v3(1) + api_versions_v3(2) + api_versions_v3(3))
            await until(lambda: len(handled) == 3)
            assert queued() == {"PLAINTEXT": 3}
            release.set()
            for _ in range(3):
                await client.frame()
            await until(lambda: queued() == {"PLAINTEXT": 0})
            client.close()

            release.clear()
            gone = await connect()
            await gone.send(api_versions_v3(4))
            await until(lambda: queued() == {"PLAINTEXT": 1})
            gone.close()
            await until(lambda: queued() == {"PLAINTEXT": 0})

            # A handler that fails closes its connection: its request leaves the queue.
            monkeypatch.setitem(HANDLERS, ApiKey.API_VERSIONS, failing)
            broken = await connect()
            await broken.send(api_versions_v3(5))
            assert await broken.closed_by_peer()
            await until(lambda: queued() == {"PLAINTEXT": 0})

    async def failing(ctx: Any, request: Any) -> Any:
        raise RuntimeError("a handler bug")

    asyncio.run(scenario())
    sample = parse(metrics.render(metrics.gather_requests()))
    assert value(sample, "kafka_network_request_queue_size", listener="PLAINTEXT") == 0
    # The three answered requests have every part of the split; the dropped one none.
    for part in ("total", "queue", "local", "remote", "response_send"):
        name = f"kafka_network_request_{part}_time_seconds_count"
        assert value(sample, name, api="ApiVersions") == 3, part
    # Two frames waited behind the handler of the first one read with them.
    total = value(sample, "kafka_network_request_total_time_seconds_sum", api="ApiVersions")
    parts = sum(
        value(sample, f"kafka_network_request_{part}_time_seconds_sum", api="ApiVersions") or 0
        for part in ("queue", "local", "remote", "response_send")
    )
    assert total == pytest.approx(parts)


def test_idle_ratios_cover_the_time_since_the_previous_scrape() -> None:
    wall, cpu = [100.0], [5.0]
    metrics = BrokerMetrics(idle_clocks=(lambda: wall[0], lambda: cpu[0]))
    wall[0], cpu[0] = 110.0, 7.0  # 10 s: the loop thread used 2 s of CPU
    metrics.request_done(ApiKey.PRODUCE, [], 6.0, 4.0, 2.0)  # 4 s in a handler
    first = parse(metrics.render(metrics.gather_requests()))
    assert value(first, "kafka_network_processor_avg_idle_ratio") == pytest.approx(0.8)
    assert value(first, "kafka_server_request_handler_avg_idle_ratio") == pytest.approx(0.6)
    wall[0], cpu[0] = 120.0, 7.0  # the next 10 s: nothing ran
    second = parse(metrics.render(metrics.gather_requests()))
    assert value(second, "kafka_network_processor_avg_idle_ratio") == 1.0
    assert value(second, "kafka_server_request_handler_avg_idle_ratio") == 1.0


def test_quorum_and_coordinator_figures() -> None:
    metrics = BrokerMetrics()
    metrics.observe_commit(0.004)
    metrics.observe_commit(0.2)
    metrics.observe_election(1.3)
    quorum = QuorumFigures(
        leader=2,
        epoch=7,
        role="leader",
        high_watermark=120,
        log_end_offset=125,
        applied_offset=117,
        voters={1: 125, 2: 125, 3: 100, 4: -1},
        fenced_brokers=1,
        active_brokers=2,
        commit_latency=metrics.commit_latency.copy(),
        election_latency=metrics.election_latency.copy(),
    )
    state = ScrapeState(
        groups=[GroupState("a", "Stable", 1, []), GroupState("b", "Stable", 2, [])],
        group_partitions_loading=3,
        transactions=TransactionFigures({"Ongoing": 2, "CompleteCommit": 5}, 5, 1, 1, 0),
        active_controller=False,
        quorum=quorum,
    )
    sample = parse(metrics.render(state))
    assert value(sample, "kafka_raft_current_leader") == 2
    assert value(sample, "kafka_raft_current_epoch") == 7
    assert value(sample, "kafka_raft_current_state", state="leader") == 1
    assert value(sample, "kafka_raft_high_watermark") == 120
    assert value(sample, "kafka_raft_log_end_offset") == 125
    assert value(sample, "kafka_raft_voter_lag", voter="3") == 25
    assert value(sample, "kafka_raft_voter_lag", voter="1") == 0
    # A voter not heard from in this epoch has no figure rather than a made-up one.
    assert value(sample, "kafka_raft_voter_log_end_offset", voter="4") is None
    assert value(sample, "kafka_raft_commit_latency_seconds_count") == 2
    assert value(sample, "kafka_raft_commit_latency_seconds_bucket", le="0.005") == 1
    assert value(sample, "kafka_raft_election_latency_seconds_sum") == pytest.approx(1.3)
    assert value(sample, "kafka_controller_fenced_broker_count") == 1
    assert value(sample, "kafka_controller_active_broker_count") == 2
    assert value(sample, "kafka_controller_active_controller") == 0
    assert value(sample, "kafka_server_metadata_last_applied_offset") == 117
    assert value(sample, "kafka_server_metadata_apply_lag") == 2  # offsets 118 and 119
    assert value(sample, "kafka_coordinator_group_groups", state="Stable") == 2
    assert value(sample, "kafka_coordinator_group_groups", state="Empty") == 0
    assert value(sample, "kafka_coordinator_group_partitions_loading") == 3
    txn = "kafka_coordinator_transaction"
    assert value(sample, f"{txn}_transactions", state="Ongoing") == 2
    assert value(sample, f"{txn}_transactions", state="PrepareCommit") == 0
    assert value(sample, f"{txn}_completed_total", result="commit") == 5
    assert value(sample, f"{txn}_completed_total", result="abort") == 1
    assert value(sample, f"{txn}_timed_out_total") == 1
    assert value(sample, f"{txn}_partitions_loading") == 0


def test_isr_counts_come_from_the_metadata_of_partitions_led_here(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    me = broker.node_id
    others = (me + 1, me + 2)
    replicas = (me, *others)

    def part(index: int, isr: tuple[int, ...], leader: int = me) -> PartitionImage:
        return PartitionImage(index, replicas, isr, leader, 0, 0)

    topic = TopicImage(
        "orders",
        uuid.uuid4(),
        {
            0: part(0, replicas),  # whole ISR
            1: part(1, (me, others[0])),  # one follower out: under-replicated
            2: part(2, (me,)),  # alone: under-replicated and under min.insync.replicas=2
            3: part(3, (others[0],), leader=others[0]),  # led elsewhere: not counted here
        },
    )
    image = dataclasses.replace(
        MetadataImage.empty(),
        topics_by_name={"orders": topic},
        topics_by_id={topic.topic_id: topic},
        topic_configs={"orders": {"min.insync.replicas": "2"}},
    )
    monkeypatch.setattr(Broker, "image", property(lambda self: image))
    monkeypatch.setattr(Broker, "config", property(lambda self: BrokerConfig({})))
    state = BrokerMetrics().gather(broker)
    assert (state.under_replicated, state.under_min_isr) == (2, 1)
    sample = parse(BrokerMetrics().render(state))
    assert value(sample, "kafka_server_under_replicated_partitions") == 2
    assert value(sample, "kafka_server_under_min_isr_partitions") == 1
    # The image says three partitions are led here and no log serves them.
    assert value(sample, "kafka_controller_offline_partitions") == 3


def test_lag_in_seconds_is_the_age_of_the_first_record_not_consumed(broker: Broker) -> None:
    add_topic(broker, "orders", partitions=2)
    orders = broker.partitions.get("orders", 0)
    quiet = broker.partitions.get("orders", 1)
    assert orders is not None and quiet is not None
    t0 = 1_700_000_000_000
    orders.append(bytearray(make_batch([b"a", b"b"], timestamp=t0)))  # offsets 0-1
    orders.append(bytearray(make_batch([b"c", b"d"], timestamp=t0 + 60_000)))  # offsets 2-3
    quiet.append(bytearray(make_batch([b"e"], timestamp=t0)))
    state = ScrapeState(
        partitions=[("orders", 0, orders.log, 4), ("orders", 1, quiet.log, 1)],
        groups=[
            GroupState("slow", "Stable", 1, [("orders", 0, 2), ("orders", 1, 1)]),
            GroupState("stuck", "Empty", 0, [("orders", 0, 0)]),
        ],
        now_ms=t0 + 90_000,
    )
    sample = parse(BrokerMetrics().render(state))
    name = "kafka_consumergroup_lag_seconds"
    # The next record "slow" will read was written 30 s before the scrape; "stuck" has not
    # read one 90 s old; a caught-up partition is 0 s behind.
    assert value(sample, name, consumergroup="slow", topic="orders", partition="0") == 30
    assert value(sample, name, consumergroup="stuck", topic="orders", partition="0") == 90
    assert value(sample, name, consumergroup="slow", topic="orders", partition="1") == 0
