"""How the console shows bytes and sizes: UTF-8 text, pretty JSON, or hex."""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass

# Past this many bytes a key, value or header is cut on the page (the page stays small).
SHOWN_BYTES = 16 * 1024


@dataclass(frozen=True, slots=True)
class Shown:
    kind: str  # "null", "json", "text" or "hex"
    text: str
    size: int
    truncated: bool = False


def show_bytes(data: bytes | None, limit: int = SHOWN_BYTES) -> Shown:
    """``data`` as JSON (an object or array, indented), UTF-8 text, or hex pairs."""
    if data is None:
        return Shown("null", "null", 0)
    size = len(data)
    part = data[:limit]
    truncated = size > limit
    text = _utf8(part, cut=truncated)
    if text is None:
        return Shown("hex", part.hex(" "), size, truncated)
    if not truncated and text.lstrip()[:1] in ("{", "["):
        try:
            parsed = json.loads(text)
        except ValueError:
            pass
        else:
            return Shown("json", json.dumps(parsed, indent=2, ensure_ascii=False), size)
    return Shown("text", text, size, truncated)


def text_or_hex(data: bytes | None) -> tuple[str | None, str]:
    """``data`` whole as (UTF-8 text, "utf-8"), or (hex, "hex") when it is not UTF-8."""
    if data is None:
        return None, "null"
    text = _utf8(data, cut=False)
    return (text, "utf-8") if text is not None else (data.hex(), "hex")


def _utf8(data: bytes, *, cut: bool) -> str | None:
    """``data`` decoded, or None if it is not UTF-8. A cut may split the last character (up
    to 3 of its bytes), which does not make the rest binary."""
    for drop in range(4 if cut else 1):
        try:
            return data[: len(data) - drop].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return None


def human_bytes(size: int | None) -> str:
    if size is None or size < 0:
        return "-"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


def timestamp_text(ms: int) -> str:
    """Epoch milliseconds as an ISO 8601 UTC time (``-`` for Kafka's "no timestamp", -1)."""
    if ms < 0:
        return "-"
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
