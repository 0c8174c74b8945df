"""Members leaving, members dying, and the broker restarting under a group.

- A member that closes sends LeaveGroup: the others take its partitions in a rebalance that
  starts at once. The members here have a 60 s session timeout, so a handover that waited for
  the session to expire would miss the 30 s wait.
- A member killed with SIGKILL says nothing: its partitions move when its 6 s session expires
  (the members' rebalance timeout is librdkafka's 300 s max.poll.interval.ms, so only session
  expiry can free them within the wait).
- In both cases the new owners start at the committed offsets: nothing committed is consumed
  twice, nothing is skipped.
- Committed offsets survive a broker restart (SIGTERM and SIGKILL) and a new member resumes
  from them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from group_harness import (
    GroupBroker,
    Member,
    Members,
    Names,
    assert_exactly_once,
    committed_offsets,
    create_topic,
    ends_of,
    produce,
    python_member,
    values,
    wait_assigned,
    wait_consumed,
)

PARTITIONS = 6
COUNT = 120


def first_offsets(member: Member, since: float) -> dict[int, int]:
    """The first offset the member consumed of each partition after `since`."""
    first: dict[int, int] = {}
    for e in member.of("record"):
        if e["at"] >= since:
            first.setdefault(e["partition"], e["offset"])
    return first


def three_members(
    broker: GroupBroker, names: Names, members: Members, session_timeout_ms: int
) -> list[Member]:
    create_topic(broker.bootstrap, names.topic, PARTITIONS)
    group = [
        members.add(
            python_member(
                "confluent",
                broker.bootstrap,
                names.topic,
                names.group,
                name=f"m{i}",
                assignor="range",
                session_timeout_ms=session_timeout_ms,
            )
        )
        for i in range(3)
    ]
    wait_assigned(group, PARTITIONS, "three members to share the topic")
    return group


@pytest.mark.parametrize("how", ["leave", "sigkill"])
def test_partitions_move_to_the_others(
    broker: GroupBroker, names: Names, members: Members, how: str
) -> None:
    group = three_members(broker, names, members, 60000 if how == "leave" else 6000)
    first = values("a", COUNT)
    produce(broker.bootstrap, names.topic, first, PARTITIONS)
    wait_consumed(group, ends_of(COUNT, PARTITIONS))

    gone, rest = group[0], group[1:]
    moved = gone.owned()
    assert moved is not None and len(moved) == 2
    committed_before = gone.committed()
    left_at = time.monotonic()
    if how == "leave":
        gone.stop()
    else:
        gone.kill()
    owned = wait_assigned(rest, PARTITIONS, f"the others to own every partition after {how}")
    print(f"{how}: the others own all partitions {time.monotonic() - left_at:.2f}s later")
    assert sorted(owned.values(), key=min) == [{0, 1, 2}, {3, 4, 5}]

    second = values("b", COUNT)
    produce(broker.bootstrap, names.topic, second, PARTITIONS)
    wait_consumed(rest, {p: 2 * n for p, n in ends_of(COUNT, PARTITIONS).items()})
    for member in rest:
        member.stop()

    # The new owners of the moved partitions started exactly where the gone member committed.
    resumed: dict[int, int] = {}
    for member in rest:
        resumed.update({p: o for p, o in first_offsets(member, left_at).items() if p in moved})
    assert resumed == {p: committed_before[p] for p in moved}
    assert_exactly_once(group, first + second, PARTITIONS)


@pytest.mark.parametrize("hard", [False, True], ids=["sigterm", "sigkill"])
def test_committed_offsets_survive_broker_restart(
    own_broker: Callable[[], GroupBroker], names: Names, members: Members, hard: bool
) -> None:
    broker = own_broker()
    create_topic(broker.bootstrap, names.topic, PARTITIONS)
    first = values("a", COUNT)
    produce(broker.bootstrap, names.topic, first, PARTITIONS)
    group = [
        members.add(
            python_member("confluent", broker.bootstrap, names.topic, names.group, name=f"m{i}")
        )
        for i in range(2)
    ]
    wait_consumed(group, ends_of(COUNT, PARTITIONS))
    for member in group:
        member.stop()
    before = committed_offsets(broker.bootstrap, names.group, names.topic, PARTITIONS)
    assert before == ends_of(COUNT, PARTITIONS)

    broker.restart(hard=hard)
    assert committed_offsets(broker.bootstrap, names.group, names.topic, PARTITIONS) == before

    second = values("b", COUNT)
    produce(broker.bootstrap, names.topic, second, PARTITIONS)
    late = members.add(
        python_member("confluent", broker.bootstrap, names.topic, names.group, name="late")
    )
    wait_consumed([late], {p: 2 * n for p, n in ends_of(COUNT, PARTITIONS).items()})
    late.stop()
    assert first_offsets(late, 0.0) == before
    assert_exactly_once([*group, late], first + second, PARTITIONS)
