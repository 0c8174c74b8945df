"""How a Tidelog process writes its log: ``text`` (one readable line per record, the
default) or ``json`` (one JSON object per line, for log shippers).

A JSON line has ``time`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger`` and
``message``, ``exception`` when there is a traceback, and every attribute a record was
given with ``extra=`` (the slow-request log gives ``api``, ``client_id``, ``total_ms``, ...)
as a field of its own, so that a query can filter on them without parsing the message.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

__all__ = ["LOG_FORMATS", "JsonLogFormatter", "configure_logging", "set_log_format"]

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# The attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


class JsonLogFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                line.setdefault(key, value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def _formatter(log_format: str) -> logging.Formatter:
    if log_format == "json":
        return JsonLogFormatter()
    if log_format == "text":
        return logging.Formatter(TEXT_FORMAT)
    raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, not {log_format!r}")


def configure_logging(level: str, log_format: str = "text") -> None:
    """Log records at ``level`` and above to stderr, in ``log_format``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_formatter(log_format))
    logging.basicConfig(level=getattr(logging, level), handlers=[handler], force=True)


def set_log_format(log_format: str) -> None:
    """Switch the root handlers to ``log_format`` (once the configuration that names it is
    read: the lines before it, about reading it, stay text)."""
    formatter = _formatter(log_format)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter)
