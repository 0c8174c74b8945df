"""The transactional producer's rules that need no broker: configuration, and records
refused outside a transaction (the rest: tests/interop/test_transactions.py)."""

from __future__ import annotations

import pytest

from tidelog.client import ClientError, ConfigError, Producer


def test_a_transactional_id_needs_idempotence() -> None:
    with pytest.raises(ConfigError, match=r"transactional\.id needs idempotence"):
        Producer(
            {
                "bootstrap.servers": "127.0.0.1:9",
                "transactional.id": "t",
                "enable.idempotence": False,
            }
        )


def test_records_and_transactions_wait_for_init_transactions() -> None:
    producer = Producer({"bootstrap.servers": "127.0.0.1:9", "transactional.id": "t"})
    try:
        for send in (
            lambda: producer.send("orders", b"plain"),
            lambda: producer.send("orders", b"keyed", key=b"k"),
        ):
            with pytest.raises(ClientError, match="is uninitialized: records go only inside"):
                send()
        with pytest.raises(ClientError, match="begin_transaction: the producer is uninitialized"):
            producer.begin_transaction()
        with pytest.raises(ClientError, match="is uninitialized"):
            producer.commit_transaction(1)
    finally:
        producer.close(0)


def test_transactions_need_a_transactional_id() -> None:
    producer = Producer({"bootstrap.servers": "127.0.0.1:9"})
    try:
        with pytest.raises(ClientError, match=r"transactions need transactional\.id"):
            producer.begin_transaction()
    finally:
        producer.close(0)
