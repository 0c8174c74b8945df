"""Why the coordinators of this broker do not serve yet, for ``/ready``.

A broker that has just taken the lead of ``__consumer_offsets`` or ``__transaction_state``
partitions (at start, or when leadership moves to it) replays them in the background; until
a partition is loaded its groups get COORDINATOR_LOAD_IN_PROGRESS and its transactional ids
COORDINATOR_NOT_AVAILABLE, and transactional produce to any partition cannot be verified
for them (KIP-890). A load balancer or an orchestrator waiting on ``/ready`` must not send
clients here meanwhile, so the reason names the partitions still loading.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol


class LoadingCoordinator(Protocol):
    """What readiness reads of a coordinator's driver (:class:`~tidelog.broker.
    coordinator_driver.CoordinatorDriver`)."""

    topic: str

    @property
    def stopped(self) -> bool: ...

    @property
    def loading(self) -> list[int]: ...


def ranges(numbers: Iterable[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"``: a topic's 50 partitions stay one line."""
    spans: list[list[int]] = []
    for n in sorted(set(numbers)):
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def coordinators_not_ready(
    coordinators: Sequence[tuple[str, LoadingCoordinator | None]],
) -> str | None:
    """None when every coordinator (named, e.g. "group") runs with all its partitions
    loaded; else one line: the first one not running, or every partition still loading."""
    for name, driver in coordinators:
        if driver is None or driver.stopped:
            return f"the {name} coordinator is not running"
    loading = [
        f"{driver.topic} partitions {ranges(parts)}"
        for _, driver in coordinators
        if driver is not None and (parts := driver.loading)
    ]
    if loading:
        return "the coordinators are loading " + " and ".join(loading)
    return None
