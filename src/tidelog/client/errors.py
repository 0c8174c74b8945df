"""The client's exceptions: one base type, carrying Kafka's error code where there is one.

Every failure a caller sees is a :class:`ClientError`. ``code`` is the Kafka
:class:`~tidelog.protocol.ErrorCode` (NETWORK_EXCEPTION for a lost connection,
REQUEST_TIMED_OUT for a request without an answer, the broker's code for a refused request) or
None for failures that are not the broker's (bad configuration, a closed client).
"""

from __future__ import annotations

from collections.abc import Mapping

from tidelog.protocol import ErrorCode


class ClientError(Exception):
    """A client operation failed; ``code`` is Kafka's error code when there is one."""

    def __init__(self, message: str, *, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code

    @property
    def retriable(self) -> bool:
        return self.code is not None and self.code.retriable

    @property
    def code_name(self) -> str | None:
        return None if self.code is None else self.code.name

    def __str__(self) -> str:
        if self.code is None or self.code.name in self.message:
            return self.message
        return f"{self.code.name}: {self.message}"


class ConfigError(ClientError, ValueError):
    """A configuration key is unknown or its value is not valid."""


class BrokerConnectionError(ClientError):
    """A connection to a broker could not be made or was lost."""

    def __init__(self, message: str, *, code: ErrorCode = ErrorCode.NETWORK_EXCEPTION) -> None:
        super().__init__(message, code=code)


class RequestTimeoutError(ClientError):
    """A request got no answer within ``request.timeout.ms``."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code=ErrorCode.REQUEST_TIMED_OUT)


class ClientClosedError(ClientError):
    """The client was closed before the operation finished."""


class UnsupportedApiError(ClientError):
    """The broker does not serve an API (or no version of it the client speaks)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code=ErrorCode.UNSUPPORTED_VERSION)


class PartialFailureError(ClientError):
    """Some items of a multi-item request failed; ``errors`` maps each failed item to its error.

    ``code`` is the code of the first failed item.
    """

    def __init__(self, what: str, errors: Mapping[object, ClientError]) -> None:
        self.errors = dict(errors)
        first = next(iter(self.errors.values()))
        detail = "; ".join(f"{item}: {err}" for item, err in self.errors.items())
        super().__init__(f"{what} failed for {detail}", code=first.code)


def broker_error(code: int, message: str | None = None, *, context: str = "") -> ClientError:
    """The :class:`ClientError` for an error code read from a response."""
    error = ErrorCode.from_wire(int(code))
    text = message or error.message
    if context:
        text = f"{context}: {text}"
    return ClientError(f"{error.name}: {text}", code=error)
