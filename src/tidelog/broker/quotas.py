"""Client quota enforcement: byte rates of Produce and Fetch (KIP-13, KIP-124, KIP-219).

Sans-io: :class:`RateSensor` is the rate Kafka measures a quota with, and
:class:`ClientQuotaManager` keeps one per resolved quota entity and turns a recorded
amount into a throttle time. Both take the time as an argument or from an injected clock;
the handlers put the throttle time in the response and mute the connection for it.

The rate is Kafka's sampled rate: ``quota.window.num`` samples (11) of
``quota.window.size.seconds`` (1 s) each. A sample starts at the first record after the
previous one ended, samples older than the whole window are forgotten, and the rate is
the sum of the samples over the time from the oldest sample's start to now, that time
being at least ``num - 1`` sample lengths (so the first bytes of a new client do not look
like an enormous rate).

Throttle time, as Kafka's ``QuotaUtils.throttleTime``: the time it takes, with nothing
more recorded, for the rate to come back down to the quota::

    (rate - quota) / quota * window length

Every amount is recorded, also one over the quota (Kafka records, then checks): nothing a
client sends is refused or dropped; it is only told to wait.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from tidelog.metadata.quotas import CLIENT_ID, USER, QuotaEntity, resolve_quota

__all__ = [
    "CONSUMER_BYTE_RATE",
    "PRODUCER_BYTE_RATE",
    "ClientQuotaManager",
    "QuotaFigure",
    "RateSensor",
    "throttle_time_ms",
]

PRODUCER_BYTE_RATE: Final = "producer_byte_rate"
CONSUMER_BYTE_RATE: Final = "consumer_byte_rate"


@dataclass(frozen=True)
class QuotaFigure:
    """One measured group for the metrics: Kafka tags it with user and client id, empty
    when the quota's entity has no such part."""

    key: str
    user: str
    client_id: str
    recorded_bytes: int
    throttle_time_ms: int
    rate: float


@dataclass
class _Sample:
    start_ms: int
    value: float = 0.0


class RateSensor:
    """Amount per second over ``samples`` windows of ``window_ms`` (Kafka's ``Rate``)."""

    __slots__ = ("_current", "_samples", "samples", "window_ms")

    def __init__(self, samples: int = 11, window_ms: int = 1000) -> None:
        if samples < 2 or window_ms < 1:
            raise ValueError("a rate needs at least 2 samples of at least 1 ms")
        self.samples = samples
        self.window_ms = window_ms
        self._samples: list[_Sample] = []
        self._current = 0

    def record(self, amount: float, now_ms: int) -> None:
        if not self._samples:
            self._samples.append(_Sample(now_ms))
        sample = self._samples[self._current]
        if now_ms - sample.start_ms >= self.window_ms:
            # The current sample is complete: the next one starts now, taking the place of
            # the oldest once there are ``samples`` of them.
            self._current = (self._current + 1) % self.samples
            if self._current >= len(self._samples):
                self._samples.append(_Sample(now_ms))
            else:
                self._samples[self._current] = _Sample(now_ms)
            sample = self._samples[self._current]
        sample.value += amount

    def _forget_old(self, now_ms: int) -> None:
        whole = self.samples * self.window_ms
        for i, sample in enumerate(self._samples):
            if now_ms - sample.start_ms >= whole:
                self._samples[i] = _Sample(now_ms)

    def window_length_ms(self, now_ms: int) -> int:
        """The time the rate is measured over: from the oldest sample's start, at least
        ``samples - 1`` whole windows."""
        self._forget_old(now_ms)
        oldest = min((s.start_ms for s in self._samples), default=now_ms)
        elapsed = now_ms - oldest
        full_windows = elapsed // self.window_ms
        if full_windows < self.samples - 1:
            elapsed += (self.samples - 1 - full_windows) * self.window_ms
        return elapsed

    def rate(self, now_ms: int) -> float:
        """Amount per second."""
        length_ms = self.window_length_ms(now_ms)
        total = sum(s.value for s in self._samples)
        return total / (length_ms / 1000)


def throttle_time_ms(rate: float, quota: float, window_length_ms: int) -> int:
    """How long the client must wait for ``rate`` to come down to ``quota`` (0 when it is
    within the quota; Kafka's bound is inclusive)."""
    if rate <= quota:
        return 0
    return round((rate - quota) / quota * window_length_ms)


class ClientQuotaManager:
    """Rate sensors per quota key and client group, and the throttle time they give.

    ``quotas`` returns the image's quotas as they are now, so a quota changed by
    AlterClientQuotas applies from the next request on. The group measured together is
    the entity the quota comes from with each ``<default>`` replaced by the client's own
    name (Kafka's quota metric tags): a ``/users/alice`` quota is shared by all of alice's
    client ids, while ``/clients/<default>`` gives every client id a quota of its own. A
    client with no quota is not measured.
    """

    def __init__(
        self,
        quotas: Callable[[], Mapping[QuotaEntity, Mapping[str, float]]],
        clock: Callable[[], int],
        *,
        samples: int = 11,
        window_ms: int = 1000,
    ) -> None:
        self._quotas = quotas
        self._clock = clock
        self.samples = samples
        self.window_ms = window_ms
        self._sensors: dict[tuple[str, QuotaEntity], RateSensor] = {}
        #: (key, group) -> [bytes recorded, throttle time given in ms], for the metrics
        self._totals: dict[tuple[str, QuotaEntity], list[int]] = {}

    def quota(self, key: str, user: str, client_id: str) -> tuple[QuotaEntity, float] | None:
        quotas = self._quotas()
        # Most clusters set no quota: skip the eight lookups on every request.
        return resolve_quota(quotas, user, client_id, key) if quotas else None

    def record(self, key: str, user: str, client_id: str, amount: int) -> int:
        """Record ``amount`` (bytes of one request) against the quota ``key`` that applies
        to (``user``, ``client_id``); the throttle time in ms (0: within quota, or none)."""
        found = self.quota(key, user, client_id)
        if found is None:
            return 0
        entity, quota = found
        group = _group(entity, user, client_id)
        sensor = self._sensors.get((key, group))
        if sensor is None:
            sensor = self._sensors[key, group] = RateSensor(self.samples, self.window_ms)
            self._totals[key, group] = [0, 0]
        now_ms = self._clock()
        sensor.record(amount, now_ms)
        throttle_ms = throttle_time_ms(sensor.rate(now_ms), quota, sensor.window_length_ms(now_ms))
        totals = self._totals[key, group]
        totals[0] += amount
        totals[1] += throttle_ms
        return throttle_ms

    def figures(self) -> list[QuotaFigure]:
        """Every group measured: what it was recorded and told, and its rate now."""
        now_ms = self._clock()
        out = []
        for (key, group), sensor in self._sensors.items():
            names = dict(group)
            recorded, throttled = self._totals[key, group]
            out.append(
                QuotaFigure(
                    key,
                    names.get(USER) or "",
                    names.get(CLIENT_ID) or "",
                    recorded,
                    throttled,
                    sensor.rate(now_ms),
                )
            )
        return out

    def rate(self, key: str, user: str, client_id: str) -> float:
        """The measured rate of the entity (user, client_id) resolves to (0: not measured)."""
        found = self.quota(key, user, client_id)
        if found is None:
            return 0.0
        sensor = self._sensors.get((key, _group(found[0], user, client_id)))
        return sensor.rate(self._clock()) if sensor is not None else 0.0


def _group(entity: QuotaEntity, user: str, client_id: str) -> QuotaEntity:
    """The clients measured together under ``entity``: its types, with the client's own
    names where the entity has the type's default."""
    own = {USER: user, CLIENT_ID: client_id}
    return tuple((kind, own[kind] if name is None else name) for kind, name in entity)
