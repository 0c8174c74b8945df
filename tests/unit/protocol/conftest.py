"""Shared helpers for the protocol tests."""

from __future__ import annotations

from hypothesis import strategies as st
from kio.static.primitive import Records

# kio's message classes are dataclasses whose field types Hypothesis can resolve, except the
# opaque record-batch bytes; any bytes do for the protocol layer.
st.register_type_strategy(Records, st.binary(max_size=64))  # type: ignore[type-abstract]
