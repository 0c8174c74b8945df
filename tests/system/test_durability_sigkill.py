"""Acknowledged records survive SIGKILL mid-produce (see system_durability.py for the trials
and what is checked after each restart)."""

from __future__ import annotations

from collections.abc import Callable

from interop_broker import BrokerProcess
from system_durability import run_trials


def test_idempotent_producer_across_sigkill(brokers: Callable[[], BrokerProcess]) -> None:
    """The producer retries what was in flight at each kill against the restarted broker:
    everything ends up acknowledged, and stored exactly once."""
    run_trials(brokers(), idempotent=True, signal_name="SIGKILL", trials=10)
