"""The table from API key to handler, filled by the handler modules as they are imported."""

from __future__ import annotations

from collections.abc import Callable

from tidelog.broker.reply import Handler
from tidelog.protocol import ApiKey

HANDLERS: dict[int, Handler] = {}
#: Handlers served on controller listeners only, on top of :data:`HANDLERS`: what brokers
#: send the controller (Kafka's ``ControllerApis``), which clients never see.
CONTROLLER_HANDLERS: dict[int, Handler] = {}


def handles(api_key: ApiKey, *, controller_only: bool = False) -> Callable[[Handler], Handler]:
    """Register the decorated coroutine function as the handler of ``api_key`` (on
    controller listeners only with ``controller_only``)."""

    def register(fn: Handler) -> Handler:
        if api_key in HANDLERS or api_key in CONTROLLER_HANDLERS:
            raise RuntimeError(f"two handlers for {api_key.name}")
        (CONTROLLER_HANDLERS if controller_only else HANDLERS)[api_key] = fn
        return fn

    return register
