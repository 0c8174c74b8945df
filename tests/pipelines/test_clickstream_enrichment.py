"""Pipeline 2: clicks joined with the latest value per key of a compacted users topic."""

from __future__ import annotations

import json
from typing import Any

from pipeline_helpers import pipeline, produce_keyed, read_topic


def user(name: str, country: str, tier: str) -> bytes:
    return json.dumps({"name": name, "country": country, "tier": tier}).encode()


def click(who: str, url: str, minute: int) -> tuple[bytes, bytes, None]:
    value = {"user": who, "url": url, "click_time": f"2026-03-09T10:{minute:02d}:00Z"}
    return (who.encode(), json.dumps(value).encode(), None)


def enriched(spark: Any, bootstrap: str, topic: str) -> list[tuple[str, str, Any, Any, Any]]:
    out = []
    for r in read_topic(spark, bootstrap, topic):
        v = json.loads(r.value)
        assert r.key.decode() == v["user"]
        out.append((v["user"], v["url"], v.get("name"), v.get("country"), v.get("tier")))
    return sorted(out)


def test_clicks_get_the_latest_attributes_of_their_user_when_their_batch_runs(
    spark: Any, broker: Any, create_topic: Any, topic: str, tmp_path: Any
) -> None:
    main = pipeline("clickstream_enrichment")
    users = create_topic(f"{topic}-users", 2, {"cleanup.policy": "compact"})
    clicks = create_topic(f"{topic}-clicks", 3)
    out = create_topic(f"{topic}-out", 2)
    # Keys go to the partition of their hash through the producer; a user's versions share it.
    produce_keyed(
        broker.bootstrap,
        users,
        [
            (b"u1", user("Ada", "NZ", "free"), None),
            (b"u2", user("Bo", "SE", "gold"), None),
            (b"u3", user("Cy", "FR", "free"), None),
            (b"u1", user("Ada", "NZ", "gold"), None),
            (b"u3", None, None),
        ],
    )
    produce_keyed(
        broker.bootstrap,
        clicks,
        [click("u1", "/a", 1), click("u2", "/b", 2), click("u3", "/c", 3), click("u4", "/d", 4)],
    )
    checkpoint = str(tmp_path / "cp")
    topics = {"clicks_topic": clicks, "users_topic": users, "output_topic": out}
    query = main.start(spark, broker.bootstrap, checkpoint, **topics)
    query.awaitTermination()
    assert query.exception() is None
    assert enriched(spark, broker.bootstrap, out) == [
        ("u1", "/a", "Ada", "NZ", "gold"),  # the later of two versions
        ("u2", "/b", "Bo", "SE", "gold"),
        ("u3", "/c", None, None, None),  # deleted by a tombstone
        ("u4", "/d", None, None, None),  # never known
    ]

    # The table changes; the restarted query joins new clicks with the new table and does
    # not rewrite what it already wrote.
    produce_keyed(
        broker.bootstrap,
        users,
        [
            (b"u4", user("Di", "JP", "free"), None),
            (b"u1", user("A", "NZ", "x"), None),
        ],
    )
    produce_keyed(broker.bootstrap, clicks, [click("u4", "/e", 5), click("u1", "/f", 6)])
    query = main.start(spark, broker.bootstrap, checkpoint, **topics)
    query.awaitTermination()
    assert query.exception() is None
    assert enriched(spark, broker.bootstrap, out) == [
        ("u1", "/a", "Ada", "NZ", "gold"),
        ("u1", "/f", "A", "NZ", "x"),
        ("u2", "/b", "Bo", "SE", "gold"),
        ("u3", "/c", None, None, None),
        ("u4", "/d", None, None, None),
        ("u4", "/e", "Di", "JP", "free"),
    ]


def test_the_users_table_is_the_latest_live_value_per_key(
    spark: Any, broker: Any, create_topic: Any, topic: str
) -> None:
    main = pipeline("clickstream_enrichment")
    users = create_topic(topic, 3, {"cleanup.policy": "compact"})
    versions = [(f"u{i % 7}", i) for i in range(40)]
    produce_keyed(
        broker.bootstrap,
        users,
        [(k.encode(), user(k, "C", str(i)), None) for k, i in versions] + [(b"u5", None, None)],
    )
    table = main.users_table(spark, broker.bootstrap, users).collect()
    latest = {k: str(i) for k, i in versions}
    del latest["u5"]
    assert {r.user: r.tier for r in table} == latest
    assert len(table) == len(latest)
