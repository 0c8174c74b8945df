"""What the handlers share to build kio responses for the version a request came in.

kio has one class per message and version; a handler names the fields it knows and
:func:`make` keeps those the version has, so one handler serves every version.
"""

from __future__ import annotations

import datetime
import functools
import importlib
from dataclasses import fields
from typing import Any

from kio.static.primitive import i32Timedelta

from tidelog.broker.connection import RequestContext
from tidelog.metadata.controller import Controller

ZERO_THROTTLE = i32Timedelta.parse(datetime.timedelta(0))


@functools.cache
def response_module(api: str, version: int) -> Any:
    """kio's module of response classes of ``api`` (its schema name) in ``version``."""
    return importlib.import_module(f"kio.schema.{api}.v{version}.response")


@functools.cache
def field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls))


def make(cls: Any, **values: Any) -> Any:
    """An instance of ``cls`` from the values its version has (the others are dropped)."""
    names = field_names(cls)
    return cls(**{k: v for k, v in values.items() if k in names})


def controller(ctx: RequestContext) -> Controller:
    """The broker's controller (the handlers that use it are registered only with one)."""
    found = ctx.broker.controller
    assert found is not None, "broker built without a controller"
    return found
