"""The slow-request log: one line for each request that took longer than
``slow.request.threshold.ms``, naming its API, version, client id, peer, error codes and
where the time went.

The split is the one of the request metrics (docs/operations.md): *local* is the handler's
time on the event loop, *remote* the wait after it (an acks=all Produce's fsync, a Fetch
long poll, a rebalance), *send* writing the answer, *total* all of it from the request read
off the socket. A Fetch long poll and a JoinGroup or SyncGroup waiting for a rebalance wait
on purpose (``fetch.max.wait.ms``, the rebalance timeout): for those the remote time is left
out of the comparison, so that a consumer's idle poll is never called slow, while a Fetch
whose handler or send was slow still is.

Records go to the ``tidelog.request`` logger at WARNING with the figures also as record
attributes (``api``, ``client_id``, ``total_ms``, ...), which ``log.format=json`` writes as
fields. Nothing is computed for a request under the threshold but one subtraction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from tidelog.protocol import ApiKey
from tidelog.protocol.error_codes import error_name
from tidelog.protocol.headers import RequestHeader

__all__ = ["SlowRequestLog"]

_log = logging.getLogger("tidelog.request")

# APIs whose remote time is a wait the client asked for.
_WAITING_APIS = frozenset({ApiKey.FETCH, ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP})


class SlowRequestLog:
    def __init__(self, threshold_ms: int, logger: logging.Logger = _log) -> None:
        if threshold_ms < 0:
            raise ValueError("threshold_ms must be at least 0")
        self.threshold_s = threshold_ms / 1000
        self._log = logger

    def observe(
        self,
        header: RequestHeader,
        peer: str,
        error_codes: Callable[[], Iterable[int]],
        total: float,
        local: float,
        remote: float,
    ) -> bool:
        """Log the request if it was slow (times in seconds); True when it was.

        ``error_codes`` is called only for a slow request: walking a response for its
        codes costs more than the comparison."""
        counted = total - remote if header.api_key in _WAITING_APIS else total
        if counted <= self.threshold_s:
            return False
        send = max(0.0, total - local - remote)
        try:
            api = ApiKey(header.api_key).name
        except ValueError:
            api = str(header.api_key)
        errors = sorted({error_name(code) for code in error_codes() if code != 0})
        fields = {
            "api": api,
            "api_version": header.api_version,
            "client_id": header.client_id,
            "peer": peer,
            "total_ms": round(total * 1000, 1),
            "local_ms": round(local * 1000, 1),
            "remote_ms": round(remote * 1000, 1),
            "send_ms": round(send * 1000, 1),
            "errors": errors,
        }
        self._log.warning(
            "slow request: %s v%d from client %r at %s took %.1f ms "
            "(local %.1f ms, remote %.1f ms, send %.1f ms)%s",
            api,
            header.api_version,
            header.client_id,
            peer,
            fields["total_ms"],
            fields["local_ms"],
            fields["remote_ms"],
            fields["send_ms"],
            f"; errors {', '.join(errors)}" if errors else "",
            extra=fields,
        )
        return True
