"""Error types of :mod:`tidelog.metadata`.

Two kinds of failure leave this package:

* an :class:`ApiError` is a *result*, not an exception: the Kafka error code and message
  that one item of a request (one topic, one config resource) gets back. The controller
  returns one per item; the broker copies both fields into the response.
* a :class:`MetadataError` is raised: a metadata record whose bytes do not decode, a
  metadata log that does not replay, a ``meta.properties`` that disagrees with the
  configuration. Configuration values that do not parse raise
  :class:`~tidelog.storage.errors.ConfigError` (re-exported here), naming key and value.
"""

from __future__ import annotations

from dataclasses import dataclass

from tidelog.protocol.error_codes import ErrorCode
from tidelog.storage.errors import ConfigError

__all__ = [
    "ApiError",
    "ConfigError",
    "MetaPropertiesError",
    "MetadataError",
    "MetadataRecordError",
    "MetadataReplayError",
]


@dataclass(frozen=True)
class ApiError:
    """A Kafka error code with the message to send along (``None``: the code says it all)."""

    code: ErrorCode
    message: str | None = None

    @property
    def ok(self) -> bool:
        return self.code is ErrorCode.NONE


#: The result of an item that succeeded.
OK = ApiError(ErrorCode.NONE)


class MetadataError(Exception):
    """Base of every error the metadata layer raises on purpose."""


class MetadataRecordError(MetadataError):
    """The bytes of a metadata record do not decode to a known record."""


class MetadataReplayError(MetadataError):
    """A decoded record cannot be applied to the image (it names a missing topic ...)."""


class MetaPropertiesError(MetadataError):
    """``meta.properties`` is unreadable or disagrees with the configuration or other dirs."""
