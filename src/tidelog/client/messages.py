"""Building kio request objects of any version from one version-independent description.

kio has one dataclass per (API, version), and fields come and go between versions (a topic is
named by ``name`` in Fetch v12 and by ``topic_id`` in v13). The client describes a request once,
as plain Python values::

    build(request_class(ApiKey.FETCH, v), {"max_wait": 500, "topics": [{"topic": t, ...}]})

and :func:`build` keeps the fields the chosen class has, ignores the others, converts plain
values to the field's kind (milliseconds to ``timedelta``, dicts to nested entities, lists to
tuples) and fills fields the description leaves out with Kafka's defaults: the schema's own
default, else 0, false, empty or null, as Kafka's generated message classes do.
"""

from __future__ import annotations

import dataclasses
import datetime
import types
import typing
import uuid
from collections.abc import Mapping
from functools import cache
from typing import Any, TypeVar

T = TypeVar("T")

ZERO_UUID = uuid.UUID(int=0)


@dataclasses.dataclass(frozen=True, slots=True)
class _FieldPlan:
    name: str
    kafka_type: str | None
    nested: type | None  # entity class of a nested field or of an array's items
    is_array: bool
    nullable: bool
    has_default: bool


def _unwrap(tp: Any) -> tuple[Any, bool]:
    """``X | None`` -> (X, True); anything else -> (tp, False)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        nullable = len(args) != len(typing.get_args(tp))
        return (args[0] if len(args) == 1 else tp), nullable
    return tp, False


@cache
def _plan(cls: type) -> tuple[_FieldPlan, ...]:
    plans = []
    for f in dataclasses.fields(cls):
        tp, nullable = _unwrap(f.type)
        is_array = typing.get_origin(tp) is tuple
        item = typing.get_args(tp)[0] if is_array else tp
        item, _ = _unwrap(item)
        nested = item if isinstance(item, type) and dataclasses.is_dataclass(item) else None
        has_default = (
            f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        )
        plans.append(
            _FieldPlan(
                f.name, f.metadata.get("kafka_type"), nested, is_array, nullable, has_default
            )
        )
    return tuple(plans)


def _zero(plan: _FieldPlan) -> Any:
    if plan.is_array:
        return None if plan.nullable else ()
    if plan.nullable:
        return None
    if plan.nested is not None:
        return build(plan.nested, {})
    kind = plan.kafka_type or ""
    if kind == "bool":
        return False
    if kind == "string":
        return ""
    if kind == "bytes" or kind == "records":
        return b""
    if kind == "uuid":
        return ZERO_UUID
    if kind.startswith("timedelta"):
        return datetime.timedelta(0)
    if kind.startswith("datetime"):
        return datetime.datetime.fromtimestamp(0, datetime.UTC)
    if kind == "float64":
        return 0.0
    return 0


def _scalar(plan: _FieldPlan, value: Any) -> Any:
    if value is None:
        return None
    kind = plan.kafka_type or ""
    if kind.startswith("timedelta") and isinstance(value, int | float):
        return datetime.timedelta(milliseconds=value)
    if kind.startswith("datetime") and isinstance(value, int | float):
        return datetime.datetime.fromtimestamp(value / 1000, datetime.UTC)
    return value


def _convert(plan: _FieldPlan, value: Any) -> Any:
    if value is None:
        return None if plan.nullable else _zero(plan)
    if plan.is_array:
        if plan.nested is not None:
            return tuple(v if dataclasses.is_dataclass(v) else build(plan.nested, v) for v in value)
        return tuple(_scalar(plan, v) for v in value)
    if plan.nested is not None and isinstance(value, Mapping):
        return build(plan.nested, value)
    return _scalar(plan, value)


def build(cls: type[T], values: Mapping[str, Any]) -> T:
    """An instance of the kio class ``cls`` from ``values`` (see the module docstring)."""
    kwargs: dict[str, Any] = {}
    for plan in _plan(cls):  # type: ignore[arg-type]  # classes are hashable
        if plan.name in values:
            kwargs[plan.name] = _convert(plan, values[plan.name])
        elif not plan.has_default:
            kwargs[plan.name] = _zero(plan)
    return cls(**kwargs)


def has_field(cls: type, name: str) -> bool:
    """Whether the kio class ``cls`` has a field ``name`` (fields differ between versions)."""
    return any(p.name == name for p in _plan(cls))


def millis(value: Any) -> int:
    """A duration field read from a response (``timedelta``) in whole milliseconds."""
    if isinstance(value, datetime.timedelta):
        return int(value / datetime.timedelta(milliseconds=1))
    return int(value)


def epoch_millis(value: Any) -> int:
    """A timestamp field read from a response (``datetime`` or int) in epoch milliseconds."""
    if isinstance(value, datetime.datetime):
        return int(value.timestamp() * 1000)
    return int(value)
