"""docs/compatibility.md shows exactly the version table the broker advertises."""

from __future__ import annotations

from pathlib import Path

from tidelog.broker.handlers import HANDLERS
from tidelog.protocol import SUPPORTED_VERSIONS, restrict
from tidelog.protocol.versions import markdown_table

DOC = Path(__file__).resolve().parents[3] / "docs" / "compatibility.md"


def test_the_documented_table_is_the_advertised_one() -> None:
    table = markdown_table(restrict(HANDLERS.keys(), SUPPORTED_VERSIONS)).strip()
    assert table in DOC.read_text(encoding="utf-8")
