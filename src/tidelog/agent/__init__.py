"""tidelog.agent: the reliable event agent.

Applications hand events to a local agent — in-process (:class:`Agent`) or over a Unix socket
(:class:`AgentClient`, :class:`AsyncAgentClient` talking to ``tidelog agent``) — and get the
acknowledgement once the event is durable in the disk queue of its topic-partition
(:mod:`.queue`); one sender per queue (:mod:`.sender`) delivers batches to the partition
leader afterwards, exactly once, with an idempotent producer whose id and sequences are
persisted with the queue. Layout and invariants: docs/agent.md.
"""

from tidelog.agent.agent import Agent, Delivery, EventId
from tidelog.agent.client import AgentClient, AsyncAgentClient
from tidelog.agent.errors import (
    AgentClosedError,
    AgentError,
    EventFormatError,
    EventTooLargeError,
    QueueCorruptError,
    QueueFullError,
)
from tidelog.agent.server import AgentServer

__all__ = [
    "Agent",
    "AgentClient",
    "AgentClosedError",
    "AgentError",
    "AgentServer",
    "AsyncAgentClient",
    "Delivery",
    "EventFormatError",
    "EventId",
    "EventTooLargeError",
    "QueueCorruptError",
    "QueueFullError",
]
