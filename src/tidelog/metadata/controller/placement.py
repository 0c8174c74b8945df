"""Where the replicas of new partitions go: rack-aware, leaders striped over the brokers.

Kafka's assignment (``AdminUtils.assignReplicasToBrokers``), used by CreateTopics,
CreatePartitions and the internal topics alike:

* the first replica (the preferred leader) of partition ``p`` is broker
  ``(p + start) mod n`` of the broker list, so leaderships are spread evenly;
* the other replicas follow it at a distance ``1 + (shift + j) mod (n - 1)``, where the
  shift grows by one every ``n`` partitions, so that followers are spread as well;
* with racks, the broker list alternates racks (rack a's first broker, rack b's first,
  ..., rack a's second ...) and a follower is skipped while its rack already holds a
  replica and some rack holds none, or while the broker already holds one.

The start and the shift come from the controller's random source for a new topic (seeded
in tests); for new partitions of an existing topic they continue the topic's stripe: the
start is the position of partition 0's first replica, as Kafka's ``addPartitions`` does.

Unlike the ZooKeeper-era tool, which refused a mix of brokers with and without a rack,
a broker without ``broker.rack`` counts as one more rack of its own (KRaft's placer does
the same), so a cluster in the middle of adding racks can still create topics.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

__all__ = ["assign_replicas", "rack_alternated"]


def rack_alternated(brokers: Sequence[int], racks: Mapping[int, str | None]) -> list[int]:
    """``brokers`` (sorted ids) reordered so that consecutive brokers are on different
    racks as long as possible: one broker of each rack in turn, racks in name order."""
    by_rack: dict[str | None, list[int]] = {}
    for broker in sorted(brokers):
        by_rack.setdefault(racks.get(broker), []).append(broker)
    ordered_racks = sorted(by_rack, key=lambda rack: (rack is None, rack or ""))
    result: list[int] = []
    depth = 0
    while len(result) < len(brokers):
        for rack in ordered_racks:
            members = by_rack[rack]
            if depth < len(members):
                result.append(members[depth])
        depth += 1
    return result


def _follower_index(first: int, shift: int, j: int, n: int) -> int:
    return (first + 1 + (shift + j) % (n - 1)) % n


def assign_replicas(
    brokers: Sequence[int],
    racks: Mapping[int, str | None],
    partitions: int,
    replication_factor: int,
    *,
    rng: random.Random | None = None,
    start_broker: int | None = None,
    first_partition: int = 0,
) -> list[list[int]]:
    """Replicas of ``partitions`` partitions (numbered from ``first_partition``), each
    ``replication_factor`` distinct brokers of ``brokers``, the first the leader.

    ``start_broker`` (when it is one of ``brokers``) fixes the stripe's start and shift at
    its position; otherwise they are drawn from ``rng``, or 0 when there is no choice to
    make (one broker) or no ``rng``.
    """
    n = len(brokers)
    if n == 0 or not 0 < replication_factor <= n:
        raise ValueError(f"cannot place {replication_factor} replicas on {n} brokers")
    rack_aware = len({racks.get(b) for b in brokers}) > 1
    ordered = rack_alternated(brokers, racks) if rack_aware else sorted(brokers)
    if start_broker is not None and start_broker in ordered:
        start_index = shift = ordered.index(start_broker)
    elif rng is not None and n > 1:
        start_index, shift = rng.randrange(n), rng.randrange(n)
    else:
        start_index = shift = 0
    rack_count = len({racks.get(b) for b in brokers})
    assignments: list[list[int]] = []
    for p in range(first_partition, first_partition + partitions):
        if p > 0 and p % n == 0:
            shift += 1
        first = (p + start_index) % n
        replicas = [ordered[first]]
        if rack_aware:
            # Kafka scales the shift by the number of racks, so followers of
            # consecutive stripes land on other racks' brokers.
            replicas += _rack_aware_followers(
                ordered, racks, first, shift * rack_count, replication_factor, rack_count
            )
        else:
            replicas += [
                ordered[_follower_index(first, shift, j, n)] for j in range(replication_factor - 1)
            ]
        assignments.append(replicas)
    return assignments


def _rack_aware_followers(
    ordered: Sequence[int],
    racks: Mapping[int, str | None],
    first: int,
    shift: int,
    replication_factor: int,
    rack_count: int,
) -> list[int]:
    n = len(ordered)
    chosen = [ordered[first]]
    racks_used = {racks.get(ordered[first])}
    k = 0
    while len(chosen) < replication_factor:
        # Walks every broker but the leader's position in turn, so it ends: while a rack
        # holds no replica, one of its brokers is not chosen yet.
        broker = ordered[_follower_index(first, shift, k, n)]
        k += 1
        rack = racks.get(broker)
        if rack in racks_used and len(racks_used) < rack_count:
            continue
        if broker in chosen:
            continue
        chosen.append(broker)
        racks_used.add(rack)
    return chosen[1:]
