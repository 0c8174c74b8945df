"""The agent's exceptions: one base type for everything a caller of the agent can see."""

from __future__ import annotations


class AgentError(Exception):
    """An agent operation failed."""

    #: For a call over several partitions that failed after some of its events were stored
    #: (durable, to be delivered): the id of each event stored, None for the others, in the
    #: order of the call. None when the call stored nothing.
    stored: list[object] | None = None


class QueueFullError(AgentError):
    """The queue of the partition is at ``queue.max.bytes`` and the policy is ``reject``."""


class EventTooLargeError(AgentError):
    """An event is larger than ``max.request.size``: the broker could never take it."""


class EventFormatError(AgentError):
    """An event (from the socket or from disk) is not well formed."""


class QueueCorruptError(AgentError):
    """A disk queue file cannot be read back (its cursor or an entry is damaged)."""


class AgentClosedError(AgentError):
    """The agent (or the connection to the daemon) is closed."""
