"""Connection limits with Kafka's names and semantics (Kafka's ``ConnectionQuotas``).

* ``max.connections.per.ip`` (with ``max.connections.per.ip.overrides``,
  ``host:count,host:count``): counted per client address over every listener. A connection
  over its address's limit is accepted and closed at once, as Kafka closes it.
* ``max.connections`` (broker-wide) and ``listener.name.<l>.max.connections`` (per listener,
  falling back to ``max.connections`` as Kafka's listener prefix does): when one is reached
  the listener stops accepting until a connection of its own (or, broker-wide, any) closes.
  New clients wait in the kernel's backlog -- back pressure, not refusal, as in Kafka.
* ``max.connection.creation.rate`` and ``listener.name.<l>.max.connection.creation.rate``:
  accepts per second; a listener over its rate (or the broker over its) waits before its
  next accept. A token bucket holding one second of accepts stands in for Kafka's
  windowed rate: bursts up to the rate pass, the long-run rate is bounded.

Which listeners the broker-wide limits spare. Kafka protects the inter-broker listener
(``inter.broker.listener.name``, else the listener named after
``security.inter.broker.protocol``) when there is another broker (non-controller)
listener: replication must go on when clients have used up ``max.connections``. Its
connections still count in the total; the broker-wide limit and rate just do not hold it
back. (Kafka also closes the least recently used client connection to make room then;
Tidelog does not: a client connection is never closed for another's sake.) Controller
listeners are Kafka's controller's own socket server, with its own counts: here they have
their per-listener and per-address limits but are neither held back by nor counted in the
broker-wide total.

The limiter is pure logic: the clock is passed in (``now``, in seconds), and the accept
loop (:mod:`tidelog.broker.server`) does the waiting.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from tidelog.metadata.configs import BrokerConfig, ConfigError, parse_per_ip_overrides

__all__ = ["ConnectionLimiter", "ConnectionLimits", "resolve_host"]

UNLIMITED = 2**31 - 1  # Kafka's default for every one of these keys (Int.MaxValue)

Resolve = Callable[[str], Collection[str]]


def resolve_host(host: str) -> list[str]:
    """The addresses of ``host`` (itself when it is one), as Kafka resolves an override's
    host once when the config is read."""
    try:
        return [str(ipaddress.ip_address(host.strip("[]")))]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as exc:
        raise ConfigError(
            "max.connections.per.ip.overrides", host, f"cannot be resolved: {exc}"
        ) from None
    return sorted({str(info[4][0]) for info in infos})


@dataclass(frozen=True)
class ConnectionLimits:
    """The limits in force, read from the (effective) broker config."""

    max_connections: int = UNLIMITED
    #: listener name (upper case) -> its own limit, where it differs from max_connections
    listener_max_connections: Mapping[str, int] = field(default_factory=dict)
    per_ip: int = UNLIMITED
    #: client address -> its limit instead of per_ip
    per_ip_overrides: Mapping[str, int] = field(default_factory=dict)
    creation_rate: int = UNLIMITED
    listener_creation_rate: Mapping[str, int] = field(default_factory=dict)
    #: the inter-broker listener, spared by the broker-wide limits (None: none is)
    protected_listener: str | None = None
    #: controller listeners: not in the broker-wide total, not held back by it
    controller_listeners: frozenset[str] = frozenset()

    @classmethod
    def from_config(
        cls, config: BrokerConfig, *, resolve: Resolve = resolve_host
    ) -> ConnectionLimits:
        """The limits of ``config`` for its listeners; ConfigError (one line, naming the
        key) for a value Kafka would refuse."""
        names = [listener.name for listener in config.listeners]
        max_connections = config.get_int("max.connections")
        rate = config.get_int("max.connection.creation.rate")

        def per_listener(key: str, fallback: int) -> dict[str, int]:
            values = {}
            for name in names:
                prefixed = f"listener.name.{name.lower()}.{key}"
                if config.is_set(prefixed):
                    values[name] = config.get_int(prefixed)
                else:
                    values[name] = fallback
            return values

        per_ip = config.get_int("max.connections.per.ip")
        overrides_text = config.get_str("max.connections.per.ip.overrides") or ""
        overrides: dict[str, int] = {}
        for host, count in parse_per_ip_overrides(
            "max.connections.per.ip.overrides", overrides_text
        ).items():
            for address in resolve(host):
                overrides[address] = count
        if per_ip == 0 and not overrides:
            raise ConfigError(
                "max.connections.per.ip",
                "0",
                "refuses every client; set max.connections.per.ip.overrides for the "
                "addresses allowed",
            )
        inter_broker = (
            config.get_str("inter.broker.listener.name")
            or config.get_str("security.inter.broker.protocol")
            or "PLAINTEXT"
        ).upper()
        controllers = frozenset(config.controller_listener_names)
        # Kafka protects it only when its broker has another listener to protect it from
        # (a controller listener belongs to the controller's own socket server).
        broker_listeners = [name for name in names if name not in controllers]
        protected = (
            inter_broker if inter_broker in broker_listeners and len(broker_listeners) > 1 else None
        )
        return cls(
            max_connections=max_connections,
            listener_max_connections=per_listener("max.connections", max_connections),
            per_ip=per_ip,
            per_ip_overrides=overrides,
            creation_rate=rate,
            listener_creation_rate=per_listener("max.connection.creation.rate", UNLIMITED),
            protected_listener=protected,
            controller_listeners=controllers,
        )

    def limit_of(self, address: str) -> int:
        """How many connections ``address`` may hold."""
        return self.per_ip_overrides.get(address, self.per_ip)

    def spares(self, listener: str) -> bool:
        """Whether the broker-wide limit and rate leave ``listener`` alone."""
        return listener == self.protected_listener or listener in self.controller_listeners


class _Bucket:
    """Accepts per second as a token bucket holding one second's worth."""

    __slots__ = ("at", "rate", "tokens")

    def __init__(self, rate: int, now: float) -> None:
        self.rate = rate
        self.tokens = float(rate)
        self.at = now

    def _refill(self, now: float) -> None:
        if now > self.at:
            self.tokens = min(float(self.rate), self.tokens + (now - self.at) * self.rate)
        self.at = max(self.at, now)

    def wait(self, now: float) -> float:
        """Seconds until one more accept fits (0: now)."""
        self._refill(now)
        return 0.0 if self.tokens >= 1 else (1 - self.tokens) / self.rate

    def take(self, now: float) -> None:
        self._refill(now)
        self.tokens -= 1


class ConnectionLimiter:
    """The counts of open connections and the decisions taken on them."""

    def __init__(self, limits: ConnectionLimits | None = None) -> None:
        self.limits = limits or ConnectionLimits()
        #: listener -> open connections
        self._by_listener: dict[str, int] = {}
        #: client address -> open connections (over every listener)
        self._by_address: dict[str, int] = {}
        #: open connections counted against max.connections
        self.total = 0
        #: listener -> connections closed at once for being over their address's limit
        self.refused_per_ip: dict[str, int] = {}
        self._buckets: dict[str | None, _Bucket] = {}
        self._on_room: list[Callable[[], None]] = []

    def reconfigure(self, limits: ConnectionLimits) -> None:
        """New limits (a dynamic config change): open connections stay, as in Kafka; a
        raised limit lets waiting listeners accept again."""
        if limits == self.limits:
            return
        self.limits = limits
        self._buckets.clear()
        self._wake()

    # -- the accept loop -----------------------------------------------------------------

    def wait_time(self, listener: str, now: float) -> float | None:
        """Whether ``listener`` may accept one more connection now: 0 yes, a delay in
        seconds when a creation rate holds it back, None while a connection limit does
        (call back after :meth:`when_room`)."""
        limits = self.limits
        if self._by_listener.get(listener, 0) >= limits.listener_max_connections.get(
            listener, limits.max_connections
        ):
            return None
        spared = limits.spares(listener)
        if not spared and self.total >= limits.max_connections:
            return None
        delay = self._bucket(listener, limits.listener_creation_rate.get(listener), now)
        if not spared:
            delay = max(delay, self._bucket(None, limits.creation_rate, now))
        return delay

    def _bucket(self, listener: str | None, rate: int | None, now: float) -> float:
        if rate is None or rate >= UNLIMITED:
            return 0.0
        bucket = self._buckets.get(listener)
        if bucket is None or bucket.rate != rate:
            bucket = self._buckets[listener] = _Bucket(rate, now)
        return bucket.wait(now)

    def when_room(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, at the next close or reconfiguration."""
        self._on_room.append(callback)

    def admit(self, listener: str, address: str, now: float) -> bool:
        """Count a connection just accepted on ``listener`` from ``address``; False (and
        nothing counted) when the address is at its limit: the caller closes it."""
        if self._by_address.get(address, 0) >= self.limits.limit_of(address):
            self.refused_per_ip[listener] = self.refused_per_ip.get(listener, 0) + 1
            return False
        self._by_address[address] = self._by_address.get(address, 0) + 1
        self._by_listener[listener] = self._by_listener.get(listener, 0) + 1
        if listener not in self.limits.controller_listeners:
            self.total += 1
        for key in (listener, None):
            bucket = self._buckets.get(key)
            if bucket is not None and (key is not None or not self.limits.spares(listener)):
                bucket.take(now)
        return True

    def release(self, listener: str, address: str) -> None:
        """A connection :meth:`admit` counted has closed."""
        left = self._by_address.get(address, 0) - 1
        if left > 0:
            self._by_address[address] = left
        else:
            self._by_address.pop(address, None)
        self._by_listener[listener] = max(0, self._by_listener.get(listener, 0) - 1)
        if listener not in self.limits.controller_listeners:
            self.total = max(0, self.total - 1)
        self._wake()

    def _wake(self) -> None:
        callbacks, self._on_room = self._on_room, []
        for callback in callbacks:
            callback()

    # -- figures -------------------------------------------------------------------------

    def connections(self, listener: str) -> int:
        return self._by_listener.get(listener, 0)

    def connections_from(self, address: str) -> int:
        return self._by_address.get(address, 0)

    def listeners(self) -> list[str]:
        return sorted(self._by_listener)
