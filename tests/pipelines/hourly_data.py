"""Events of the hourly aggregates pipelines and the table they must produce.

The expected table is computed in Python from the events (decimal amounts, so sums are exact
whatever order Spark adds them in); invalid records count under ``_invalid`` in the hour of
their record timestamp.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

BASE = datetime(2026, 3, 9, 8, 0, tzinfo=UTC)
TYPES = ("view", "cart", "purchase")
Expected = dict[tuple[datetime, str], tuple[int, Decimal]]


def make_events(n: int, start: int = 0) -> list[dict[str, str]]:
    events = []
    for i in range(start, start + n):
        when = BASE + timedelta(minutes=(i * 7) % 300, seconds=i % 60)
        events.append(
            {
                "type": TYPES[i % 3],
                "user": f"u{i % 17}",
                "amount": f"{(i * 37) % 5000 / 100:.2f}",
                "event_time": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        )
    return events


def records(events: list[dict[str, str]], invalid: list[tuple[bytes, int]]) -> list[Any]:
    out: list[Any] = [(i % 3, None, json.dumps(e).encode(), None, []) for i, e in enumerate(events)]
    out += [(0, None, value, ts, []) for value, ts in invalid]
    return out


def expected(events: list[dict[str, str]], invalid: list[tuple[bytes, int]]) -> Expected:
    counts: Counter[tuple[datetime, str]] = Counter()
    sums: dict[tuple[datetime, str], Decimal] = {}
    for e in events:
        when = datetime.strptime(e["event_time"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        group = (when.replace(minute=0, second=0), e["type"])
        counts[group] += 1
        sums[group] = sums.get(group, Decimal(0)) + Decimal(e["amount"])
    for _value, ts in invalid:
        when = datetime.fromtimestamp(ts / 1000, UTC)
        group = (when.replace(minute=0, second=0, microsecond=0), "_invalid")
        counts[group] += 1
        sums[group] = sums.get(group, Decimal(0))
    return {g: (counts[g], sums[g]) for g in counts}


INVALID = [
    (b"not json at all", int(datetime(2026, 3, 9, 9, 30, tzinfo=UTC).timestamp() * 1000)),
    (b'{"type": "view"}', int(datetime(2026, 3, 9, 12, 1, tzinfo=UTC).timestamp() * 1000)),
    (b"\xff\xfe", int(datetime(2026, 3, 9, 12, 59, tzinfo=UTC).timestamp() * 1000)),
]
