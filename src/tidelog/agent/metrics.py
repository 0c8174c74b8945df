"""The agent's Prometheus metrics, ``/health`` and ``/ready``, on an optional HTTP listener.

``metrics.listener`` (``http://host:port``, empty: off — the broker's key, with the same
meaning) names the address; the server runs in the agent's event loop. Nothing is counted
on the send path for it: a scrape reads the figures every queue already keeps for
``tidelog agent status`` (:meth:`Agent.status`), so metrics on or off cost a send the same.

Every figure is labelled by ``topic`` and ``partition`` (``-1``: the parked events of a
topic the cluster does not know yet); the names are in ``docs/operations.md``. ``/ready`` is
503 while a queue cannot take events because its disk budget or disk is full (with
``queue.full.policy=block`` or ``reject`` senders then wait or fail): the one state in
which the agent does not do its job. An unreachable cluster is not "not ready": holding
events until it is back is what the agent is for, and ``oldest_event_age_seconds`` shows it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from tidelog.runtime.http_endpoints import Answer, EndpointServer, health, readiness_answer

__all__ = ["AgentMetricsServer", "agent_families", "not_ready_reason"]

# (status key, metric name, help, counter?) — counters since the agent started.
_FIGURES: tuple[tuple[str, str, str, bool], ...] = (
    ("depth", "tidelog_agent_queue_depth_events", "Events stored and not yet delivered.", False),
    ("bytes", "tidelog_agent_queue_bytes", "Bytes the queue's segments hold on disk.", False),
    (
        "oldest_age_s",
        "tidelog_agent_oldest_event_age_seconds",
        "Age of the oldest undelivered event (0 when the queue is empty).",
        False,
    ),
    (
        "in_flight",
        "tidelog_agent_events_in_flight",
        "Events sent to the cluster and not yet answered (one batch at most).",
        False,
    ),
    (
        "in_doubt",
        "tidelog_agent_events_in_doubt",
        "Events sent whose outcome is unknown (a send timed out or its connection was lost); "
        "they are resent as the same idempotent batch.",
        False,
    ),
    ("disk_full", "tidelog_agent_queue_disk_full", "1 while the queue's disk is full.", False),
    ("appended", "tidelog_agent_events_appended", "Events accepted and stored.", True),
    (
        "delivered",
        "tidelog_agent_events_delivered",
        "Events acknowledged by the cluster (acks=all).",
        True,
    ),
    (
        "moved",
        "tidelog_agent_events_moved",
        "Parked events moved to a partition once the topic was known.",
        True,
    ),
    (
        "duplicates_avoided",
        "tidelog_agent_duplicates_avoided",
        "Events of a resent batch the cluster already held (written once).",
        True,
    ),
    (
        "dropped",
        "tidelog_agent_events_dropped",
        "Events dropped undelivered (queue.full.policy=drop-oldest, or lost to corruption).",
        True,
    ),
    (
        "rejected",
        "tidelog_agent_events_rejected",
        "Events the cluster refused for good (e.g. larger than the topic allows).",
        True,
    ),
    (
        "corrupt",
        "tidelog_agent_events_corrupt",
        "Queue entries skipped because their checksum failed.",
        True,
    ),
    ("retries", "tidelog_agent_send_retries", "Batches sent again after a failure.", True),
    ("fsyncs", "tidelog_agent_queue_fsyncs", "fsync rounds of the queue's files.", True),
)


def agent_families(queues: Sequence[Mapping[str, Any]]) -> Iterator[Metric]:
    """One family per figure, one sample per queue of :meth:`Agent.status`."""
    labels = ["topic", "partition"]
    for key, name, documentation, counter in _FIGURES:
        family: GaugeMetricFamily | CounterMetricFamily = (
            CounterMetricFamily(name, documentation, labels=labels)
            if counter
            else GaugeMetricFamily(name, documentation, labels=labels)
        )
        for queue in queues:
            family.add_metric(
                [str(queue["topic"]), str(queue["partition"])], float(queue.get(key, 0))
            )
        yield family


def not_ready_reason(queues: Iterable[Mapping[str, Any]]) -> str | None:
    full = [f"{q['topic']}-{q['partition']}" for q in queues if q.get("disk_full")]
    if full:
        return f"queue disk full: {', '.join(sorted(full))}"
    return None


class _Collector:
    def __init__(self, queues: Sequence[Mapping[str, Any]]) -> None:
        self._queues = queues

    def collect(self) -> Iterable[Metric]:
        return agent_families(self._queues)


class AgentMetricsServer(EndpointServer):
    """``/metrics``, ``/health``, ``/ready`` for one agent; start and stop on its loop."""

    def __init__(self, status: Callable[[], list[dict[str, Any]]], host: str, port: int) -> None:
        super().__init__(
            host, port, {"/metrics": self._metrics, "/health": health, "/ready": self._ready}
        )
        self._status = status

    async def _metrics(self) -> Answer:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self._status()))
        return 200, CONTENT_TYPE_LATEST, generate_latest(registry)

    async def _ready(self) -> Answer:
        return readiness_answer(not_ready_reason(self._status()))
