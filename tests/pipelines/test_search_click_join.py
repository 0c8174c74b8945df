"""Pipeline 3: searches and clicks joined in a 10-minute window, watermarks 5 minutes behind.

Two runs of the query on one checkpoint. After the first, the watermark is
min(10:20 - 5, 10:21 - 5) = 10:15, so in the second run every record before 10:15 is late.
"""

from __future__ import annotations

import json
from typing import Any

from pipeline_helpers import pipeline, produce_keyed, read_topic


def search(user: str, query: str, hhmm: str) -> tuple[bytes, bytes, None]:
    value = {"user": user, "query": query, "search_time": f"2026-03-09T{hhmm}:00Z"}
    return (user.encode(), json.dumps(value).encode(), None)


def click(user: str, url: str, hhmm: str) -> tuple[bytes, bytes, None]:
    value = {"user": user, "url": url, "click_time": f"2026-03-09T{hhmm}:00Z"}
    return (user.encode(), json.dumps(value).encode(), None)


def pairs(spark: Any, bootstrap: str, topic: str) -> list[tuple[str, str, str, str, str]]:
    out = []
    for r in read_topic(spark, bootstrap, topic):
        v = json.loads(r.value)
        out.append(
            (v["user"], v["query"], v["search_time"][11:16], v["url"], v["click_time"][11:16])
        )
    return sorted(out)


def dropped_by_watermark(query: Any) -> int:
    return sum(
        op["numRowsDroppedByWatermark"]
        for progress in query.recentProgress
        for op in progress["stateOperators"]
    )


def test_pairs_within_the_window_and_late_records_dropped(
    spark: Any, broker: Any, create_topic: Any, topic: str, tmp_path: Any
) -> None:
    main = pipeline("search_click_join")
    searches = create_topic(f"{topic}-s", 2)
    clicks = create_topic(f"{topic}-c", 2)
    out = create_topic(f"{topic}-out", 1)
    topics = {"searches_topic": searches, "clicks_topic": clicks, "output_topic": out}
    checkpoint = str(tmp_path / "cp")

    produce_keyed(
        broker.bootstrap,
        searches,
        [
            search("u1", "spark", "10:00"),
            search("u2", "kafka", "10:00"),
            search("u3", "flink", "10:20"),
            search("u6", "arrow", "10:18"),
            search("u8", "beam", "10:05"),
            search("u8", "storm", "10:09"),
        ],
    )
    produce_keyed(
        broker.bootstrap,
        clicks,
        [
            click("u1", "/s1", "10:03"),  # 3 min after its search
            click("u1", "/s0", "09:59"),  # before the search
            click("u2", "/k1", "10:15"),  # 15 min after: outside the window
            click("u3", "/f1", "10:21"),
            click("u8", "/b1", "10:12"),  # follows both searches of u8
        ],
    )
    query = main.start(spark, broker.bootstrap, checkpoint, **topics)
    query.awaitTermination()
    assert query.exception() is None
    first = [
        ("u1", "spark", "10:00", "/s1", "10:03"),
        ("u3", "flink", "10:20", "/f1", "10:21"),
        ("u8", "beam", "10:05", "/b1", "10:12"),
        ("u8", "storm", "10:09", "/b1", "10:12"),
    ]
    assert pairs(spark, broker.bootstrap, out) == first
    assert dropped_by_watermark(query) == 0

    produce_keyed(
        broker.bootstrap,
        searches,
        [
            search("u4", "late", "10:01"),  # late
            search("u7", "late-search", "10:10"),  # late, its click is not
            search("u5", "parquet", "10:30"),
        ],
    )
    produce_keyed(
        broker.bootstrap,
        clicks,
        [
            click("u4", "/l1", "10:02"),  # late
            click("u7", "/l2", "10:16"),
            click("u5", "/p1", "10:31"),
            click("u6", "/a1", "10:24"),  # its search came in the first run, kept in state
        ],
    )
    query = main.start(spark, broker.bootstrap, checkpoint, **topics)
    query.awaitTermination()
    assert query.exception() is None
    assert pairs(spark, broker.bootstrap, out) == sorted(
        [
            *first,
            ("u5", "parquet", "10:30", "/p1", "10:31"),
            ("u6", "arrow", "10:18", "/a1", "10:24"),
        ]
    )
    assert dropped_by_watermark(query) == 3
