"""Cluster membership: brokers register, heartbeat, are fenced and shut down (KRaft's way).

Kafka's ClusterControlManager and BrokerHeartbeatManager, sans-io: every operation is
given the committed image (through a :class:`ControllerView`) and the time, and returns
the records to commit and the reply.

* **BrokerRegistration**: a broker registers with its cluster id (another cluster's gets
  INCONSISTENT_CLUSTER_ID), a new incarnation id at every process start, its listeners,
  rack and log dirs. It registers *fenced*; its broker epoch is the offset of its
  RegisterBrokerRecord. The same incarnation registering again with the same
  registration is answered with the epoch it has, writing nothing, so a retried request
  whose answer was lost is harmless (Kafka writes a new record and epoch here); with
  other listeners it is registered anew. A new incarnation while the old one's session is
  live (unfenced and heard from within ``broker.session.timeout.ms``) is refused with
  DUPLICATE_BROKER_REGISTRATION: two processes claim one id.
* **BrokerHeartbeat**: a broker epoch that is not the registration's gets
  STALE_BROKER_EPOCH. A fenced broker is unfenced once the metadata offset it reports has
  reached its registration's offset (it has seen itself register); an unfenced broker
  asking to shut down enters controlled shutdown: it is taken out of the ISRs and its
  leaderships move to other active replicas (:mod:`.leaders`); once it leads nothing and
  every active broker has seen those changes, the answer says ``should_shut_down`` and it
  is fenced. A broker that wants to be fenced is.
* **Sessions** (:class:`BrokerSessions`, the active controller's soft state, never
  recorded): an unfenced broker not heard from for ``broker.session.timeout.ms`` is fenced
  by :meth:`ClusterControl.fence_one_expired`, driven by the injected clock. A controller
  that is not active fences nobody; one that becomes active gives every broker a full
  session from then.
* **UnregisterBroker**: the registration goes (BROKER_ID_NOT_REGISTERED when there is
  none), its leaderships move first.

With one node nothing can take a leadership over: a broker in controlled shutdown leaves
its partitions without a leader, still in their ISR (as Kafka does without eligible
leader replicas), and gets them back when it is unfenced after its restart.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from tidelog.metadata.controller.base import ControllerResult, ControllerView
from tidelog.metadata.controller.elections import unclean_policy
from tidelog.metadata.controller.leaders import (
    UncleanPolicy,
    elect_leaderless,
    leads_any,
    remove_from_leadership,
)
from tidelog.metadata.errors import OK, ApiError
from tidelog.metadata.image import BrokerRegistration, MetadataImage
from tidelog.metadata.records import (
    BrokerEndpoint,
    BrokerRegistrationChangeRecord,
    MetadataRecord,
    RegisterBrokerRecord,
    UnregisterBrokerRecord,
)
from tidelog.protocol.error_codes import ErrorCode

__all__ = [
    "BrokerSessions",
    "BrokerState",
    "ClusterControl",
    "HeartbeatReply",
    "HeartbeatRequest",
    "RegistrationReply",
    "RegistrationRequest",
    "broker_state",
]

_NEVER = 2**63 - 1


@dataclass(frozen=True)
class RegistrationRequest:
    """What BrokerRegistration (API 62) carries that the controller uses."""

    broker_id: int
    cluster_id: str | None
    incarnation_id: uuid.UUID
    listeners: tuple[BrokerEndpoint, ...]
    rack: str | None = None
    log_dirs: tuple[uuid.UUID, ...] = ()


@dataclass(frozen=True)
class RegistrationReply:
    error: ApiError
    broker_epoch: int = -1


@dataclass(frozen=True)
class HeartbeatRequest:
    """BrokerHeartbeat (API 63)."""

    broker_id: int
    broker_epoch: int
    current_metadata_offset: int
    want_fence: bool = False
    want_shut_down: bool = False
    #: The directory ids (``directory.id`` of meta.properties) of the broker's log dirs
    #: that went offline after an I/O error (v1 ``OfflineLogDirs``).
    offline_log_dirs: tuple[uuid.UUID, ...] = ()


@dataclass(frozen=True)
class HeartbeatReply:
    error: ApiError
    is_caught_up: bool = False
    is_fenced: bool = True
    should_shut_down: bool = False
    in_controlled_shutdown: bool = False


class BrokerState(enum.Enum):
    """Kafka's BrokerControlState, read from a registration in the image."""

    FENCED = "fenced"
    UNFENCED = "unfenced"
    CONTROLLED_SHUTDOWN = "controlled shutdown"
    SHUTDOWN_NOW = "shutdown now"

    @property
    def fenced(self) -> bool:
        return self in (BrokerState.FENCED, BrokerState.SHUTDOWN_NOW)


def broker_state(registration: BrokerRegistration) -> BrokerState:
    if registration.in_controlled_shutdown:
        return BrokerState.SHUTDOWN_NOW if registration.fenced else BrokerState.CONTROLLED_SHUTDOWN
    return BrokerState.FENCED if registration.fenced else BrokerState.UNFENCED


@dataclass
class _Session:
    last_contact_ms: int
    #: The metadata offset the broker last reported (-1: none yet).
    metadata_offset: int = -1
    #: Offset of the last record of its entry into controlled shutdown (-1: not known).
    shutdown_offset: int = -1


class BrokerSessions:
    """When each broker was last heard from, and what it reported (Kafka's
    BrokerHeartbeatManager). Soft state of the active controller, rebuilt from nothing
    when a controller becomes active: every broker then gets a full session."""

    def __init__(self, session_timeout_ms: int) -> None:
        self.session_timeout_ms = session_timeout_ms
        self._sessions: dict[int, _Session] = {}

    def touch(self, broker_id: int, now: int, metadata_offset: int | None = None) -> None:
        session = self._sessions.get(broker_id)
        if session is None:
            session = self._sessions[broker_id] = _Session(now)
        session.last_contact_ms = max(session.last_contact_ms, now)
        if metadata_offset is not None:
            session.metadata_offset = metadata_offset

    def register(self, broker_id: int, now: int) -> None:
        """A new registration: a new session, nothing reported yet."""
        self._sessions[broker_id] = _Session(now)

    def forget(self, broker_id: int) -> None:
        self._sessions.pop(broker_id, None)

    def clear(self) -> None:
        self._sessions.clear()

    def has_valid_session(self, registration: BrokerRegistration, now: int) -> bool:
        """Whether the registered process is alive as far as this controller knows: unfenced
        and heard from within the session timeout. A controller that has not heard from it
        since it started does not know it is alive."""
        if registration.fenced:
            return False
        session = self._sessions.get(registration.broker_id)
        return session is not None and now - session.last_contact_ms <= self.session_timeout_ms

    def _start(self, image: MetadataImage, now: int) -> None:
        # Unfenced brokers never heard from (this controller just became active, or just
        # restarted) get a session from now, so they are not fenced at once.
        for broker_id, registration in image.brokers.items():
            if not registration.fenced and broker_id not in self._sessions:
                self._sessions[broker_id] = _Session(now)

    def expired(self, image: MetadataImage, now: int) -> list[int]:
        """Unfenced brokers not heard from for longer than the session timeout, by id."""
        self._start(image, now)
        return [
            broker_id
            for broker_id, registration in sorted(image.brokers.items())
            if not registration.fenced
            and now - self._sessions[broker_id].last_contact_ms > self.session_timeout_ms
        ]

    def next_deadline(self, image: MetadataImage, now: int) -> int | None:
        """When the first unfenced broker's session runs out if it stays silent."""
        self._start(image, now)
        deadlines = [
            self._sessions[b].last_contact_ms + self.session_timeout_ms + 1
            for b, registration in image.brokers.items()
            if not registration.fenced
        ]
        return min(deadlines) if deadlines else None

    def set_shutdown_offset(self, broker_id: int, offset: int) -> None:
        session = self._sessions.get(broker_id)
        if session is not None:
            session.shutdown_offset = offset

    def shutdown_offset(self, broker_id: int) -> int:
        session = self._sessions.get(broker_id)
        return -1 if session is None else session.shutdown_offset

    def lowest_active_offset(self, image: MetadataImage, *, besides: int) -> int:
        """The lowest metadata offset reported by the active brokers other than
        ``besides`` (no such broker: no bound)."""
        offsets = [
            self._sessions[b].metadata_offset if b in self._sessions else -1
            for b, registration in image.brokers.items()
            if b != besides and registration.active
        ]
        return min(offsets) if offsets else _NEVER


class ClusterControl:
    """Registration, heartbeats, fencing and unregistration. Holds the sessions; every
    other piece of state is in the image and changes only when the records commit."""

    def __init__(self, session_timeout_ms: int) -> None:
        self.sessions = BrokerSessions(session_timeout_ms)
        self._active = True
        #: The log dirs each broker last reported offline in its heartbeats (see
        #: :meth:`note_offline_log_dirs`); heartbeats repeat them, so this is only memory.
        self.offline_log_dirs: dict[int, frozenset[uuid.UUID]] = {}

    @property
    def active(self) -> bool:
        return self._active

    def activate(self) -> None:
        """This controller became the active one: sessions start afresh."""
        self.sessions.clear()
        self._active = True

    def deactivate(self) -> None:
        """Another controller is active: this one fences nobody."""
        self.sessions.clear()
        self._active = False

    # -- BrokerRegistration ---------------------------------------------------------------

    def register_broker(
        self, view: ControllerView, request: RegistrationRequest, now: int
    ) -> ControllerResult[RegistrationReply]:
        """BrokerRegistration: the broker epoch once committed, or why not."""
        image = view.image
        if request.cluster_id != image.cluster_id:
            return _refused(
                ErrorCode.INCONSISTENT_CLUSTER_ID,
                f"broker {request.broker_id} is of cluster {request.cluster_id!r}, "
                f"this is {image.cluster_id!r}",
            )
        if request.broker_id < 0:
            return _refused(ErrorCode.INVALID_REQUEST, f"broker id {request.broker_id} < 0")
        existing = image.brokers.get(request.broker_id)
        if existing is not None:
            if existing.incarnation_id == request.incarnation_id:
                if (existing.endpoints, existing.rack, existing.log_dirs) == (
                    request.listeners,
                    request.rack,
                    request.log_dirs,
                ):
                    self.sessions.touch(request.broker_id, now)
                    return ControllerResult(RegistrationReply(OK, existing.epoch))
            elif self.sessions.has_valid_session(existing, now):
                return _refused(
                    ErrorCode.DUPLICATE_BROKER_REGISTRATION,
                    f"broker {request.broker_id} is registered by another live process "
                    f"(incarnation {existing.incarnation_id})",
                )
        record = RegisterBrokerRecord(
            request.broker_id,
            request.incarnation_id,
            request.listeners,
            request.rack,
            fenced=True,
            in_controlled_shutdown=False,
            log_dirs=request.log_dirs,
        )
        self.sessions.register(request.broker_id, now)
        return ControllerResult(
            RegistrationReply(OK, view.first_record_offset),
            ((0, (record,)),),
            lambda errors: RegistrationReply(errors[0]),
        )

    # -- BrokerHeartbeat ------------------------------------------------------------------

    def heartbeat(
        self, view: ControllerView, request: HeartbeatRequest, now: int
    ) -> ControllerResult[HeartbeatReply]:
        """BrokerHeartbeat: the broker's next state, and the records that bring it there."""
        image = view.image
        registration = image.brokers.get(request.broker_id)
        if registration is None:
            return ControllerResult(
                HeartbeatReply(
                    ApiError(
                        ErrorCode.STALE_BROKER_EPOCH,
                        f"no broker is registered with id {request.broker_id}",
                    )
                )
            )
        if request.broker_epoch != registration.epoch:
            return ControllerResult(
                HeartbeatReply(
                    ApiError(
                        ErrorCode.STALE_BROKER_EPOCH,
                        f"broker epoch {request.broker_epoch} is not the current "
                        f"{registration.epoch} of broker {request.broker_id}",
                    )
                )
            )
        broker_id = request.broker_id
        self.sessions.touch(broker_id, now, request.current_metadata_offset)
        self.note_offline_log_dirs(broker_id, request.offline_log_dirs)
        caught_up = request.current_metadata_offset >= registration.epoch
        current = broker_state(registration)
        following = self._next_state(image, registration, request, current, caught_up)
        records: list[MetadataRecord] = []
        if following is not current:
            records = self._transition(image, registration, following, unclean_policy(view))
        if following is BrokerState.CONTROLLED_SHUTDOWN and current is not following:
            # Shut down only once every active broker has seen the leaderships move.
            self.sessions.set_shutdown_offset(
                broker_id, view.first_record_offset + len(records) - 1
            )
        reply = HeartbeatReply(
            OK,
            is_caught_up=caught_up,
            is_fenced=following.fenced,
            should_shut_down=following is BrokerState.SHUTDOWN_NOW,
            in_controlled_shutdown=following
            in (BrokerState.CONTROLLED_SHUTDOWN, BrokerState.SHUTDOWN_NOW),
        )
        if not records:
            return ControllerResult(reply)
        return ControllerResult(
            reply,
            ((0, tuple(records)),),
            lambda errors: HeartbeatReply(errors[0], is_caught_up=caught_up),
        )

    def note_offline_log_dirs(
        self, broker_id: int, dirs: Sequence[uuid.UUID]
    ) -> frozenset[uuid.UUID]:
        """Remember the log dirs ``broker_id`` reports offline; the ones newly reported.

        The hook for moving leadership off a failed disk (Kafka's
        ``handleDirectoriesOffline``): for every partition with a replica of this broker
        on one of the new dirs, the controller must take the broker out of the ISR and,
        where it led, elect a leader among the rest of the ISR, as when the broker is
        fenced. That needs to know which dir holds each replica (KIP-858's replica
        directory assignments); until then the dirs are only recorded here."""
        reported = frozenset(dirs)
        before = self.offline_log_dirs.get(broker_id, frozenset())
        if reported:
            self.offline_log_dirs[broker_id] = reported
        else:
            self.offline_log_dirs.pop(broker_id, None)
        return reported - before

    def _next_state(
        self,
        image: MetadataImage,
        registration: BrokerRegistration,
        request: HeartbeatRequest,
        current: BrokerState,
        caught_up: bool,
    ) -> BrokerState:
        """Kafka's ``BrokerHeartbeatManager.calculateNextBrokerState``."""
        broker_id = registration.broker_id
        if current is BrokerState.FENCED:
            if request.want_shut_down:
                return BrokerState.SHUTDOWN_NOW
            if not request.want_fence and caught_up:
                return BrokerState.UNFENCED
            return BrokerState.FENCED
        if current is BrokerState.UNFENCED:
            if request.want_fence:
                return BrokerState.SHUTDOWN_NOW if request.want_shut_down else BrokerState.FENCED
            if request.want_shut_down:
                if leads_any(image, broker_id):
                    return BrokerState.CONTROLLED_SHUTDOWN
                return BrokerState.SHUTDOWN_NOW
            return BrokerState.UNFENCED
        if current is BrokerState.CONTROLLED_SHUTDOWN:
            if request.want_fence:
                return BrokerState.SHUTDOWN_NOW
            if leads_any(image, broker_id):
                return BrokerState.CONTROLLED_SHUTDOWN
            offset = self.sessions.shutdown_offset(broker_id)
            if offset < 0:
                # Entered before this controller became active: the change is committed
                # at or below the image's offset.
                offset = image.offset
                self.sessions.set_shutdown_offset(broker_id, offset)
            if self.sessions.lowest_active_offset(image, besides=broker_id) >= offset:
                return BrokerState.SHUTDOWN_NOW
            return BrokerState.CONTROLLED_SHUTDOWN
        return BrokerState.SHUTDOWN_NOW

    @staticmethod
    def _transition(
        image: MetadataImage,
        registration: BrokerRegistration,
        following: BrokerState,
        unclean: UncleanPolicy,
    ) -> list[MetadataRecord]:
        broker_id, epoch = registration.broker_id, registration.epoch
        records: list[MetadataRecord] = []
        if following is BrokerState.UNFENCED:
            records.append(BrokerRegistrationChangeRecord(broker_id, epoch, fenced=False))
            records.extend(elect_leaderless(image, broker_id, unclean))
        elif following is BrokerState.FENCED:
            records.extend(remove_from_leadership(image, broker_id, unclean))
            records.append(BrokerRegistrationChangeRecord(broker_id, epoch, fenced=True))
        elif following is BrokerState.CONTROLLED_SHUTDOWN:
            records.extend(remove_from_leadership(image, broker_id, unclean))
            records.append(
                BrokerRegistrationChangeRecord(broker_id, epoch, in_controlled_shutdown=True)
            )
        else:
            records.extend(remove_from_leadership(image, broker_id, unclean))
            records.append(
                BrokerRegistrationChangeRecord(
                    broker_id,
                    epoch,
                    fenced=None if registration.fenced else True,
                    in_controlled_shutdown=None if registration.in_controlled_shutdown else True,
                )
            )
        return records

    # -- sessions -------------------------------------------------------------------------

    def fence_one_expired(self, view: ControllerView, now: int) -> ControllerResult[int | None]:
        """Fence the first unfenced broker whose session ran out (its leaderships move
        first); the reply is its id, None when there is none or this controller is not
        active. One at a time, as Kafka does, so that each is chosen against an image
        where the previous one is already fenced."""
        if not self._active:
            return ControllerResult(None)
        expired = self.sessions.expired(view.image, now)
        if not expired:
            return ControllerResult(None)
        registration = view.image.brokers[expired[0]]
        records = self._transition(
            view.image, registration, BrokerState.FENCED, unclean_policy(view)
        )
        return ControllerResult(registration.broker_id, ((0, tuple(records)),), lambda _: None)

    def next_deadline(self, image: MetadataImage, now: int) -> int | None:
        """When :meth:`fence_one_expired` may next fence someone (None: nobody to watch)."""
        return self.sessions.next_deadline(image, now) if self._active else None

    # -- UnregisterBroker -----------------------------------------------------------------

    def unregister_broker(self, view: ControllerView, broker_id: int) -> ControllerResult[ApiError]:
        """UnregisterBroker: the registration is removed, its leaderships moved first."""
        registration = view.image.brokers.get(broker_id)
        if registration is None:
            return ControllerResult(
                ApiError(
                    ErrorCode.BROKER_ID_NOT_REGISTERED,
                    f"broker {broker_id} is not registered",
                )
            )
        records: list[MetadataRecord] = [
            *remove_from_leadership(view.image, broker_id, unclean_policy(view))
        ]
        records.append(UnregisterBrokerRecord(broker_id, registration.epoch))
        self.sessions.forget(broker_id)
        return ControllerResult(OK, ((0, tuple(records)),), lambda errors: errors[0])


def _refused(code: ErrorCode, message: str) -> ControllerResult[RegistrationReply]:
    return ControllerResult(RegistrationReply(ApiError(code, message)))


def endpoints_of(listeners: Sequence[tuple[str, str, int, str]]) -> tuple[BrokerEndpoint, ...]:
    """(name, host, port, security protocol) tuples as registration endpoints."""
    return tuple(
        BrokerEndpoint(name, host, port, protocol) for name, host, port, protocol in listeners
    )
