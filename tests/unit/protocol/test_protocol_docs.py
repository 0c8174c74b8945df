from __future__ import annotations

from pathlib import Path

from tidelog.protocol.versions import markdown_table

DOC = Path(__file__).resolve().parents[3] / "docs" / "protocol.md"


def test_doc_shows_the_supported_version_table_of_the_code() -> None:
    assert markdown_table() in DOC.read_text(encoding="utf-8")
