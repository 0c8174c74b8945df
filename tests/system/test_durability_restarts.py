"""Acknowledged records survive SIGKILL without idempotence, and SIGTERM (a clean shutdown)
mid-produce (see system_durability.py for the trials and what is checked)."""

from __future__ import annotations

from collections.abc import Callable

from interop_broker import BrokerProcess
from system_durability import run_trials


def test_plain_producer_across_sigkill(brokers: Callable[[], BrokerProcess]) -> None:
    """Without idempotence nothing is retried across a kill: unacknowledged records are in
    doubt (present once or absent), acknowledged ones all present."""
    run_trials(brokers(), idempotent=False, signal_name="SIGKILL", trials=5)


def test_idempotent_producer_across_sigterm(brokers: Callable[[], BrokerProcess]) -> None:
    """Each stop is a clean shutdown (exit 0, clean-shutdown marker, log line)."""
    run_trials(brokers(), idempotent=True, signal_name="SIGTERM", trials=3)
