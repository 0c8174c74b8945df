"""Reading the console's query strings and forms: every bad value becomes an
:class:`InputError` with a one-line reason, shown on the page with status 400."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tidelog.client.groups import parse_datetime


class InputError(ValueError):
    """A value typed into the console that does not make sense."""


def text(values: Mapping[str, str], name: str, default: str = "") -> str:
    return str(values.get(name, default)).strip()


def integer(
    values: Mapping[str, str],
    name: str,
    *,
    default: int | None = None,
    low: int | None = None,
    high: int | None = None,
    label: str | None = None,
) -> int:
    raw = text(values, name)
    what = label or name
    if not raw:
        if default is None:
            raise InputError(f"{what}: a number is required")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InputError(f"{what} {raw!r}: not a whole number") from None
    if low is not None and value < low:
        raise InputError(f"{what} {value}: must be at least {low}")
    if high is not None and value > high:
        raise InputError(f"{what} {value}: must be at most {high}")
    return value


def timestamp_ms(raw: str, what: str = "timestamp") -> int:
    """Epoch milliseconds from digits, or from an ISO 8601 time (UTC unless it names a zone)."""
    value = raw.strip()
    if not value:
        raise InputError(f"{what}: a time is required (ISO 8601, or epoch milliseconds)")
    if value.isdigit():
        return int(value)
    try:
        return parse_datetime(value)
    except ValueError as exc:
        raise InputError(f"{what}: {exc}") from None


def cursor(raw: str, partitions: set[int]) -> dict[int, int]:
    """``"0:120,1:57"`` -> {0: 120, 1: 57}: where a next page starts in each partition."""
    out: dict[int, int] = {}
    for part in raw.split(","):
        if not part.strip():
            continue
        p, sep, o = part.partition(":")
        try:
            partition, offset = int(p), int(o)
        except ValueError:
            raise InputError(f"cursor {raw!r}: expected PARTITION:OFFSET,...") from None
        if not sep or offset < 0 or partition not in partitions:
            raise InputError(f"cursor {raw!r}: expected PARTITION:OFFSET,... of this topic")
        out[partition] = offset
    if not out:
        raise InputError(f"cursor {raw!r}: expected PARTITION:OFFSET,...")
    return out


def cursor_text(positions: Mapping[int, int]) -> str:
    return ",".join(f"{p}:{o}" for p, o in sorted(positions.items()))


def pairs(raw: str, what: str) -> list[tuple[str, str]]:
    """Lines of ``name=value`` (blank lines skipped); the value may itself hold ``=``."""
    out = []
    for number, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        name, sep, value = line.partition("=")
        if not sep or not name.strip():
            raise InputError(f"{what}, line {number} {line!r}: expected name=value")
        out.append((name.strip(), value))
    return out


def choice(values: Mapping[str, str], name: str, allowed: Sequence[str], default: str = "") -> str:
    """One of ``allowed`` (matched without regard to case), as ``allowed`` spells it."""
    raw = text(values, name, default) or default
    for option in allowed:
        if raw.upper() == option.upper():
            return option
    raise InputError(f"{name} {raw!r}: expected one of {', '.join(allowed)}")
