"""The broker's Prometheus metrics and its health endpoints, on their own HTTP listener.

``metrics.listener`` (``http://host:port``, empty: off) names the address. The listener
runs in the broker's event loop: one small HTTP/1.1 handler per connection, no thread per
request. Three paths, every other one is 404:

* ``/metrics`` — Prometheus text format (``prometheus_client``'s encoder); the names are
  documented in ``docs/operations.md``;
* ``/health`` — 200 while the process is up;
* ``/ready`` — 200 once the broker serves (metadata applied, listeners open, every
  ``__consumer_offsets`` partition loaded by the group coordinator), else 503 with the
  reason on one line.

What is counted where. The request path only increments: :meth:`BrokerMetrics.request_done`
once per request (from the connection), :meth:`BrokerMetrics.produced` once per appended
partition of a Produce request and :meth:`BrokerMetrics.fetched` once per partition of a
Fetch response that carries records (never per record), ``observe_fsync`` once per fsync round (a worker thread, through the
log's ``on_sync`` hook). Everything else — log sizes and segment counts, partition counts,
the groups' offsets and lag — is computed at scrape time from the live logs and the group
coordinator. A scrape reads the state owned by the event loop on the loop (a copy of a few
numbers per partition and group), then renders the text in a worker thread, so that a
broker with thousands of partitions does not hold up requests while a scrape is encoded.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Histogram, disable_created_metrics
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.utils import floatToGoString

from tidelog.broker.reply import EncodedResponse
from tidelog.protocol import ApiKey
from tidelog.protocol.error_codes import error_name
from tidelog.runtime.http_endpoints import Answer, EndpointServer, health, readiness_answer
from tidelog.storage import StorageError

if TYPE_CHECKING:
    from tidelog.broker.broker import Broker

_log = logging.getLogger(__name__)

#: Request times span a Metadata answered from memory (~100 µs) to a Fetch long poll
#: (``fetch.max.wait.ms``, 500 ms by default, up to the client's choice).
REQUEST_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
#: An fdatasync on an SSD takes tens of µs to a few ms; a loaded disk, far longer.
FSYNC_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
)  # fmt: skip

# A ``*_created`` series per labelled child doubles the scrape for a figure nobody alerts on;
# Prometheus infers counter resets without it. (Process-wide: this module is the broker's.)
disable_created_metrics()  # type: ignore[no-untyped-call]


def api_name(api_key: int) -> str:
    """Kafka's name of an API (``Produce``, ``Fetch``, ``ApiVersions``...)."""
    try:
        return "".join(part.capitalize() for part in ApiKey(api_key).name.split("_"))
    except ValueError:
        return str(api_key)


# -- the error codes of a response -------------------------------------------------------


class _Plan:
    """Where the error codes of one response (or entity) class are: its own ``error_code``
    field and the tuple fields that hold entities. Built once per class, so a response is
    walked without inspecting its schema again."""

    __slots__ = ("codes", "nested")

    def __init__(self, instance: Any) -> None:
        names = [f.name for f in fields(instance)]
        self.codes = [n for n in names if n == "error_code"]
        self.nested = [n for n in names if isinstance(getattr(instance, n), tuple)]


_PLANS: dict[type, _Plan] = {}


def _walk(entity: Any, out: list[int]) -> None:
    plan = _PLANS.get(type(entity))
    if plan is None:
        plan = _PLANS[type(entity)] = _Plan(entity)
    for name in plan.codes:
        code = getattr(entity, name)
        if code:
            out.append(int(code))
    for name in plan.nested:
        items = getattr(entity, name)
        if items and is_dataclass(items[0]):
            for item in items:
                _walk(item, out)


def error_codes(response: object) -> list[int]:
    """The non-zero error codes a response carries, top level and per topic/partition/group
    (what Kafka's ``ErrorsPerSec`` counts), for a kio response or a pre-encoded one."""
    if isinstance(response, EncodedResponse):
        return list(response.error_codes)
    out: list[int] = []
    if is_dataclass(response) and not isinstance(response, type):
        _walk(response, out)
    return out


# -- the metrics ------------------------------------------------------------------------


class _Timer:
    """A histogram kept on the event loop only: bucket counts and a sum, no lock (each
    ``prometheus_client`` observation takes a lock and scans the buckets; per request that
    was a measurable share of a small request's cost)."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        #: one count per bucket of REQUEST_BUCKETS, then +Inf; not cumulative
        self.counts = [0] * (len(REQUEST_BUCKETS) + 1)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(REQUEST_BUCKETS, seconds)] += 1
        self.sum += seconds

    def copy(self) -> tuple[list[int], float]:
        return list(self.counts), self.sum


class _ApiStats:
    """The request figures of one API."""

    __slots__ = ("api", "local", "remote", "total")

    def __init__(self, api: str) -> None:
        self.api = api
        self.total = _Timer()
        self.local = _Timer()
        self.remote = _Timer()


#: (api, total, local, remote) copies of each :class:`_Timer` as (counts, sum)
RequestCopy = tuple[str, tuple[list[int], float], tuple[list[int], float], tuple[list[int], float]]


class BrokerMetrics:
    """The counters the request path increments and the scrape-time view of the broker.

    Request figures, bytes and records are plain numbers touched on the event loop only
    (copied on the loop when scraped); the fsync histogram, observed from worker threads,
    is a ``prometheus_client`` histogram.
    """

    def __init__(self) -> None:
        registry = CollectorRegistry(auto_describe=False)
        self.registry = registry
        self.fsync_time = Histogram(
            "kafka_log_flush_time_seconds",
            "Duration of each fsync round of a partition log (group commit: one round "
            "serves every write waiting for it).",
            buckets=FSYNC_BUCKETS,
            registry=registry,
        )
        self._apis: dict[int, _ApiStats] = {}
        #: (api name, error name) -> responses' error codes other than NONE
        self._errors: dict[tuple[str, str], int] = {}
        #: topic -> [bytes, records] appended by Produce; topic -> bytes sent by Fetch.
        self._in: dict[str, list[int]] = {}
        self._out: dict[str, int] = {}

    # -- the request path ---------------------------------------------------------------

    @staticmethod
    def error_codes_of(response: object) -> list[int]:
        return error_codes(response)

    def request_done(
        self, api_key: int, codes: Iterable[int], total: float, local: float, remote: float
    ) -> None:
        """One request answered (or, with acks=0, handled): its times in seconds and the
        error codes of its response."""
        stats = self._apis.get(api_key)
        if stats is None:
            stats = self._apis[api_key] = _ApiStats(api_name(api_key))
        stats.total.observe(total)
        stats.local.observe(local)
        stats.remote.observe(remote)
        for code in codes:
            key = (stats.api, error_name(code))
            self._errors[key] = self._errors.get(key, 0) + 1

    def produced(self, topic: str, size: int, records: int) -> None:
        counts = self._in.get(topic)
        if counts is None:
            self._in[topic] = [size, records]
        else:
            counts[0] += size
            counts[1] += records

    def fetched(self, topic: str, size: int) -> None:
        self._out[topic] = self._out.get(topic, 0) + size

    def observe_fsync(self, seconds: float) -> None:
        self.fsync_time.observe(seconds)

    # -- scrapes ------------------------------------------------------------------------

    def gather_requests(self) -> ScrapeState:
        """The counters of the request path, copied (on the event loop)."""
        return ScrapeState(
            requests=[
                (s.api, s.total.copy(), s.local.copy(), s.remote.copy())
                for s in self._apis.values()
            ],
            errors=dict(self._errors),
            bytes_in={t: tuple(c) for t, c in self._in.items()},
            bytes_out=dict(self._out),
        )

    def gather(self, broker: Broker) -> ScrapeState:
        """What a scrape needs from state owned by the event loop; call it on the loop."""
        state = self.gather_requests()
        image = broker.image
        partitions = sorted((p.topic, p.index, p.log, p.high_watermark) for p in broker.partitions)
        led = {(p.topic, p.index) for p in broker.partitions}
        expected = [
            (topic.name, index)
            for topic in image.topics_by_name.values()
            for index, part in topic.partitions.items()
            if part.leader == broker.node_id
        ]
        groups: list[GroupState] = []
        driver = broker.groups
        if driver is not None and not driver.stopped:
            for group_id, snap in driver.coordinator.snapshot().items():
                groups.append(
                    GroupState(
                        group_id,
                        snap.state,
                        len(snap.members),
                        [(t, p, o.offset) for t, p, o in snap.offsets],
                    )
                )
        state.partitions = partitions
        state.missing = [tp for tp in expected if tp not in led]
        state.groups = groups
        return state

    def render(self, state: ScrapeState) -> bytes:
        """The text of a scrape (safe in a worker thread: logs are thread-safe, the rest is
        the copy ``state`` holds)."""
        return generate_latest(_Scrape(self.registry, state))


@dataclass
class GroupState:
    group_id: str
    state: str
    members: int
    offsets: list[tuple[str, int, int]]


@dataclass
class ScrapeState:
    requests: list[RequestCopy] = field(default_factory=list)
    errors: dict[tuple[str, str], int] = field(default_factory=dict)
    bytes_in: dict[str, tuple[int, ...]] = field(default_factory=dict)
    bytes_out: dict[str, int] = field(default_factory=dict)
    #: (topic, partition, log, high watermark) of every partition this broker leads
    partitions: list[tuple[str, int, Any, int]] = field(default_factory=list)
    #: partitions the metadata says this broker leads but which have no open log
    missing: list[tuple[str, int]] = field(default_factory=list)
    groups: list[GroupState] = field(default_factory=list)
    #: False while the broker is starting: no partition or group figures yet
    broker: bool = True


class _Scrape:
    """A registry-like view for ``generate_latest``: the live counters and histograms, then
    the families computed from one :class:`ScrapeState`."""

    def __init__(self, registry: CollectorRegistry, state: ScrapeState) -> None:
        self._registry = registry
        self._state = state

    def collect(self) -> Iterator[Metric]:
        yield from scrape_families(self._state)
        yield from self._registry.collect()


def _histogram(name: str, documentation: str) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, documentation, labels=["api"])


def _add_timer(family: HistogramMetricFamily, api: str, timer: tuple[list[int], float]) -> None:
    counts, total = timer
    cumulative = list(itertools.accumulate(counts))
    buckets = [
        (floatToGoString(le), n)  # type: ignore[no-untyped-call]
        for le, n in zip(REQUEST_BUCKETS, cumulative, strict=False)
    ]
    buckets.append(("+Inf", cumulative[-1]))
    family.add_metric([api], buckets, total)


def request_families(state: ScrapeState) -> Iterable[Metric]:
    requests = CounterMetricFamily(
        "kafka_network_requests",
        "Requests answered (Produce with acks=0: handled), by API.",
        labels=["api"],
    )
    errors = CounterMetricFamily(
        "kafka_network_request_errors",
        "Error codes other than NONE in responses, by API and Kafka error name "
        "(a response with several failed partitions counts each).",
        labels=["api", "error"],
    )
    total = _histogram(
        "kafka_network_request_total_time_seconds",
        "From the request read off the socket to its response sent.",
    )
    local = _histogram(
        "kafka_network_request_local_time_seconds",
        "Time in the API handler on the event loop (validation, append, reads).",
    )
    remote = _histogram(
        "kafka_network_request_remote_time_seconds",
        "From the handler's return to the answer being ready: the fsync of an acks=all "
        "Produce, a Fetch long poll, a rebalance; 0 for requests answered at once.",
    )
    for api, total_timer, local_timer, remote_timer in sorted(state.requests):
        requests.add_metric([api], sum(total_timer[0]))
        _add_timer(total, api, total_timer)
        _add_timer(local, api, local_timer)
        _add_timer(remote, api, remote_timer)
    for (api, error), count in sorted(state.errors.items()):
        errors.add_metric([api, error], count)
    yield from (requests, errors, total, local, remote)


def scrape_families(state: ScrapeState) -> Iterable[Metric]:
    yield from request_families(state)
    if not state.broker:
        return
    topic = ["topic"]
    bytes_in = CounterMetricFamily(
        "kafka_server_bytes_in", "Record batch bytes appended by Produce, by topic.", labels=topic
    )
    messages_in = CounterMetricFamily(
        "kafka_server_messages_in", "Records appended by Produce, by topic.", labels=topic
    )
    for name, (appended, records) in sorted(state.bytes_in.items()):
        bytes_in.add_metric([name], appended)
        messages_in.add_metric([name], records)
    bytes_out = CounterMetricFamily(
        "kafka_server_bytes_out",
        "Record batch bytes sent in Fetch responses, by topic.",
        labels=topic,
    )
    for name, sent in sorted(state.bytes_out.items()):
        bytes_out.add_metric([name], sent)
    yield from (bytes_in, messages_in, bytes_out)

    tp = ["topic", "partition"]
    size = GaugeMetricFamily(
        "kafka_log_size_bytes", "Bytes of the partition's segments.", labels=tp
    )
    segments = GaugeMetricFamily("kafka_log_segments", "Segments of the partition.", labels=tp)
    end = GaugeMetricFamily(
        "kafka_topic_partition_current_offset",
        "High watermark: the offset of the next record consumers will see.",
        labels=tp,
    )
    start = GaugeMetricFamily(
        "kafka_topic_partition_oldest_offset", "Log start offset of the partition.", labels=tp
    )
    high_watermarks: dict[tuple[str, int], int] = {}
    offline = len(state.missing)
    for name, index, log, high_watermark in state.partitions:
        if log.closed:
            # Being deleted, or its disk failed: the partition cannot be served.
            offline += 1
            continue
        try:
            log_size = log.size_in_bytes
            segment_count = len(log.segments)
            log_start = log.log_start_offset
        except (StorageError, OSError):
            # The log is closed or its disk failed: the partition cannot be served.
            offline += 1
            continue
        labels = [name, str(index)]
        size.add_metric(labels, log_size)
        segments.add_metric(labels, segment_count)
        end.add_metric(labels, high_watermark)
        start.add_metric(labels, log_start)
        high_watermarks[(name, index)] = high_watermark
    yield from (size, segments, end, start)

    yield _gauge(
        "kafka_server_leader_partitions",
        "Partitions this broker leads (internal topics included).",
        len(state.partitions),
    )
    yield _gauge(
        "kafka_server_under_replicated_partitions",
        "Partitions whose ISR is smaller than their replica set (single node: always 0, "
        "every partition has one replica).",
        0,
    )
    yield _gauge(
        "kafka_server_under_min_isr_partitions",
        "Partitions whose ISR is below min.insync.replicas (single node: always 0).",
        0,
    )
    yield _gauge(
        "kafka_controller_offline_partitions",
        "Partitions led here by the metadata whose log is not open or not readable.",
        offline,
    )
    yield _gauge(
        "kafka_controller_active_controller",
        "1 on the node that is the active controller (a single node always is).",
        1,
    )

    group = ["consumergroup"]
    group_state = GaugeMetricFamily(
        "kafka_consumergroup_state",
        "1 for the group's current state (Empty, PreparingRebalance, CompletingRebalance, "
        "Stable, Dead).",
        labels=["consumergroup", "state"],
    )
    members = GaugeMetricFamily(
        "kafka_consumergroup_members", "Members of the group.", labels=group
    )
    gtp = ["consumergroup", "topic", "partition"]
    committed = GaugeMetricFamily(
        "kafka_consumergroup_current_offset", "The group's committed offset.", labels=gtp
    )
    lag = GaugeMetricFamily(
        "kafka_consumergroup_lag",
        "High watermark minus the committed offset (0 when the commit is ahead).",
        labels=gtp,
    )
    group_lag = GaugeMetricFamily(
        "kafka_consumergroup_lag_sum", "The group's lag summed over its partitions.", labels=group
    )
    for g in sorted(state.groups, key=lambda g: g.group_id):
        group_state.add_metric([g.group_id, g.state], 1)
        members.add_metric([g.group_id], g.members)
        total = 0
        for name, index, offset in g.offsets:
            labels = [g.group_id, name, str(index)]
            committed.add_metric(labels, offset)
            known = high_watermarks.get((name, index))
            if known is not None:
                behind = max(known - offset, 0)
                lag.add_metric(labels, behind)
                total += behind
        group_lag.add_metric([g.group_id], total)
    yield from (group_state, members, committed, lag, group_lag)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


# -- the HTTP listener ------------------------------------------------------------------


class MetricsServer(EndpointServer):
    """``/metrics``, ``/health`` and ``/ready`` on the broker's event loop.

    ``ready()`` gives None when the broker serves, else the one-line reason it does not.
    """

    def __init__(
        self,
        metrics: BrokerMetrics,
        host: str,
        port: int,
        *,
        broker: Callable[[], Broker | None],
        ready: Callable[[], str | None],
    ) -> None:
        super().__init__(
            host,
            port,
            {"/metrics": self._metrics, "/health": health, "/ready": self._readiness},
        )
        self.metrics = metrics
        self._broker = broker
        self._ready = ready

    async def _readiness(self) -> Answer:
        return readiness_answer(self._ready())

    async def _metrics(self) -> Answer:
        return 200, CONTENT_TYPE_LATEST, await self.scrape()

    async def scrape(self) -> bytes:
        broker = self._broker()
        started = time.perf_counter()
        if broker is None:
            # Still starting: the counters exist, the partitions and groups not yet.
            state = self.metrics.gather_requests()
            state.broker = False
        else:
            state = self.metrics.gather(broker)
        gathered = time.perf_counter()
        text = await asyncio.to_thread(self.metrics.render, state)
        _log.debug(
            "scrape: %.1f ms on the loop, %.1f ms rendering",
            (gathered - started) * 1000,
            (time.perf_counter() - gathered) * 1000,
        )
        return text
