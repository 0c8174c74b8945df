"""Timing settings of the metadata quorum, with Kafka's names and defaults."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RaftConfig:
    # controller.quorum.election.timeout.ms: an election lasts a random time in [T, 2T).
    election_timeout_ms: int = 1000
    # controller.quorum.fetch.timeout.ms: a follower that has not heard from its leader for
    # this long starts an election; a leader that has not been fetched by a majority for 1.5x
    # this long resigns (check-quorum).
    fetch_timeout_ms: int = 2000
    # controller.quorum.election.backoff.max.ms: the cap of the exponential back-off between
    # failed elections.
    election_backoff_max_ms: int = 1000
    # controller.quorum.request.timeout.ms: a request without a response for this long is
    # sent again.
    request_timeout_ms: int = 2000
    # controller.quorum.retry.backoff.ms: the pause before retrying a request that failed.
    retry_backoff_ms: int = 20
    # How long the leader may hold a Fetch that has nothing new (KRaft's fetch max wait).
    fetch_max_wait_ms: int = 500
    fetch_max_bytes: int = 8 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in (
            "election_timeout_ms",
            "fetch_timeout_ms",
            "election_backoff_max_ms",
            "request_timeout_ms",
            "retry_backoff_ms",
            "fetch_max_bytes",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0 <= self.fetch_max_wait_ms < self.request_timeout_ms:
            # A held Fetch must be answered before the follower gives up on it.
            raise ValueError("fetch_max_wait_ms must be below request_timeout_ms")
