"""`tidelog transactions list|describe|describe-producers|abort|find-hanging`: Kafka's
kafka-transactions, on the client.

``list`` asks every broker's transaction coordinator (ListTransactions), ``describe`` the
coordinator of one transactional id (FindCoordinator key type 1, then DescribeTransactions),
``describe-producers`` a partition's leader, or the replica on ``--broker-id``
(DescribeProducers). ``abort`` ends an open transaction on one partition with an ABORT
marker (WriteTxnMarkers to the leader): the transaction is named by its start offset
there, whose producer DescribeProducers gives, or by producer id, epoch and coordinator
epoch, as with Kafka's tool. ``find-hanging`` looks
for transactions open on partitions for longer than ``--max-transaction-timeout`` minutes
that their coordinator will never end: no coordinator lists the producer id, the id is
unknown to its coordinator, or its transaction there does not include the partition (it
was completed, or the coordinator's state was lost). The columns are Kafka's; a value not
known prints ``None`` as Kafka's tool prints it.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterable
from typing import Any

from tidelog.cli.output import UsageError, add_bootstrap, fail, guarded, print_table
from tidelog.client import (
    Admin,
    PartialFailureError,
    ProducerState,
    TopicPartition,
    TransactionDescription,
)
from tidelog.protocol import ErrorCode

COMMAND = "transactions"
NONE = "None"
# Kafka's default for find-hanging: transaction.max.timeout.ms is 15 minutes.
DEFAULT_MAX_TRANSACTION_TIMEOUT_MIN = 15


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "transactions",
        help="list, describe, abort and find hanging transactions",
        description=(
            "Analyze the transactional state of producers in the cluster; detect and "
            "recover from hanging transactions."
        ),
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    listing = actions.add_parser("list", help="list transactions with their coordinator")
    add_bootstrap(listing)
    listing.add_argument(
        "--state",
        action="append",
        default=[],
        metavar="STATE",
        help="only transactions in this state, e.g. Ongoing (repeatable)",
    )
    listing.add_argument(
        "--producer-id",
        action="append",
        default=[],
        type=int,
        metavar="ID",
        help="only transactions of this producer id (repeatable)",
    )
    listing.set_defaults(run=guarded(COMMAND, _list))

    describe = actions.add_parser(
        "describe", help="describe the state of an active transactional id"
    )
    add_bootstrap(describe)
    describe.add_argument("--transactional-id", required=True, metavar="ID")
    describe.set_defaults(run=guarded(COMMAND, _describe))

    producers = actions.add_parser(
        "describe-producers", help="the active producers of a topic partition"
    )
    add_bootstrap(producers)
    producers.add_argument(
        "--broker-id", type=int, metavar="N", help="ask this replica (default: the leader)"
    )
    producers.add_argument("--topic", required=True)
    producers.add_argument("--partition", required=True, type=int)
    producers.set_defaults(run=guarded(COMMAND, _describe_producers))

    abort = actions.add_parser(
        "abort", help="abort a hanging transaction on one partition (administrative)"
    )
    add_bootstrap(abort)
    abort.add_argument("--topic", required=True)
    abort.add_argument("--partition", required=True, type=int)
    abort.add_argument(
        "--start-offset", type=int, metavar="N", help="start offset of the transaction to abort"
    )
    abort.add_argument("--producer-id", type=int, metavar="ID", help="with the two below")
    abort.add_argument("--producer-epoch", type=int, metavar="N")
    abort.add_argument("--coordinator-epoch", type=int, metavar="N")
    abort.set_defaults(run=guarded(COMMAND, _abort))

    hanging = actions.add_parser(
        "find-hanging", help="transactions open on partitions that no coordinator will end"
    )
    add_bootstrap(hanging)
    hanging.add_argument(
        "--broker-id", type=int, metavar="N", help="search the partitions this broker holds"
    )
    hanging.add_argument("--topic", help="search this topic's partitions")
    hanging.add_argument("--partition", type=int, help="with --topic: only this partition")
    hanging.add_argument(
        "--max-transaction-timeout",
        type=int,
        default=DEFAULT_MAX_TRANSACTION_TIMEOUT_MIN,
        metavar="MINUTES",
        help="only transactions open longer than this "
        f"(default {DEFAULT_MAX_TRANSACTION_TIMEOUT_MIN})",
    )
    hanging.set_defaults(run=guarded(COMMAND, _find_hanging))


def _admin(args: argparse.Namespace) -> Admin:
    return Admin({"bootstrap.servers": args.bootstrap_server})


def _now_ms() -> int:
    return int(time.time() * 1000)


def _optional(value: int) -> str:
    """Kafka's tool prints an absent offset, epoch or time (-1 on the wire) as None."""
    return NONE if value < 0 else str(value)


def _partition(args: argparse.Namespace) -> TopicPartition:
    if args.partition < 0:
        raise UsageError(f"--partition {args.partition}: partitions are not negative")
    return TopicPartition(args.topic, args.partition)


def _list(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        listed = admin.list_transactions(states=args.state, producer_ids=args.producer_id)
    print_table(
        ("TransactionalId", "Coordinator", "ProducerId", "TransactionState"),
        ((t.transactional_id, t.coordinator_id, t.producer_id, t.state) for t in listed),
    )
    return 0


def _describe(args: argparse.Namespace) -> int:
    tid = args.transactional_id
    with _admin(args) as admin:
        try:
            d = admin.describe_transactions([tid])[tid]
        except PartialFailureError as exc:
            error = exc.errors.get(tid)
            if error is not None and error.code is ErrorCode.TRANSACTIONAL_ID_NOT_FOUND:
                return fail(COMMAND, f"transactional id {tid!r} does not exist")
            raise
    started = d.transaction_start_ms >= 0
    print_table(
        (
            "CoordinatorId",
            "TransactionalId",
            "ProducerId",
            "ProducerEpoch",
            "TransactionState",
            "TransactionTimeoutMs",
            "CurrentTransactionStartTimeMs",
            "TransactionDurationMs",
            "TopicPartitions",
        ),
        [
            (
                d.coordinator_id,
                d.transactional_id,
                d.producer_id,
                d.producer_epoch,
                d.state,
                d.transaction_timeout_ms,
                d.transaction_start_ms if started else NONE,
                _now_ms() - d.transaction_start_ms if started else NONE,
                ",".join(str(tp) for tp in d.partitions),
            )
        ],
    )
    return 0


def _describe_producers(args: argparse.Namespace) -> int:
    tp = _partition(args)
    with _admin(args) as admin:
        producers = admin.describe_producers([tp], broker_id=args.broker_id)[tp]
    print_table(
        (
            "ProducerId",
            "ProducerEpoch",
            "LatestCoordinatorEpoch",
            "LastSequence",
            "LastTimestamp",
            "CurrentTransactionStartOffset",
        ),
        (
            (
                p.producer_id,
                p.producer_epoch,
                p.coordinator_epoch,
                p.last_sequence,
                p.last_timestamp,
                _optional(p.current_txn_start_offset),
            )
            for p in producers
        ),
    )
    return 0


def _abort(args: argparse.Namespace) -> int:
    tp = _partition(args)
    by_producer = (args.producer_id, args.producer_epoch, args.coordinator_epoch)
    if args.start_offset is None and args.producer_id is None:
        raise UsageError(
            "name the transaction to abort with --start-offset, or with --producer-id, "
            "--producer-epoch and --coordinator-epoch"
        )
    if args.start_offset is not None and any(v is not None for v in by_producer):
        raise UsageError(
            "--start-offset names the transaction by itself: leave out --producer-id, "
            "--producer-epoch and --coordinator-epoch"
        )
    if args.start_offset is None:
        for flag, value in (
            ("--producer-epoch", args.producer_epoch),
            ("--coordinator-epoch", args.coordinator_epoch),
        ):
            if value is None:
                raise UsageError(f"--producer-id needs {flag} too")
    with _admin(args) as admin:
        if args.start_offset is not None:
            producer = _open_at(admin.describe_producers([tp])[tp], args.start_offset)
            if producer is None:
                return fail(
                    COMMAND,
                    f"no open transaction starts at offset {args.start_offset} on {tp}",
                )
            producer_id, epoch = producer.producer_id, producer.producer_epoch
            coordinator_epoch = producer.coordinator_epoch
        else:
            producer_id, epoch = args.producer_id, args.producer_epoch
            coordinator_epoch = args.coordinator_epoch
        # A producer whose transaction hung before any marker reached the partition has
        # no coordinator epoch there (-1); 0 is no greater than any coordinator's epoch,
        # so the marker is accepted (Kafka's tool does the same).
        coordinator_epoch = max(coordinator_epoch, 0)
        admin.abort_transaction(
            tp,
            producer_id=producer_id,
            producer_epoch=epoch,
            coordinator_epoch=coordinator_epoch,
        )
    print(
        f"Aborted the transaction of producer {producer_id} (epoch {epoch}, "
        f"coordinator epoch {coordinator_epoch}) on {tp}."
    )
    return 0


def _open_at(producers: Iterable[ProducerState], start_offset: int) -> ProducerState | None:
    return next((p for p in producers if p.current_txn_start_offset == start_offset), None)


# -- find-hanging ---------------------------------------------------------------------------


def _check_search_flags(args: argparse.Namespace) -> None:
    if args.topic is None and args.broker_id is None:
        raise UsageError("find-hanging needs --topic or --broker-id to limit the search")
    if args.partition is not None and args.topic is None:
        raise UsageError("--partition needs --topic")
    if args.max_transaction_timeout < 0:
        raise UsageError(
            f"--max-transaction-timeout {args.max_transaction_timeout}: minutes are not negative"
        )
    if args.partition is not None:
        _partition(args)


def _search_scope(admin: Admin, args: argparse.Namespace) -> list[TopicPartition]:
    if args.topic is not None and args.partition is not None:
        return [_partition(args)]
    topics = admin.describe_topics(None if args.topic is None else [args.topic])
    return [
        TopicPartition(name, p.partition)
        for name, info in topics.items()
        for p in info.partitions
        if args.broker_id is None or args.broker_id in p.replicas
    ]


def hanging_transactions(
    open_transactions: list[tuple[TopicPartition, ProducerState]],
    transactional_ids: dict[int, str],
    descriptions: dict[str, TransactionDescription | None],
) -> list[tuple[TopicPartition, ProducerState]]:
    """Those of ``open_transactions`` (partition, producer) that no coordinator will end:
    the producer id is listed by no coordinator, its transactional id is unknown to its
    coordinator (None), or the coordinator's transaction does not include the partition."""
    hanging = []
    for tp, producer in open_transactions:
        tid = transactional_ids.get(producer.producer_id)
        description = None if tid is None else descriptions.get(tid)
        if description is None or tp not in description.partitions:
            hanging.append((tp, producer))
    return hanging


def _find_hanging(args: argparse.Namespace) -> int:
    _check_search_flags(args)
    with _admin(args) as admin:
        scope = _search_scope(admin, args)
        max_ms = args.max_transaction_timeout * 60_000
        now_ms = _now_ms()
        candidates = [
            (tp, p)
            for tp, producers in (
                admin.describe_producers(scope, broker_id=args.broker_id) if scope else {}
            ).items()
            for p in producers
            if p.current_txn_start_offset >= 0 and now_ms - p.last_timestamp > max_ms
        ]
        transactional_ids: dict[int, str] = {}
        descriptions: dict[str, TransactionDescription | None] = {}
        if candidates:
            producer_ids = sorted({p.producer_id for _, p in candidates})
            for listing in admin.list_transactions(producer_ids=producer_ids):
                transactional_ids[listing.producer_id] = listing.transactional_id
            descriptions = _describe_known(admin, set(transactional_ids.values()))
    hanging = hanging_transactions(candidates, transactional_ids, descriptions)
    print_table(
        (
            "Topic",
            "Partition",
            "ProducerId",
            "ProducerEpoch",
            "CoordinatorEpoch",
            "StartOffset",
            "LastTimestamp",
            "Duration(min)",
        ),
        (
            (
                tp.topic,
                tp.partition,
                p.producer_id,
                p.producer_epoch,
                p.coordinator_epoch,
                p.current_txn_start_offset,
                p.last_timestamp,
                (now_ms - p.last_timestamp) // 60_000,
            )
            for tp, p in hanging
        ),
    )
    return 0


def _describe_known(admin: Admin, ids: set[str]) -> dict[str, TransactionDescription | None]:
    """Descriptions of ``ids``; None for those their coordinator does not know (any more)."""
    found: dict[str, TransactionDescription | None] = {}
    for tid in sorted(ids):
        try:
            found[tid] = admin.describe_transactions([tid])[tid]
        except PartialFailureError as exc:
            error = exc.errors.get(tid)
            if error is None or error.code is not ErrorCode.TRANSACTIONAL_ID_NOT_FOUND:
                raise
            found[tid] = None
    return found
