"""Shared pieces of the networked commands: the --bootstrap-server option, k=v parsing,
aligned tables, and one-line errors (`tidelog <cmd>: <message>`, non-zero exit)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TextIO

from tidelog.client import ClientError

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


class UsageError(Exception):
    """A command-line value that does not make sense; printed as one line, exit 2."""


def add_bootstrap(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bootstrap-server",
        default=DEFAULT_BOOTSTRAP,
        metavar="HOST:PORT",
        help=f"broker to connect to (default {DEFAULT_BOOTSTRAP})",
    )


def parse_pairs(items: Iterable[str], what: str = "--config") -> dict[str, str]:
    """``["a=1", "b=2,c=3", "d=x,y"]`` -> {"a": "1", "b": "2", "c": "3", "d": "x,y"}.

    Several pairs may share one flag, comma-separated; a part without ``=`` continues the
    value before it, so list values (``bootstrap.servers=h1:9092,h2:9092``,
    ``cleanup.policy=compact,delete``) need no quoting, as with Kafka's tools."""
    out: dict[str, str] = {}
    for item in items:
        name = ""
        for part in item.split(","):
            if not part.strip():
                continue
            key, sep, value = part.partition("=")
            if not sep:
                if not name:
                    raise UsageError(f"{what} {part!r}: expected key=value")
                out[name] += "," + part
                continue
            if not key.strip():
                raise UsageError(f"{what} {part!r}: expected key=value")
            name = key.strip()
            out[name] = value
    return out


def read_json_file(path: str, option: str) -> Any:
    """The JSON a command-line option names; an unreadable file or bad JSON is a
    UsageError naming the option."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"{option} {path}: {exc.strerror or exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{option} {path}: not valid JSON ({exc})") from None


def format_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Columns left-aligned to their widest cell, two spaces apart; no trailing blanks."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    return "\n".join(lines)


def print_table(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], out: TextIO | None = None
) -> None:
    print(format_table(headers, rows), file=out or sys.stdout)


def fail(command: str, message: object, status: int = 1) -> int:
    print(f"tidelog {command}: {message}", file=sys.stderr)
    return status


def guarded(
    command: str, run: Callable[[argparse.Namespace], int]
) -> Callable[[argparse.Namespace], int]:
    """``run`` with client errors, bad values and timeouts turned into one-line failures."""

    def wrapper(args: argparse.Namespace) -> int:
        try:
            return run(args)
        except UsageError as exc:
            return fail(command, exc, 2)
        except BrokenPipeError:
            raise  # the reader of stdout went away: `tidelog` main ends quietly, not an error
        except (ClientError, ValueError, TimeoutError, OSError) as exc:
            return fail(command, exc)

    return wrapper
