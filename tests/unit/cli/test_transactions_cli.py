"""`tidelog transactions`: which open transactions count as hanging, and flags that make no
sense refused in one line with status 2 before any broker is asked (the bootstrap address
below has no listener, so a command that tried to connect would fail with status 1)."""

from __future__ import annotations

import pytest

from tidelog.cli.main import main
from tidelog.cli.transactions import hanging_transactions
from tidelog.client import ProducerState, TopicPartition, TransactionDescription

NOWHERE = ("--bootstrap-server", "127.0.0.1:9")
T0 = TopicPartition("orders", 0)
T1 = TopicPartition("orders", 1)


def _producer(producer_id: int, start: int = 10) -> ProducerState:
    return ProducerState(producer_id, 3, 7, 1_700_000_000_000, 2, start)


def _described(tid: str, *partitions: TopicPartition) -> TransactionDescription:
    return TransactionDescription(
        tid, 1, "Ongoing", 5, 3, 60_000, 1_700_000_000_000, tuple(partitions)
    )


def test_a_transaction_its_coordinator_is_still_running_is_not_hanging() -> None:
    open_txns = [(T0, _producer(5))]
    assert hanging_transactions(open_txns, {5: "app"}, {"app": _described("app", T0, T1)}) == []


def test_hanging_when_no_coordinator_knows_the_producer() -> None:
    open_txns = [(T0, _producer(5)), (T1, _producer(6))]
    found = hanging_transactions(open_txns, {6: "other"}, {"other": _described("other", T1)})
    assert found == [(T0, _producer(5))]


def test_hanging_when_the_transactional_id_is_unknown_to_its_coordinator() -> None:
    open_txns = [(T0, _producer(5))]
    assert hanging_transactions(open_txns, {5: "app"}, {"app": None}) == open_txns


def test_hanging_when_the_coordinators_transaction_does_not_include_the_partition() -> None:
    # The coordinator completed (or never had) this partition: no marker will come for it.
    open_txns = [(T0, _producer(5)), (T1, _producer(5))]
    found = hanging_transactions(open_txns, {5: "app"}, {"app": _described("app", T1)})
    assert found == [(T0, _producer(5))]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["abort", "--topic", "t", "--partition", "0"],
            "name the transaction to abort with --start-offset",
        ),
        (
            ["abort", "--topic", "t", "--partition", "0", "--producer-id", "4"],
            "--producer-id needs --producer-epoch too",
        ),
        (
            ["abort", "--topic", "t", "--partition", "0", "--producer-id", "4",
             "--producer-epoch", "1"],
            "--producer-id needs --coordinator-epoch too",
        ),
        (
            ["abort", "--topic", "t", "--partition", "0", "--start-offset", "3",
             "--producer-id", "4"],
            "--start-offset names the transaction by itself",
        ),
        (
            ["abort", "--topic", "t", "--partition", "-1", "--start-offset", "3"],
            "--partition -1: partitions are not negative",
        ),
        (["find-hanging"], "find-hanging needs --topic or --broker-id"),
        (["find-hanging", "--broker-id", "1", "--partition", "0"], "--partition needs --topic"),
        (
            ["find-hanging", "--broker-id", "1", "--max-transaction-timeout", "-5"],
            "--max-transaction-timeout -5: minutes are not negative",
        ),
        (
            ["describe-producers", "--topic", "t", "--partition", "-2"],
            "--partition -2: partitions are not negative",
        ),
    ],
)  # fmt: skip
def test_nonsense_flags_are_one_line_errors_with_status_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["transactions", *argv, *NOWHERE])
    out, err = capsys.readouterr()
    assert status == 2
    assert out == ""
    assert err.startswith("tidelog transactions: ") and message in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["describe"], "the following arguments are required: --transactional-id"),
        (["describe-producers", "--topic", "t"], "required: --partition"),
        (["abort", "--partition", "0", "--start-offset", "1"], "required: --topic"),
        (["list", "--producer-id", "x"], "--producer-id: invalid int value: 'x'"),
        (["list", "--statee", "Ongoing"], "unrecognized arguments: --statee"),
        (["hang"], "invalid choice: 'hang'"),
    ],
)
def test_missing_or_unknown_flags_print_the_actions_usage(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["transactions", *argv, *NOWHERE])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: tidelog transactions")
    assert message in err


def test_a_broker_that_cannot_be_reached_is_a_one_line_failure(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = main(["transactions", "list", *NOWHERE])
    out, err = capsys.readouterr()
    assert status == 1 and out == ""
    assert err.startswith("tidelog transactions: ") and err.count("\n") == 1
