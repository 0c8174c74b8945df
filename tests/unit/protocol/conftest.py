"""Shared helpers for the protocol tests."""

from __future__ import annotations

import datetime

from hypothesis import strategies as st
from kio.static.primitive import Records, i64Timedelta

# kio's message classes are dataclasses whose field types Hypothesis can resolve, except the
# opaque record-batch bytes; any bytes do for the protocol layer.
st.register_type_strategy(Records, st.binary(max_size=64))  # type: ignore[type-abstract]

# kio's decoder refuses an int64 of milliseconds beyond +-9223372036854774 ("timedelta
# milliseconds overflow": it converts to microseconds in an int64), while its own strategy
# draws, and its encoder writes, up to the timedelta limits. The codec answers
# MalformedError there (a retention of 292,000 years); the round-trip draws within what kio
# can read (measured: one more millisecond either way fails).
_I64_MS = (2**63 - 1) // 1000 - 1
st.register_type_strategy(
    i64Timedelta,
    st.integers(-_I64_MS, _I64_MS).map(
        lambda ms: i64Timedelta.parse(datetime.timedelta(milliseconds=ms))
    ),
)
