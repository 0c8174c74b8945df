from __future__ import annotations

from kio.schema.errors import ErrorCode as KioErrorCode

from tidelog.protocol import ErrorCode


def test_same_codes_and_retriable_flags_as_kio() -> None:
    ours = {int(c): (c.name, c.retriable) for c in ErrorCode}
    theirs = {int(c): (c.name.upper(), c.retriable) for c in KioErrorCode}
    assert ours == theirs


def test_range_is_contiguous_and_messages_present() -> None:
    assert sorted(int(c) for c in ErrorCode) == list(range(-1, 134))
    assert all(c.message and c.message.endswith(".") for c in ErrorCode)
    assert len({c.message for c in ErrorCode}) == len(ErrorCode)


def test_int_behaviour_and_known_values() -> None:
    assert ErrorCode.UNSUPPORTED_VERSION == 35
    assert ErrorCode(35) is ErrorCode.UNSUPPORTED_VERSION
    assert ErrorCode.NOT_LEADER_OR_FOLLOWER.retriable
    assert not ErrorCode.INVALID_REQUEST.retriable
    assert ErrorCode.NONE.value == 0


def test_conversions() -> None:
    for code in ErrorCode:
        assert code.to_kio() == code
        assert ErrorCode.from_wire(int(code)) is code
    assert ErrorCode.from_wire(9999) is ErrorCode.UNKNOWN_SERVER_ERROR
    assert ErrorCode.from_wire(-7) is ErrorCode.UNKNOWN_SERVER_ERROR
