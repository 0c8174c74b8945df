"""Errors of the group and transaction coordinators."""

from __future__ import annotations


class CoordinatorError(Exception):
    """Base class of the coordinator's own errors."""


class GroupRecordError(CoordinatorError, ValueError):
    """A ``__consumer_offsets`` record (or consumer protocol blob) could not be decoded."""


class TransactionRecordError(CoordinatorError, ValueError):
    """A ``__transaction_state`` record could not be decoded."""
