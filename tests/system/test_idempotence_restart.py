"""Idempotent produce over the wire, across SIGKILL and SIGTERM restarts of a real broker.

Batches are built by hand (producer id, epoch and base sequence chosen by the test) and
sent with the project's own protocol code, so the exact same bytes can be sent again.
Checked, on a topic of two partitions (producer state is per partition):

- a repeated batch is answered with the offset it got the first time and stored once;
- after the broker is killed (no snapshot of the producer state exists: the state must be
  rebuilt from the log) or stopped cleanly (state read from the shutdown snapshot), the
  same batches are still recognised as duplicates, the next sequence is accepted at the
  next offset, and a sequence gap gets OUT_OF_ORDER_SEQUENCE_NUMBER without being stored;
- producer ids handed out after the restart were never handed out before (a reused id
  would make the new producer's first batch look like a duplicate of the old one's, and
  be dropped while acknowledged);
- the partitions hold exactly the accepted records, in order, each once.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from interop_broker import BrokerProcess
from system_wire import WireClient, make_batch

from tidelog.protocol import ErrorCode
from tidelog.storage.manager import CLEAN_SHUTDOWN_MARKER

TOPIC = "idempotence"
PARTITIONS = 2


def values(tag: str, first: int, count: int) -> list[bytes]:
    return [f"{tag}-{i}".encode() for i in range(first, first + count)]


def produce_ok(client: WireClient, partition: int, batch: bytes, acks: int = -1) -> int:
    response = client.produce(TOPIC, partition, batch, acks=acks)
    assert response.error_code == ErrorCode.NONE, response
    return int(response.base_offset)


def stored_values(client: WireClient, partition: int) -> list[bytes | None]:
    records = client.fetch_records(TOPIC, partition)
    assert [r.offset for r in records] == list(range(len(records)))
    return [r.value for r in records]


def restart(broker: BrokerProcess, *, hard: bool) -> None:
    """SIGKILL or SIGTERM, then start again; a SIGTERM must end in a clean shutdown."""
    if hard:
        broker.kill()
    else:
        assert broker.stop() == 0
        assert (broker.data_dir / CLEAN_SHUTDOWN_MARKER).exists()
        assert broker.log_tail(5).splitlines()[-1].endswith("broker stopped cleanly")
    broker.start()


@pytest.mark.parametrize("hard", [True, False], ids=["sigkill", "sigterm"])
def test_duplicates_recognised_across_restart(
    brokers: Callable[[], BrokerProcess], hard: bool
) -> None:
    broker = brokers()
    with WireClient(broker.host, broker.port) as client:
        client.create_topic(TOPIC, PARTITIONS)
        pid, epoch = client.init_producer_id()
        assert epoch == 0
        # Per partition: batches of 3 records at sequences 0, 3, 6 (acks=all, then acks=1).
        sent: dict[int, list[bytes]] = {}
        for p in range(PARTITIONS):
            sent[p] = [
                make_batch(values(f"p{p}", seq, 3), producer=(pid, epoch, seq)) for seq in (0, 3, 6)
            ]
            assert produce_ok(client, p, sent[p][0]) == 0
            assert produce_ok(client, p, sent[p][0]) == 0, "duplicate got a new offset"
            assert produce_ok(client, p, sent[p][1], acks=1) == 3
            assert produce_ok(client, p, sent[p][2]) == 6
            assert produce_ok(client, p, sent[p][1], acks=1) == 3
            assert stored_values(client, p) == values(f"p{p}", 0, 9)
        handed_out = {pid}
        for _ in range(3):
            other, _ = client.init_producer_id()
            handed_out.add(other)
        assert len(handed_out) == 4

    restart(broker, hard=hard)

    with WireClient(broker.host, broker.port) as client:
        for p in range(PARTITIONS):
            # The newest batch first, then an older one still among the last five.
            assert produce_ok(client, p, sent[p][2]) == 6
            assert produce_ok(client, p, sent[p][0], acks=1) == 0
            assert produce_ok(client, p, sent[p][1]) == 3
            assert stored_values(client, p) == values(f"p{p}", 0, 9)

            gap = client.produce(
                TOPIC, p, make_batch(values(f"p{p}", 20, 2), producer=(pid, epoch, 20))
            )
            assert gap.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, gap
            overlap = client.produce(
                TOPIC, p, make_batch(values(f"p{p}", 4, 3), producer=(pid, epoch, 4))
            )
            assert overlap.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, overlap

            following = make_batch(values(f"p{p}", 9, 2), producer=(pid, epoch, 9))
            assert produce_ok(client, p, following) == 9
            assert produce_ok(client, p, following) == 9
            assert stored_values(client, p) == values(f"p{p}", 0, 11)

        fresh, fresh_epoch = client.init_producer_id()
        assert fresh not in handed_out, f"producer id {fresh} handed out twice"
        # The new producer's sequence 0 is its own, not a duplicate of the old one's.
        assert produce_ok(client, 0, make_batch([b"new"], producer=(fresh, fresh_epoch, 0))) == 11
        assert stored_values(client, 0) == [*values("p0", 0, 11), b"new"]

    # And once more: a second restart of the other kind keeps all of it.
    restart(broker, hard=not hard)
    with WireClient(broker.host, broker.port) as client:
        assert produce_ok(client, 0, sent[0][1]) == 3
        for p in range(PARTITIONS):
            last = make_batch(values(f"p{p}", 9, 2), producer=(pid, epoch, 9))
            assert produce_ok(client, p, last) == 9
        assert stored_values(client, 0) == [*values("p0", 0, 11), b"new"]
        assert stored_values(client, 1) == values("p1", 0, 11)
