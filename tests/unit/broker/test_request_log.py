"""The slow-request log and the JSON log format, on log records captured in-process."""

from __future__ import annotations

import json
import logging

import pytest

from tidelog.broker.request_log import SlowRequestLog
from tidelog.protocol import ApiKey, ErrorCode
from tidelog.protocol.headers import RequestHeader
from tidelog.runtime.logs import JsonLogFormatter, set_log_format


def _header(api: ApiKey, version: int = 9) -> RequestHeader:
    return RequestHeader(int(api), version, 7, client_id="orders-app")


def _never_called() -> list[int]:
    raise AssertionError("error codes walked for a fast request")


def test_a_request_over_the_threshold_is_logged_with_its_time_split(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = SlowRequestLog(100)
    with caplog.at_level(logging.WARNING, logger="tidelog.request"):
        assert not log.observe(_header(ApiKey.PRODUCE), "1.2.3.4:5", _never_called, 0.1, 0.1, 0)
        codes = [int(ErrorCode.NOT_LEADER_OR_FOLLOWER), 0, int(ErrorCode.NOT_LEADER_OR_FOLLOWER)]
        assert log.observe(_header(ApiKey.PRODUCE), "1.2.3.4:5", lambda: codes, 0.25, 0.01, 0.2)
    [record] = caplog.records
    assert record.getMessage() == (
        "slow request: PRODUCE v9 from client 'orders-app' at 1.2.3.4:5 took 250.0 ms "
        "(local 10.0 ms, remote 200.0 ms, send 40.0 ms); errors NOT_LEADER_OR_FOLLOWER"
    )
    assert record.__dict__["errors"] == ["NOT_LEADER_OR_FOLLOWER"]
    assert record.__dict__["total_ms"] == 250.0


def test_waiting_on_purpose_is_not_slow_but_slow_work_is(caplog: pytest.LogCaptureFixture) -> None:
    log = SlowRequestLog(100)
    with caplog.at_level(logging.WARNING, logger="tidelog.request"):
        # A consumer's idle long poll: 500 ms of remote time, the rest fast.
        assert not log.observe(_header(ApiKey.FETCH), "p", _never_called, 0.502, 0.001, 0.5)
        assert not log.observe(_header(ApiKey.JOIN_GROUP), "p", _never_called, 3.0, 0.001, 2.99)
        # The same time waiting for an fsync (acks=all) is the broker's own slowness.
        assert log.observe(_header(ApiKey.PRODUCE), "p", list, 0.502, 0.001, 0.5)
        # A Fetch whose send took long is slow.
        assert log.observe(_header(ApiKey.FETCH), "p", list, 0.9, 0.001, 0.5)
    assert [r.__dict__["api"] for r in caplog.records] == ["PRODUCE", "FETCH"]


def test_threshold_zero_logs_everything_and_a_negative_one_is_refused() -> None:
    assert SlowRequestLog(0).observe(_header(ApiKey.METADATA), "p", list, 0.0001, 0.0001, 0)
    with pytest.raises(ValueError):
        SlowRequestLog(-1)


def test_json_lines_carry_the_extra_fields_and_the_traceback() -> None:
    record = logging.LogRecord("tidelog.request", logging.WARNING, "f", 1, "took %d ms", (5,), None)
    record.__dict__.update({"api": "PRODUCE", "total_ms": 5.0, "errors": ["X"]})
    line = json.loads(JsonLogFormatter().format(record))
    assert line["message"] == "took 5 ms"
    assert line["level"] == "WARNING"
    assert line["logger"] == "tidelog.request"
    assert (line["api"], line["total_ms"], line["errors"]) == ("PRODUCE", 5.0, ["X"])
    assert line["time"].endswith("+00:00")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        import sys

        failed = logging.LogRecord("x", logging.ERROR, "f", 1, "failed", None, sys.exc_info())
    assert "RuntimeError: boom" in json.loads(JsonLogFormatter().format(failed))["exception"]
    with pytest.raises(ValueError, match="text, json"):
        set_log_format("yaml")
