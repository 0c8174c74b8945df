from __future__ import annotations

import json

import pytest

from tidelog.cli.consume import parse_time, render
from tidelog.cli.output import UsageError, format_table, parse_pairs
from tidelog.client import ConsumerRecord


def test_table_aligns_columns() -> None:
    text = format_table(("A", "LONGER"), [(1, "x"), ("wide cell", None)])
    assert text.splitlines() == ["A          LONGER", "1          x", "wide cell"]


def test_parse_pairs() -> None:
    assert parse_pairs(["a=1,b=2", "c=x=y"]) == {"a": "1", "b": "2", "c": "x=y"}
    with pytest.raises(UsageError, match="expected key=value"):
        parse_pairs(["novalue"])
    with pytest.raises(UsageError, match="expected key=value"):
        parse_pairs(["=1"])


def test_parse_pairs_keeps_list_values_whole() -> None:
    """Kafka's list values hold commas: a part without "=" continues the value before it."""
    assert parse_pairs(["bootstrap.servers=h1:9092,h2:9092,h3:9092"]) == {
        "bootstrap.servers": "h1:9092,h2:9092,h3:9092"
    }
    assert parse_pairs(["cleanup.policy=compact,delete,retention.ms=1000"]) == {
        "cleanup.policy": "compact,delete",
        "retention.ms": "1000",
    }
    assert parse_pairs(["a=1,"]) == {"a": "1"}


def test_parse_time() -> None:
    assert parse_time("1500") == 1500
    assert parse_time("1970-01-01T00:00:01Z") == 1000
    assert parse_time("1970-01-01T00:00:02") == 2000
    assert parse_time("1970-01-01T01:00:00+01:00") == 0
    with pytest.raises(UsageError):
        parse_time("yesterday")


def test_render_formats() -> None:
    record = ConsumerRecord("t", 1, 5, 9, b"k", b"\xff\x00", (("h", None),))
    assert render(record, "kv", ":") == "k:\\xff\x00"
    data = json.loads(render(record, "json"))
    assert data == {
        "topic": "t",
        "partition": 1,
        "offset": 5,
        "timestamp": 9,
        "key": "k",
        "value": {"base64": "/wA="},
        "headers": [["h", None]],
    }
    assert render(record._replace(value=None), "value") == "null"
