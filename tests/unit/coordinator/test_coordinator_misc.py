"""Configuration, timers, the driver-facing helpers."""

from __future__ import annotations

from coordinator_helpers import Harness
from hypothesis import given
from hypothesis import strategies as st

from tidelog.coordinator import GroupConfig, GroupRecord, Write, map_append_error
from tidelog.coordinator.timers import Timers
from tidelog.metadata.configs import BrokerConfig
from tidelog.protocol.error_codes import ErrorCode
from tidelog.records import decode_records

E = ErrorCode


def test_config_from_broker_config_uses_kafka_names() -> None:
    broker = BrokerConfig.from_mapping(
        {
            "offsets.topic.num.partitions": "7",
            "offsets.retention.minutes": "3",
            "group.initial.rebalance.delay.ms": "0",
            "group.min.session.timeout.ms": "100",
            "group.max.session.timeout.ms": "200",
            "group.max.size": "9",
        }
    )
    cfg = GroupConfig.from_broker_config(broker)
    assert cfg.offsets_topic_num_partitions == 7
    assert cfg.offsets_retention_ms == 180_000
    assert cfg.group_initial_rebalance_delay_ms == 0
    assert (cfg.group_min_session_timeout_ms, cfg.group_max_session_timeout_ms) == (100, 200)
    assert cfg.group_max_size == 9
    assert cfg.offset_metadata_max_bytes == 4096
    defaults = GroupConfig.from_broker_config(BrokerConfig.from_mapping({}))
    assert defaults == GroupConfig()


def test_write_to_batch_holds_all_records_in_one_batch() -> None:
    w = Write(1, 0, (GroupRecord(b"k1", b"v1"), GroupRecord(b"k2", None)))
    recs = decode_records(w.to_batch(1234))
    assert [(r.key, r.value, r.timestamp) for r in recs] == [
        (b"k1", b"v1", 1234),
        (b"k2", None, 1234),
    ]


def test_append_error_mapping() -> None:
    assert map_append_error(E.NOT_LEADER_OR_FOLLOWER, offsets=True) is E.NOT_COORDINATOR
    assert map_append_error(E.NOT_ENOUGH_REPLICAS, offsets=False) is E.COORDINATOR_NOT_AVAILABLE
    assert map_append_error(E.MESSAGE_TOO_LARGE, offsets=True) is E.INVALID_COMMIT_OFFSET_SIZE
    assert map_append_error(E.MESSAGE_TOO_LARGE, offsets=False) is E.UNKNOWN_SERVER_ERROR
    assert map_append_error(E.CORRUPT_MESSAGE, offsets=False) is E.CORRUPT_MESSAGE


def test_next_deadline_tells_the_driver_when_to_tick() -> None:
    h = Harness()
    assert h.coord.next_deadline() is None
    h.join()  # MEMBER_ID_REQUIRED: the pending id expires after the session timeout
    assert h.coord.next_deadline() == h.now + 10_000
    h.advance(0)  # the first tick also plans the retention check
    assert h.coord.next_deadline() == h.now + 10_000


@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 100)), max_size=40), st.integers(0, 100)
)
def test_timers_pop_in_deadline_order_and_last_schedule_wins(
    ops: list[tuple[int, int]], now: int
) -> None:
    timers = Timers()
    latest: dict[int, int] = {}
    for key, deadline in ops:
        timers.schedule(key, deadline)
        latest[key] = deadline
    popped = []
    while (due := timers.pop_due(now)) is not None:
        popped.append(due)
    expected = sorted(((k, d) for k, d in latest.items() if d <= now), key=lambda kd: kd[1])
    assert [d for _, d in popped] == [d for _, d in expected]
    assert sorted(popped) == sorted(expected)
    assert len(timers) == sum(1 for d in latest.values() if d > now)
