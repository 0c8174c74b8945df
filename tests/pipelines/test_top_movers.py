"""Pipeline 4: per-symbol daily summaries through a one-partition topic, then the top 10."""

from __future__ import annotations

import json
from typing import Any

from pipeline_helpers import pipeline, produce_keyed, read_topic

# day -> symbol -> (open, last) prices in cents; every change in percent is a whole number and
# distinct within its day, so the expected ranking has no ties and no rounding.
DAYS = {
    "2026-03-09": {f"S{i:02d}": (10000, 10000 + 100 * ((i * 7) % 30 - 12)) for i in range(30)},
    "2026-03-10": {f"S{i:02d}": (20000, 20000 + 200 * ((i * 5) % 12 - 3)) for i in range(12)},
}


def trades() -> list[tuple[bytes, bytes, None]]:
    """In time order: the opening trades of every symbol, then middle, then closing trades."""

    def trade(symbol: str, cents: int, when: str) -> tuple[bytes, bytes, None]:
        value = {"symbol": symbol, "price": f"{cents / 100:.2f}", "trade_time": when}
        return (symbol.encode(), json.dumps(value).encode(), None)

    out = []
    for day, prices in DAYS.items():
        out += [trade(s, o, f"{day}T09:30:00Z") for s, (o, _) in prices.items()]
        out += [trade(s, o + 777, f"{day}T12:00:00Z") for s, (o, _) in prices.items()]
        out += [trade(s, c, f"{day}T15:59:00Z") for s, (_, c) in prices.items()]
    return out


def latest_per_key(records: list[Any]) -> dict[str, Any]:
    return {r.key.decode(): json.loads(r.value) for r in records}


def test_two_stages_rank_the_ten_largest_changes_of_each_day(
    spark: Any, broker: Any, create_topic: Any, topic: str, tmp_path: Any
) -> None:
    from tidelog.client import Admin

    main = pipeline("top_movers")
    trades_topic = create_topic(f"{topic}-trades", 3)
    daily, out = f"{topic}-daily", create_topic(f"{topic}-top", 1)
    produce_keyed(broker.bootstrap, trades_topic, trades())

    stage1 = main.start_stage1(
        spark,
        broker.bootstrap,
        str(tmp_path / "cp1"),
        trades_topic=trades_topic,
        intermediate_topic=daily,
        max_offsets_per_trigger=40,
    )
    stage1.awaitTermination()
    assert stage1.exception() is None
    with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
        assert len(admin.describe_topics([daily])[daily].partitions) == 1

    summaries = read_topic(spark, broker.bootstrap, daily)
    latest = latest_per_key(summaries)
    want = {
        f"{day}|{s}": {
            "day": day,
            "symbol": s,
            "open": o / 100,
            "last": c / 100,
            "trades": 3,
            "change_pct": (c - o) * 100 / o,
        }
        for day, prices in DAYS.items()
        for s, (o, c) in prices.items()
    }
    assert latest == want
    # Update mode over several micro-batches: a symbol's summary was written more than once.
    assert len(summaries) > len(want)

    stage2 = main.start_stage2(
        spark,
        broker.bootstrap,
        str(tmp_path / "cp2"),
        intermediate_topic=daily,
        output_topic=out,
    )
    stage2.awaitTermination()
    assert stage2.exception() is None
    rankings = latest_per_key(read_topic(spark, broker.bootstrap, out))
    assert set(rankings) == set(DAYS)
    for day, prices in DAYS.items():
        expected = sorted(prices, key=lambda s: (-(prices[s][1] - prices[s][0]), s))[:10]
        movers = rankings[day]["movers"]
        assert [m["symbol"] for m in movers] == expected
        assert [m["rank"] for m in movers] == list(range(1, 11))
        summaries = [want[f"{day}|{m['symbol']}"] for m in movers]
        assert [(m["change_pct"], m["open"], m["last"]) for m in movers] == [
            (w["change_pct"], w["open"], w["last"]) for w in summaries
        ]
