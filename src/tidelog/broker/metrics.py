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
once per request (from the connection), the listener's request queue size once when a
request is taken and once when it is answered, :meth:`BrokerMetrics.produced` once per
appended partition of a Produce request and :meth:`BrokerMetrics.fetched` once per partition
of a Fetch response that carries records (never per record), ``observe_fsync`` once per
fsync round (a worker thread, through the log's ``on_sync`` hook). Everything else — log
sizes and segment counts, partition and ISR counts, the groups' offsets and lag (in records
and in seconds), the coordinators' figures — is computed at scrape time from the live logs,
the metadata image and the coordinators; the quorum's figures from the Raft driver (two
hooks time proposals and elections); the idle ratios from the event loop thread's CPU time
and the handlers' time since the previous scrape. A scrape reads the state owned by the
event loop on the loop (a copy of a few numbers per partition and group), then renders the
text in a worker thread, so that a broker with thousands of partitions does not hold up
requests while a scrape is encoded.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
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
from tidelog.records.batch import HEADER_SIZE, parse_header
from tidelog.runtime.http_endpoints import Answer, EndpointServer, health, readiness_answer
from tidelog.storage import StorageError

if TYPE_CHECKING:
    from tidelog.broker.broker import Broker
    from tidelog.broker.connection_limits import ConnectionLimiter
    from tidelog.broker.quorum import QuorumNode
    from tidelog.broker.quotas import QuotaFigure

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
#: A metadata commit is one fsync and a round trip to a majority (ms); an election waits out
#: ``controller.quorum.election.timeout.ms`` (1 s by default) and more.
QUORUM_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
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

    __slots__ = ("buckets", "counts", "sum")

    def __init__(self, buckets: tuple[float, ...] = REQUEST_BUCKETS) -> None:
        self.buckets = buckets
        #: one count per bucket, then +Inf; not cumulative
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.buckets, seconds)] += 1
        self.sum += seconds

    def copy(self) -> TimerCopy:
        return list(self.counts), self.sum


#: A :class:`_Timer` copied: (bucket counts, sum)
TimerCopy = tuple[list[int], float]


class _ApiStats:
    """The request figures of one API."""

    __slots__ = ("api", "local", "queue", "remote", "send", "total")

    def __init__(self, api: str) -> None:
        self.api = api
        self.total = _Timer()
        self.queue = _Timer()
        self.local = _Timer()
        self.remote = _Timer()
        self.send = _Timer()


@dataclass
class RequestCopy:
    """The figures of one API, copied for a scrape."""

    api: str
    total: TimerCopy
    local: TimerCopy
    remote: TimerCopy
    queue: TimerCopy = field(default_factory=lambda: _Timer().copy())
    send: TimerCopy = field(default_factory=lambda: _Timer().copy())


class Count:
    """One number the request path moves (a listener's request queue size)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0


class _IdleWindow:
    """The idle ratios since the previous scrape (Kafka's ``NetworkProcessorAvgIdlePercent``
    and ``RequestHandlerAvgIdlePercent``, as a ratio).

    The event loop is the network thread: its idle share is one minus the loop thread's
    CPU time over the wall time (a loop waiting in epoll, or for the GIL a worker thread
    holds, uses none). The handlers are busy for the local time of each request (summed
    from the request figures, nothing more is counted per request). Read on the loop thread
    only: ``time.thread_time`` is the calling thread's."""

    def __init__(
        self,
        wall: Callable[[], float] = time.perf_counter,
        cpu: Callable[[], float] = time.thread_time,
    ) -> None:
        self._wall = wall
        self._cpu = cpu
        self.at = wall()
        self.cpu = cpu()
        self.busy = 0.0

    def ratios(self, busy: float) -> tuple[float, float] | None:
        """(network idle, handler idle) since the last call; None if no time passed."""
        now, cpu = self._wall(), self._cpu()
        wall = now - self.at
        if wall <= 0:
            return None
        network = 1.0 - (cpu - self.cpu) / wall
        handler = 1.0 - (busy - self.busy) / wall
        self.at, self.cpu, self.busy = now, cpu, busy
        # A handler that awaits a worker thread (an admin operation) counts as busy while
        # others run: their sum may pass the wall time.
        return min(max(network, 0.0), 1.0), min(max(handler, 0.0), 1.0)


class BrokerMetrics:
    """The counters the request path increments and the scrape-time view of the broker.

    Request figures, bytes and records are plain numbers touched on the event loop only
    (copied on the loop when scraped); the fsync histogram, observed from worker threads,
    is a ``prometheus_client`` histogram.
    """

    def __init__(
        self, idle_clocks: tuple[Callable[[], float], Callable[[], float]] | None = None
    ) -> None:
        """``idle_clocks``: (wall, loop thread CPU) seconds for the idle ratios (tests)."""
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
        #: listener -> requests taken and not yet answered
        self._queues: dict[str, Count] = {}
        self._idle = _IdleWindow(*idle_clocks) if idle_clocks else _IdleWindow()
        #: the quorum's proposals from append to commit, and its stretches without a
        #: leader (observed by the Raft driver on the event loop)
        self.commit_latency = _Timer(QUORUM_BUCKETS)
        self.election_latency = _Timer(QUORUM_BUCKETS)
        #: the listeners' connection counts, set by the app (read when scraped)
        self.connection_limiter: ConnectionLimiter | None = None

    # -- the request path ---------------------------------------------------------------

    @staticmethod
    def error_codes_of(response: object) -> list[int]:
        return error_codes(response)

    def request_queue(self, listener: str) -> Count:
        """The count of requests taken and not yet answered on ``listener``, which its
        connections move."""
        count = self._queues.get(listener)
        if count is None:
            count = self._queues[listener] = Count()
        return count

    def request_done(
        self,
        api_key: int,
        codes: Iterable[int],
        total: float,
        local: float,
        remote: float,
        *,
        queue: float = 0.0,
        send: float = 0.0,
    ) -> None:
        """One request answered (or, with acks=0, handled): its times in seconds and the
        error codes of its response."""
        stats = self._apis.get(api_key)
        if stats is None:
            stats = self._apis[api_key] = _ApiStats(api_name(api_key))
        stats.total.observe(total)
        stats.queue.observe(queue)
        stats.local.observe(local)
        stats.remote.observe(remote)
        stats.send.observe(send)
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
        apis = list(self._apis.values())
        return ScrapeState(
            requests=[
                RequestCopy(
                    s.api,
                    s.total.copy(),
                    s.local.copy(),
                    s.remote.copy(),
                    s.queue.copy(),
                    s.send.copy(),
                )
                for s in apis
            ],
            errors=dict(self._errors),
            bytes_in={t: tuple(c) for t, c in self._in.items()},
            bytes_out=dict(self._out),
            queues={listener: count.value for listener, count in self._queues.items()},
            idle=self._idle.ratios(sum(s.local.sum for s in apis)),
            connections=(
                {name: limiter.connections(name) for name in limiter.listeners()}
                if (limiter := self.connection_limiter) is not None
                else {}
            ),
            connections_refused=dict(limiter.refused_per_ip) if limiter is not None else {},
        )

    def gather(self, broker: Broker, quorum: QuorumNode | None = None) -> ScrapeState:
        """What a scrape needs from state owned by the event loop; call it on the loop."""
        state = self.gather_requests()
        image = broker.image
        partitions = sorted((p.topic, p.index, p.log, p.high_watermark) for p in broker.partitions)
        led = {(p.topic, p.index) for p in broker.partitions}
        expected = []
        default_min_isr = broker.config.min_insync_replicas
        for topic in image.topics_by_name.values():
            min_isr: int | None = None
            for index, part in topic.partitions.items():
                if part.leader != broker.node_id:
                    continue
                expected.append((topic.name, index))
                if len(part.isr) < len(part.replicas):
                    state.under_replicated += 1
                if min_isr is None:
                    configured = image.topic_config(topic.name).get("min.insync.replicas")
                    min_isr = int(configured) if configured else default_min_isr
                if len(part.isr) < min_isr:
                    state.under_min_isr += 1
        groups: list[GroupState] = []
        driver = broker.groups
        if driver is not None and not driver.stopped:
            state.group_partitions_loading = len(driver.loading)
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
        state.offline_log_dirs = len(broker.partitions.logs.offline_dirs)
        state.missing = [tp for tp in expected if tp not in led]
        state.groups = groups
        state.now_ms = broker.clock()
        if broker.quotas is not None:
            state.quotas = broker.quotas.figures()
        transactions = broker.transactions
        if transactions is not None and not transactions.stopped:
            coordinator = transactions.coordinator
            state.transactions = TransactionFigures(
                coordinator.state_counts(),
                coordinator.committed_count,
                coordinator.aborted_count,
                coordinator.timed_out_count,
                len(transactions.loading),
            )
        controller = broker.controller
        state.active_controller = controller is not None and controller.is_active()
        if quorum is not None:
            state.quorum = self._quorum_figures(quorum, image)
        return state

    def _quorum_figures(self, quorum: QuorumNode, image: Any) -> QuorumFigures:
        driver = quorum.driver
        node = driver.node
        leader = driver.leader_id
        voters: dict[int, int] = {}
        description = driver.describe()
        if description is not None:
            voters = {v.replica_id: v.log_end_offset for v in description.voters}
        fenced = sum(1 for b in image.brokers.values() if b.fenced)
        return QuorumFigures(
            leader=-1 if leader is None else leader,
            epoch=node.epoch,
            role=node.role.value,
            high_watermark=node.high_watermark,
            log_end_offset=node.log.end_offset(),
            applied_offset=image.offset,
            voters=voters,
            fenced_brokers=fenced,
            active_brokers=len(image.brokers) - fenced,
            commit_latency=self.commit_latency.copy(),
            election_latency=self.election_latency.copy(),
        )

    def observe_commit(self, seconds: float) -> None:
        self.commit_latency.observe(seconds)

    def observe_election(self, seconds: float) -> None:
        self.election_latency.observe(seconds)

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
class QuorumFigures:
    """One metadata-quorum node's view, copied for a scrape."""

    #: the leader this node knows (-1: none)
    leader: int
    epoch: int
    #: the node's Raft role (``leader``, ``follower``, ``candidate``...)
    role: str
    high_watermark: int
    log_end_offset: int
    #: the offset of the last metadata record this node's image holds
    applied_offset: int
    #: voter -> log end offset, as the leader last saw it (empty on other nodes)
    voters: dict[int, int] = field(default_factory=dict)
    fenced_brokers: int = 0
    active_brokers: int = 0
    commit_latency: TimerCopy = field(default_factory=lambda: _Timer(QUORUM_BUCKETS).copy())
    election_latency: TimerCopy = field(default_factory=lambda: _Timer(QUORUM_BUCKETS).copy())


@dataclass
class TransactionFigures:
    """The transaction coordinator's figures, copied for a scrape."""

    #: transactional ids of the partitions it owns by state (``Ongoing``, ...)
    states: dict[str, int]
    committed: int
    aborted: int
    timed_out: int
    partitions_loading: int


@dataclass
class ScrapeState:
    requests: list[RequestCopy] = field(default_factory=list)
    errors: dict[tuple[str, str], int] = field(default_factory=dict)
    bytes_in: dict[str, tuple[int, ...]] = field(default_factory=dict)
    bytes_out: dict[str, int] = field(default_factory=dict)
    #: listener -> requests taken and not yet answered
    queues: dict[str, int] = field(default_factory=dict)
    #: (network idle, handler idle) ratios since the previous scrape
    idle: tuple[float, float] | None = None
    #: listener -> open connections; listener -> connections closed over
    #: ``max.connections.per.ip``
    connections: dict[str, int] = field(default_factory=dict)
    connections_refused: dict[str, int] = field(default_factory=dict)
    #: (topic, partition, log, high watermark) of every partition this broker leads
    partitions: list[tuple[str, int, Any, int]] = field(default_factory=list)
    #: partitions the metadata says this broker leads but which have no open log
    missing: list[tuple[str, int]] = field(default_factory=list)
    groups: list[GroupState] = field(default_factory=list)
    #: the group coordinator's ``__consumer_offsets`` partitions still loading
    group_partitions_loading: int = 0
    #: partitions led here whose ISR is smaller than their replicas, or than
    #: ``min.insync.replicas`` (from the metadata image)
    under_replicated: int = 0
    under_min_isr: int = 0
    #: log dirs taken offline after an I/O error (Kafka's OfflineLogDirectoryCount)
    offline_log_dirs: int = 0
    active_controller: bool = True
    transactions: TransactionFigures | None = None
    #: None on a single node (no quorum of voters)
    quorum: QuorumFigures | None = None
    #: the broker's wall clock at the scrape (ms), for lag in seconds
    now_ms: int = 0
    #: the clients measured against a byte-rate quota
    quotas: list[QuotaFigure] = field(default_factory=list)
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


def _add_timer(
    family: HistogramMetricFamily,
    labels: list[str],
    timer: TimerCopy,
    bounds: tuple[float, ...] = REQUEST_BUCKETS,
) -> None:
    counts, total = timer
    cumulative = list(itertools.accumulate(counts))
    buckets = [
        (floatToGoString(le), n)  # type: ignore[no-untyped-call]
        for le, n in zip(bounds, cumulative, strict=False)
    ]
    buckets.append(("+Inf", cumulative[-1]))
    family.add_metric(labels, buckets, total)


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
    queue = _histogram(
        "kafka_network_request_queue_time_seconds",
        "From the request read off the socket to its handler's start (requests read "
        "together wait for the handlers of the ones before them).",
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
    send = _histogram(
        "kafka_network_request_response_send_time_seconds",
        "From the answer being ready to its last byte handed to the socket.",
    )
    for r in sorted(state.requests, key=lambda r: r.api):
        requests.add_metric([r.api], sum(r.total[0]))
        _add_timer(total, [r.api], r.total)
        _add_timer(queue, [r.api], r.queue)
        _add_timer(local, [r.api], r.local)
        _add_timer(remote, [r.api], r.remote)
        _add_timer(send, [r.api], r.send)
    for (api, error), count in sorted(state.errors.items()):
        errors.add_metric([api, error], count)
    yield from (requests, errors, total, queue, local, remote, send)

    queue_size = GaugeMetricFamily(
        "kafka_network_request_queue_size",
        "Requests taken off the listener's connections and not yet answered.",
        labels=["listener"],
    )
    for listener, size in sorted(state.queues.items()):
        queue_size.add_metric([listener], size)
    yield queue_size
    connections = GaugeMetricFamily(
        "kafka_server_socket_server_metrics_connection_count",
        "Open client connections of the listener.",
        labels=["listener"],
    )
    for listener, count in sorted(state.connections.items()):
        connections.add_metric([listener], count)
    refused = CounterMetricFamily(
        "kafka_server_socket_server_metrics_connections_refused",
        "Connections closed as soon as accepted: their address held max.connections.per.ip.",
        labels=["listener"],
    )
    for listener, count in sorted(state.connections_refused.items()):
        refused.add_metric([listener], count)
    yield from (connections, refused)
    if state.idle is not None:
        network_idle, handler_idle = state.idle
        yield _gauge(
            "kafka_network_processor_avg_idle_ratio",
            "Share of the time since the previous scrape the event loop thread (network "
            "and handlers) used no CPU.",
            network_idle,
        )
        yield _gauge(
            "kafka_server_request_handler_avg_idle_ratio",
            "Share of the time since the previous scrape no request handler ran.",
            handler_idle,
        )


#: quota key -> Kafka's quota type (``kafka.server:type=Produce|Fetch,user=,client-id=``)
_QUOTA_TYPES = {"producer_byte_rate": "produce", "consumer_byte_rate": "fetch"}


def _quota_families(figures: list[QuotaFigure]) -> Iterable[Metric]:
    labels = ["user", "client_id"]
    for key, kind in _QUOTA_TYPES.items():
        rate = GaugeMetricFamily(
            f"kafka_server_{kind}_byte_rate",
            f"Bytes per second of {kind} measured against the client's {key} quota.",
            labels=labels,
        )
        throttle = CounterMetricFamily(
            f"kafka_server_{kind}_throttle_time_ms",
            f"Throttle time the client was given for exceeding its {key} quota.",
            labels=labels,
        )
        for figure in sorted(figures, key=lambda f: (f.user, f.client_id)):
            if figure.key == key:
                rate.add_metric([figure.user, figure.client_id], figure.rate)
                throttle.add_metric([figure.user, figure.client_id], figure.throttle_time_ms)
        yield from (rate, throttle)


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
    yield from _quota_families(state.quotas)

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
    logs: dict[tuple[str, int], Any] = {}
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
        logs[(name, index)] = log
    yield from (size, segments, end, start)

    yield _gauge(
        "kafka_server_leader_partitions",
        "Partitions this broker leads (internal topics included).",
        len(state.partitions),
    )
    yield _gauge(
        "kafka_server_under_replicated_partitions",
        "Partitions led here whose ISR is smaller than their replica set.",
        state.under_replicated,
    )
    yield _gauge(
        "kafka_server_under_min_isr_partitions",
        "Partitions led here whose ISR is below min.insync.replicas.",
        state.under_min_isr,
    )
    yield _gauge(
        "kafka_controller_offline_partitions",
        "Partitions led here by the metadata whose log is not open or not readable.",
        offline,
    )
    yield _gauge(
        "kafka_log_manager_offline_log_directory_count",
        "Log dirs taken offline after an I/O error, until the broker restarts.",
        state.offline_log_dirs,
    )
    yield _gauge(
        "kafka_controller_active_controller",
        "1 on the node that is the active controller (a single node always is).",
        1 if state.active_controller else 0,
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
    lag_seconds = GaugeMetricFamily(
        "kafka_consumergroup_lag_seconds",
        "Age of the oldest record the group has not consumed: now minus the timestamp of "
        "the batch holding the committed offset (0 when caught up).",
        labels=gtp,
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
                age = 0.0
                if behind:
                    stamp = _timestamp_at(logs[(name, index)], offset)
                    if stamp is None:
                        continue
                    age = max(state.now_ms - stamp, 0) / 1000
                lag_seconds.add_metric(labels, age)
        group_lag.add_metric([g.group_id], total)
    yield from (group_state, members, committed, lag, group_lag, lag_seconds)
    yield from coordinator_families(state)
    if state.quorum is not None:
        yield from quorum_families(state.quorum)


def _timestamp_at(log: Any, offset: int) -> int | None:
    """The timestamp (ms) of the batch holding ``offset`` (or the first one left, when
    retention removed it): its first record's CreateTime, or the append time of a
    LogAppendTime topic. One header read, nothing decoded; None if it cannot be read."""
    try:
        piece = log.read(max(offset, log.log_start_offset), HEADER_SIZE)
        if piece is None:
            return None
        with piece:
            header = parse_header(os.pread(piece.fd, HEADER_SIZE, piece.position))
    except (StorageError, OSError, ValueError):  # RecordsError is a ValueError
        return None
    return header.max_timestamp if header.is_log_append_time else header.base_timestamp


#: States given a series even at 0, so that a rule or a panel on one never sees it absent.
_GROUP_STATES = ("Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead")
_TXN_STATES = (
    "Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort",
)  # fmt: skip


def coordinator_families(state: ScrapeState) -> Iterable[Metric]:
    by_state = dict.fromkeys(_GROUP_STATES, 0)
    for g in state.groups:
        by_state[g.state] = by_state.get(g.state, 0) + 1
    groups = GaugeMetricFamily(
        "kafka_coordinator_group_groups",
        "Groups this broker coordinates, by state (Kafka's NumGroups...).",
        labels=["state"],
    )
    for name, count in sorted(by_state.items()):
        groups.add_metric([name], count)
    yield groups
    yield _gauge(
        "kafka_coordinator_group_partitions_loading",
        "__consumer_offsets partitions this broker leads whose groups are still loading.",
        state.group_partitions_loading,
    )
    txn = state.transactions
    if txn is None:
        return
    transactions = GaugeMetricFamily(
        "kafka_coordinator_transaction_transactions",
        "Transactional ids this broker coordinates, by state (Ongoing: a transaction is open).",
        labels=["state"],
    )
    for name, count in sorted({**dict.fromkeys(_TXN_STATES, 0), **txn.states}.items()):
        transactions.add_metric([name], count)
    completed = CounterMetricFamily(
        "kafka_coordinator_transaction_completed",
        "Transactions completed here since the broker started (result: commit or abort).",
        labels=["result"],
    )
    completed.add_metric(["commit"], txn.committed)
    completed.add_metric(["abort"], txn.aborted)
    timed_out = CounterMetricFamily(
        "kafka_coordinator_transaction_timed_out",
        "Transactions aborted because they passed their transaction.timeout.ms.",
        value=txn.timed_out,
    )
    yield from (transactions, completed, timed_out)
    yield _gauge(
        "kafka_coordinator_transaction_partitions_loading",
        "__transaction_state partitions this broker leads that are still loading.",
        txn.partitions_loading,
    )


def quorum_families(quorum: QuorumFigures) -> Iterable[Metric]:
    yield _gauge(
        "kafka_raft_current_leader",
        "The quorum's leader this node knows (-1: none).",
        quorum.leader,
    )
    yield _gauge("kafka_raft_current_epoch", "The quorum's current epoch.", quorum.epoch)
    state = GaugeMetricFamily(
        "kafka_raft_current_state",
        "1 for this node's Raft role (leader, follower, candidate, prospective, unattached, "
        "resigned).",
        labels=["state"],
    )
    state.add_metric([quorum.role], 1)
    yield state
    yield _gauge(
        "kafka_raft_high_watermark",
        "The metadata log's high watermark: the offset below which entries are committed.",
        quorum.high_watermark,
    )
    yield _gauge(
        "kafka_raft_log_end_offset", "The end of this node's metadata log.", quorum.log_end_offset
    )
    voter_end = GaugeMetricFamily(
        "kafka_raft_voter_log_end_offset",
        "Each voter's metadata log end, as the leader saw it in its fetches (leader only).",
        labels=["voter"],
    )
    voter_lag = GaugeMetricFamily(
        "kafka_raft_voter_lag",
        "Entries each voter's log is behind the leader's (leader only).",
        labels=["voter"],
    )
    for voter, end in sorted(quorum.voters.items()):
        if end < 0:
            continue  # not heard from in this epoch yet
        voter_end.add_metric([str(voter)], end)
        voter_lag.add_metric([str(voter)], max(quorum.log_end_offset - end, 0))
    yield from (voter_end, voter_lag)
    commit = HistogramMetricFamily(
        "kafka_raft_commit_latency_seconds",
        "From a proposal appended on the leader to its commit by a majority.",
    )
    _add_timer(commit, [], quorum.commit_latency, QUORUM_BUCKETS)
    election = HistogramMetricFamily(
        "kafka_raft_election_latency_seconds",
        "Each stretch this node knew no leader (its start, a lost leader) until it knew one.",
    )
    _add_timer(election, [], quorum.election_latency, QUORUM_BUCKETS)
    yield from (commit, election)
    yield _gauge(
        "kafka_controller_fenced_broker_count",
        "Registered brokers that are fenced (the metadata this node has applied).",
        quorum.fenced_brokers,
    )
    yield _gauge(
        "kafka_controller_active_broker_count",
        "Registered brokers that are not fenced.",
        quorum.active_brokers,
    )
    yield _gauge(
        "kafka_server_metadata_last_applied_offset",
        "Offset of the last metadata record this node has applied.",
        quorum.applied_offset,
    )
    yield _gauge(
        "kafka_server_metadata_apply_lag",
        "Committed metadata records this node has not applied yet.",
        max(quorum.high_watermark - 1 - quorum.applied_offset, 0),
    )


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
        quorum: Callable[[], QuorumNode | None] = lambda: None,
    ) -> None:
        super().__init__(
            host,
            port,
            {"/metrics": self._metrics, "/health": health, "/ready": self._readiness},
        )
        self.metrics = metrics
        self._broker = broker
        self._ready = ready
        self._quorum = quorum

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
            state = self.metrics.gather(broker, self._quorum())
        gathered = time.perf_counter()
        text = await asyncio.to_thread(self.metrics.render, state)
        _log.debug(
            "scrape: %.1f ms on the loop, %.1f ms rendering",
            (gathered - started) * 1000,
            (time.perf_counter() - gathered) * 1000,
        )
        return text
