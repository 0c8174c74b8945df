"""The table from API key to handler, filled by the handler modules as they are imported."""

from __future__ import annotations

from collections.abc import Callable

from tidelog.broker.reply import Handler
from tidelog.protocol import ApiKey

HANDLERS: dict[int, Handler] = {}


def handles(api_key: ApiKey) -> Callable[[Handler], Handler]:
    """Register the decorated coroutine function as the handler of ``api_key``."""

    def register(fn: Handler) -> Handler:
        if api_key in HANDLERS:
            raise RuntimeError(f"two handlers for {api_key.name}")
        HANDLERS[api_key] = fn
        return fn

    return register
