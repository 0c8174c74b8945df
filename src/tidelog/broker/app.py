"""Start and stop a single-node broker process (controller and broker in one).

Start: replay the metadata log (controller), open every partition log (recovering after
an unclean shutdown), make the partitions match the metadata image, listen.
Run: serve connections; in the background apply retention, the flush policy,
checkpoints and compaction on Kafka's schedules, each in a worker thread.
The group coordinator's driver starts with the broker (it loads ``__consumer_offsets`` in
the background) and stops first, answering the group requests still waiting.
Stop (SIGTERM/SIGINT): stop accepting and reading, finish the requests already taken
and send their responses, then flush and close every log with the clean-shutdown marker
so the next start skips recovery.
An I/O error takes its log dir offline (:mod:`tidelog.storage.manager`); the broker then
answers KAFKA_STORAGE_ERROR for the partitions on it, and stops -- one error line, exit
status 1 -- once no log dir is left, as Kafka does.

Every log dir (and the metadata log dir) is locked (``<dir>/.lock``) before anything in it
is read or written, and stays locked until the stop: a second broker on the same data is
refused before it touches anything. A start that fails closes what it had opened and
reports one line (:class:`StartupError`), without claiming a clean stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

from tidelog.broker.broker import Broker
from tidelog.broker.connection_limits import ConnectionLimiter, ConnectionLimits
from tidelog.broker.groups import GroupDriver
from tidelog.broker.handlers import HANDLERS
from tidelog.broker.handlers.registry import CONTROLLER_HANDLERS
from tidelog.broker.metrics import BrokerMetrics, MetricsServer
from tidelog.broker.partitions import Partitions
from tidelog.broker.quorum import QuorumNode
from tidelog.broker.quotas import ClientQuotaManager
from tidelog.broker.raft_driver import RaftDriver
from tidelog.broker.readiness import coordinators_not_ready
from tidelog.broker.request_log import SlowRequestLog
from tidelog.broker.server import BrokerServer
from tidelog.broker.transactions import TransactionDriver
from tidelog.metadata.configs import BrokerConfig, Endpoint, topic_log_config
from tidelog.metadata.controller import Controller, NotControllerError
from tidelog.metadata.controller.configs import effective_broker_config
from tidelog.metadata.errors import ConfigError, MetadataError
from tidelog.metadata.image import MetadataDelta, MetadataImage
from tidelog.metadata.log import METADATA_PARTITION, METADATA_TOPIC
from tidelog.metadata.meta_properties import directory_uuids
from tidelog.metadata.node import MetadataNode, build_metadata_node
from tidelog.protocol import SUPPORTED_VERSIONS, ApiKey, VersionRange, restrict
from tidelog.protocol.versions import CONTROLLER_VERSIONS
from tidelog.runtime.failing_disk import with_failing_dirs
from tidelog.runtime.filelock import FileLock, LockHeldError
from tidelog.runtime.system import Runtime, wall_clock_ms
from tidelog.security import ListenerSecurity, listener_security
from tidelog.storage import LogDirOfflineError, LogManager, StorageError, lock_log_dirs

_log = logging.getLogger("tidelog.broker")

# Kafka's "never" for interval configs; a schedule this long is not run at all.
_NEVER_MS = 2**62


class StartupError(Exception):
    """The broker could not start; the message is one line naming the path or key and the fix."""


class StopError(Exception):
    """Closing the logs failed (a full disk...): they are not marked clean, so the next start
    recovers them; or the broker stopped because every log dir went offline. The message is
    one line."""


#: The security protocols a listener is served with. A listener named for another one
#: must not start and quietly speak plain text to clients that expect TLS or SASL.
SERVED_SECURITY_PROTOCOLS = frozenset({"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"})


def check_listeners_served(config: BrokerConfig) -> dict[str, ListenerSecurity]:
    """Each listener's TLS and SASL settings, built before anything is opened: a protocol
    not served, or a key store, trust store or JAAS entry that is missing or does not load,
    stops the start with one line naming the key.

    The inter-broker and controller listeners are built and served the same way; on a
    single node nothing connects to them but clients."""
    built: dict[str, ListenerSecurity] = {}
    for listener in config.listeners:
        if listener.security_protocol not in SERVED_SECURITY_PROTOCOLS:
            raise ConfigError(
                "listeners",
                str(listener),
                f"security protocol {listener.security_protocol} is not supported",
            )
        built[listener.name] = listener_security(config, listener)
    return built


class BrokerApp:
    """One broker process's parts, in start order."""

    def __init__(
        self,
        config: BrokerConfig,
        *,
        clock: Callable[[], int] = wall_clock_ms,
        runtime: Runtime | None = None,
    ) -> None:
        self.static_config = config
        #: What the metadata node is given of the world; the real one unless a test
        #: injects another.
        self.runtime = runtime if runtime is not None else Runtime.system(clock)
        self.clock = self.runtime.clock
        self.metadata: MetadataNode | None = None
        self.controller: Controller | None = None
        self.logs: LogManager | None = None
        self.broker: Broker | None = None
        #: one server per listener, in ``listeners`` order
        self.servers: list[BrokerServer] = []
        #: The listener being bound, while it is (named by a failed start).
        self.binding: Endpoint | None = None
        self._background: list[asyncio.Task[None]] = []
        self._dir_locks: list[FileLock] = []
        self._started = False
        #: ``metrics.listener``'s counters and HTTP server (None: metrics are off)
        self.metrics: BrokerMetrics | None = None
        self.metrics_server: MetricsServer | None = None
        #: TLS and SASL settings by listener name, built first thing at start
        self.listener_security: dict[str, ListenerSecurity] = {}
        #: Connection counts and limits shared by every listener (``max.connections``...)
        self.connection_limiter = ConnectionLimiter()
        #: A voter of a metadata quorum (``controller.quorum.voters``); None on a single
        #: node, its own quorum of one.
        self.quorum: QuorumNode | None = None
        #: Set by SIGTERM/SIGINT; a quorum node waiting to be let in stops waiting.
        self.stop_requested = asyncio.Event()
        #: Why the broker stopped by itself (every log dir offline), one line; None else.
        self.failure: str | None = None

    @property
    def port(self) -> int:
        """The bound port of the first listener."""
        assert self.servers, "not listening"
        return self.servers[0].port

    async def start(self) -> None:
        # Key files are read now: a bad one fails before any directory is locked. From the
        # static config, as Kafka reads a listener's security at start (a dynamic change
        # is stored, not applied: no listener reconfiguration yet).
        self.listener_security = check_listeners_served(self.static_config)
        # Likewise the connection limits: a bad one stops the start with one line.
        self.connection_limiter.reconfigure(ConnectionLimits.from_config(self.static_config))
        # First, so that /health answers (and /ready says why not) during a long recovery.
        await self._serve_metrics()
        loop = asyncio.get_running_loop()
        # Before anything in the log dirs is read or written (building the metadata node
        # reads meta.properties and the metadata log there): one process owns them.
        self._dir_locks = await asyncio.to_thread(
            lock_log_dirs, [*self.static_config.log_dirs, self.static_config.metadata_log_dir]
        )
        node = await asyncio.to_thread(build_metadata_node, self.static_config, self.runtime)
        self.metadata = node
        controller = node.controller
        self.controller = controller
        config = controller.config
        # Values set dynamically (AlterConfigs) win over the static ones, from the start.
        self.connection_limiter.reconfigure(
            await asyncio.to_thread(ConnectionLimits.from_config, config)
        )
        logs = LogManager(
            config.log_dirs,
            clock=self.clock,
            default_config=config.default_log_config,
            # Logs found on disk open with their topic's settings (retention, max.message.
            # bytes, cleanup.policy...), not the broker's defaults.
            config_for=lambda topic: topic_log_config(
                controller.config, controller.image.topic_config(topic)
            ),
            reserved_dirs={f"{METADATA_TOPIC}-{METADATA_PARTITION}"},
            on_sync=self.metrics.observe_fsync if self.metrics is not None else None,
            fsync=with_failing_dirs(self.runtime.fsync),
        )
        logs.on_dir_offline.append(
            lambda directory, cause: loop.call_soon_threadsafe(self._log_dir_offline)
        )
        await asyncio.to_thread(logs.open)
        self.logs = logs
        for tp, report in logs.recovery_reports.items():
            if report.problems:
                _log.warning(
                    "recovered %s-%s: dropped %d bytes (%s)",
                    tp[0],
                    tp[1],
                    report.bytes_dropped,
                    "; ".join(p.reason for p in report.problems),
                )
        broker = Broker(
            node_id=config.node_id,
            partitions=Partitions(logs),
            clock=self.clock,
            controller=controller,
        )
        self.broker = broker
        broker.metrics = self.metrics
        slow_ms = config.get_int("slow.request.threshold.ms")
        broker.slow_request_log = SlowRequestLog(slow_ms) if slow_ms >= 0 else None
        broker.quotas = ClientQuotaManager(
            lambda: controller.image.client_quotas,
            self.clock,
            samples=config.get_int("quota.window.num"),
            window_ms=config.get_int("quota.window.size.seconds") * 1000,
        )
        broker.apply_metadata(controller.image, None)

        def on_change(image: MetadataImage, delta: MetadataDelta) -> None:
            # Published by the loader inside the commit path of a controller operation, in
            # a worker thread: queue the change on the loop ahead of the operation's
            # completion (see broker.py).
            loop.call_soon_threadsafe(broker.apply_metadata, image, delta)
            if delta.changed_broker_configs:
                limits = self._connection_limits_of(controller, image)
                if limits is not None:
                    loop.call_soon_threadsafe(self.connection_limiter.reconfigure, limits)
            if self.quorum is not None:
                # Leaderships of the internal topics move between nodes: each coordinator
                # owns the partitions its node leads.
                loop.call_soon_threadsafe(self._sync_coordinators)

        node.loader.add_publisher(on_change)
        quorum: QuorumNode | None = None
        if node.raft_log is not None and node.quorum_state is not None:
            # The loader is fed by the quorum from here on, on this loop.
            driver = RaftDriver.from_config(
                config,
                cluster_id=controller.image.cluster_id or "",
                log=node.raft_log,
                store=node.quorum_state,
            )
            if self.metrics is not None:
                driver.on_commit_latency = self.metrics.observe_commit
                driver.on_election = self.metrics.observe_election
            quorum = self.quorum = QuorumNode(node, driver)
            dir_ids = directory_uuids(config.log_dirs)
            # Heartbeats tell the controller which log dirs failed (KIP-858's OfflineLogDirs).
            quorum.offline_log_dirs = lambda: tuple(
                dir_ids[d] for d in list(logs.offline_dirs) if d in dir_ids
            )
            await quorum.start()
        # The group coordinator loads __consumer_offsets in the background; until a
        # partition is loaded its groups get COORDINATOR_LOAD_IN_PROGRESS.
        broker.groups = GroupDriver(broker)
        await broker.groups.start()
        # Likewise __transaction_state; from then on transactional produce is verified
        # against the coordinator (KIP-890).
        broker.transactions = TransactionDriver(broker)
        broker.transaction_verifier = broker.transactions
        await broker.transactions.start()

        accepted = restrict(HANDLERS.keys(), SUPPORTED_VERSIONS)
        broker.advertised_versions = accepted
        if quorum is None:
            await self._listen(broker, config, accepted)
        else:
            # The other voters reach this one on its controller listener; its broker then
            # registers with the active controller and serves clients once unfenced.
            await self._listen(broker, config, accepted, controllers_only=True)
            if not await self._unless_stop_requested(quorum.register(broker.run_blocking)):
                _log.info("stopped before the metadata quorum let this broker in")
                return
            await self._listen(broker, config, accepted, controllers_only=False)
        self._start_background(config)
        self._started = True
        _log.info(
            "broker %d serving on %s (cluster %s, %d partitions)",
            config.node_id,
            ", ".join(
                f"{server.listener}://{host}:{port}"
                for server in self.servers
                # A controller listener is not advertised: show where it listens.
                for host, port in [
                    broker.listener_endpoints.get(server.listener)
                    or (server.host or "0.0.0.0", server.port)
                ]
            ),
            broker.cluster_id,
            len(broker.partitions),
        )

    async def _unless_stop_requested(self, waiting: Awaitable[None]) -> bool:
        """Await ``waiting`` unless a stop is asked for first (then it is cancelled);
        whether it completed."""
        task = asyncio.ensure_future(waiting)
        stop = asyncio.ensure_future(self.stop_requested.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if task.done():
            task.result()
            return True
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return False

    async def _listen(
        self,
        broker: Broker,
        config: BrokerConfig,
        accepted: Mapping[ApiKey, VersionRange],
        *,
        controllers_only: bool | None = None,
    ) -> None:
        """Serve every listener (``controllers_only``: only the controller listeners, or
        only the others); clients of each one are given its advertised address.

        A listener bound to port 0 is advertised at the port it got. A listener that cannot
        bind stops the start; the ones already bound are closed by :meth:`stop`."""
        advertised = {endpoint.name: endpoint for endpoint in config.advertised_listeners}
        # A controller listener also serves what brokers send the controller (Kafka's
        # ControllerApis) and lists it in ApiVersions; the others serve clients only.
        on_controller = {**HANDLERS, **CONTROLLER_HANDLERS}
        on_broker = dict(HANDLERS)
        if self.quorum is not None:
            # The quorum's APIs on the controller listener; the admin APIs that change
            # metadata forwarded to the active controller from the broker listeners.
            on_controller = self.quorum.driver.listener_handlers(
                self.quorum.controller_handlers(on_controller)
            )
            on_broker = self.quorum.forwarding_handlers(on_broker)
            on_broker[ApiKey.DESCRIBE_QUORUM] = self.quorum.describe_quorum_handler()
            accepted = restrict(on_broker.keys(), CONTROLLER_VERSIONS)
        on_controller_accepted = restrict(on_controller.keys(), CONTROLLER_VERSIONS)
        controllers = set(config.controller_listener_names)
        for listener in config.listeners:
            is_controller = listener.name in controllers
            if controllers_only is not None and is_controller != controllers_only:
                continue
            if is_controller:
                broker.listener_versions[listener.name] = on_controller_accepted
            elif self.quorum is not None:
                broker.listener_versions[listener.name] = accepted
            server = BrokerServer(
                broker,
                listener.host or "0.0.0.0",
                listener.port,
                on_controller if is_controller else on_broker,
                on_controller_accepted if is_controller else accepted,
                max_frame_size=config.socket_request_max_bytes,
                max_in_flight=config.queued_max_requests,
                listener=listener.name,
                security=self.listener_security.get(listener.name),
                limiter=self.connection_limiter,
                max_idle_ms=config.get_int("connections.max.idle.ms"),
            )
            self.binding = listener
            await server.start()
            self.binding = None
            self.servers.append(server)
            given = advertised.get(listener.name)
            if given is not None:
                broker.listener_endpoints[listener.name] = (
                    given.host or "127.0.0.1",
                    given.port or server.port,
                )
        if broker.listener_endpoints:
            # The configuration guarantees at least one broker (non-controller) listener.
            broker.advertised_host, broker.advertised_port = next(
                iter(broker.listener_endpoints.values())
            )

    @staticmethod
    def _connection_limits_of(
        controller: Controller, image: MetadataImage
    ) -> ConnectionLimits | None:
        """The connection limits after a dynamic change (Kafka's are cluster-wide dynamic),
        None to keep those in force. Called in the loader's worker thread, where resolving
        an override's host name may block."""
        try:
            return ConnectionLimits.from_config(
                effective_broker_config(controller.static_config, image)
            )
        except ConfigError as exc:
            # The value was checked when it was altered; a host name may stop resolving.
            _log.warning("keeping the connection limits in force: %s", exc)
            return None

    async def _serve_metrics(self) -> None:
        address = self.static_config.metrics_listener
        if address is None:
            return
        self.metrics = BrokerMetrics()
        self.metrics.connection_limiter = self.connection_limiter
        server = MetricsServer(
            self.metrics,
            *address,
            broker=lambda: self.broker,
            ready=self.not_ready_reason,
            quorum=lambda: self.quorum,
        )
        try:
            await server.start()
        except OSError as exc:
            value = self.static_config.get_str("metrics.listener")
            raise ConfigError(
                "metrics.listener", value, f"cannot listen there: {exc.strerror or exc}"
            ) from exc
        self.metrics_server = server
        _log.info("metrics on http://%s:%d/metrics", address[0] or "0.0.0.0", server.port)

    def not_ready_reason(self) -> str | None:
        """None once the broker serves clients (``/ready``), else why not, in one line."""
        if self.broker is not None and self.quorum is not None and not self.broker.stopping:
            # A quorum node waits for a leader, then for its broker to be let in.
            reason = self.quorum.not_ready_reason()
            if reason is not None:
                return reason
        if self.broker is None or not self._started:
            return "starting: metadata and logs are being loaded"
        if self.broker.stopping:
            return "stopping"
        return coordinators_not_ready(
            [("group", self.broker.groups), ("transaction", self.broker.transactions)]
        )

    def _start_background(self, config: BrokerConfig) -> None:
        logs = self.logs
        assert logs is not None
        heartbeat_ms = config.get_int("broker.heartbeat.interval.ms")
        if self.quorum is not None:
            self._background.append(
                asyncio.create_task(self._quorum_heartbeats(heartbeat_ms), name="heartbeat")
            )
        schedules: list[tuple[str, int, Callable[[], object]]] = [
            (
                "retention",
                config.log_retention_check_interval_ms,
                lambda: logs.cleanup(self.clock()),
            ),
            (
                "flush",
                min(config.log_flush_scheduler_interval_ms, 1000),
                lambda: logs.flush_due(self.clock()),
            ),
            ("checkpoint", config.log_flush_offset_checkpoint_interval_ms, logs.checkpoint),
        ]
        if self.quorum is None:
            schedules.append(("broker heartbeat", heartbeat_ms, self._heartbeat_and_fence))
        if config.log_cleaner_enable:
            schedules.append(("cleaner", config.log_cleaner_backoff_ms, self._clean_until_idle))
        for name, interval_ms, job in schedules:
            if interval_ms < _NEVER_MS:
                self._background.append(
                    asyncio.create_task(self._every(name, interval_ms, job), name=name)
                )

    def _heartbeat_and_fence(self) -> None:
        """This node's broker heartbeats its controller (this node too), which then fences
        the brokers not heard from for ``broker.session.timeout.ms`` (Kafka's broker
        lifecycle manager and the controller's session timer)."""
        controller = self.controller
        assert controller is not None
        beat = controller.heartbeat_local_broker()
        if not beat.error.ok and controller.node_id not in controller.image.brokers:
            # Unregistered while running (UnregisterBroker): join again, as at start.
            _log.warning("broker %d was unregistered; registering it again", controller.node_id)
            controller.register_local_broker()
        controller.tick(self.clock())

    def _log_dir_offline(self) -> None:
        """A log dir went offline (the manager logged which and why): wake the long polls
        of its partitions; with no log dir left, stop."""
        logs, broker = self.logs, self.broker
        if broker is not None:
            broker.partitions.wake_offline()
        if self.stop_requested.is_set():
            return  # stopping anyway: a failure while closing is reported as one
        if logs is not None and not logs.online_dirs and self.failure is None:
            self.failure = "every log dir is offline after I/O errors: " + "; ".join(
                f"{directory}: {cause}" for directory, cause in logs.offline_dirs.items()
            )
            _log.error("shutting down: %s", self.failure)
            self.stop_requested.set()

    def _sync_coordinators(self) -> None:
        broker = self.broker
        if broker is None:
            return
        for driver in (broker.groups, broker.transactions):
            if driver is not None and not driver.stopped:
                driver.sync_with_metadata()

    async def _quorum_heartbeats(self, interval_ms: int) -> None:
        """A quorum voter's broker heartbeats the active controller (registering again if
        it was forgotten); the controller, when it is this node's, fences the brokers not
        heard from for ``broker.session.timeout.ms``."""
        quorum, broker, controller = self.quorum, self.broker, self.controller
        assert quorum is not None and broker is not None and controller is not None
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                if quorum.broker_epoch < 0:
                    await quorum.register(broker.run_blocking)
                else:
                    await quorum.heartbeat(broker.run_blocking)
                if controller.is_active():
                    await broker.run_blocking(controller.tick, self.clock())
                quorum.maybe_snapshot()
            except NotControllerError:
                continue
            except Exception:
                _log.exception("broker heartbeat failed; will try again")

    def _clean_until_idle(self, max_passes: int = 16) -> int:
        """Compact the dirtiest compacted logs, one pass each, until none is due (Kafka's
        cleaner backs off only when it finds nothing to do); the passes made."""
        assert self.logs is not None
        for passes in range(max_passes):
            if self.logs.clean_dirtiest(self.clock()) is None:
                return passes
        return max_passes

    async def _every(self, name: str, interval_ms: int, job: Callable[[], object]) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                await asyncio.to_thread(job)
            except Exception:
                _log.exception("background %s failed; will try again", name)

    async def stop(self) -> None:
        """Close what :meth:`start` opened (all of it, or as far as it got), then unlock the
        log dirs; only a broker that had started says it stopped cleanly."""
        try:
            await self._close()
        finally:
            for lock in self._dir_locks:
                lock.release()
            self._dir_locks = []
        if self._started:
            self._started = False
            offline = self.logs.offline_dirs if self.logs is not None else {}
            if offline:
                # Not clean: those dirs got no clean-shutdown marker, the next start recovers.
                _log.warning(
                    "broker stopped; log dirs offline, recovered at the next start: %s",
                    ", ".join(map(str, offline)),
                )
            else:
                _log.info("broker stopped cleanly")

    async def _close(self) -> None:
        if self.metrics_server is not None:
            await self.metrics_server.stop()
            self.metrics_server = None
        if self.broker is not None and self.broker.groups is not None:
            # First, so that no request waits on a rebalance through the server's grace
            # period: waiting group requests get NOT_COORDINATOR and their clients move on.
            await self.broker.groups.stop()
        if self.broker is not None and self.broker.transactions is not None:
            await self.broker.transactions.stop()
        if self.broker is not None:
            self.broker.begin_stopping()
        await asyncio.gather(*(server.shutdown() for server in self.servers))
        for task in self._background:
            task.cancel()
        for task in self._background:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.broker is not None:
            # Producer-state snapshots first, so the next start need not rescan the logs.
            await asyncio.to_thread(self.broker.partitions.close)
        if self.logs is not None:
            await asyncio.to_thread(self.logs.close)
        if self.quorum is not None:
            await self.quorum.close()
        if self.metadata is not None:
            self.metadata.close()


async def serve_until_signalled(
    config: BrokerConfig, *, on_started: Callable[[BrokerApp], Awaitable[None]] | None = None
) -> None:
    app = BrokerApp(config)
    stop = app.stop_requested
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    failed: StartupError | None = None
    try:
        try:
            await app.start()
        except (OSError, LockHeldError, MetadataError, StorageError) as exc:
            # Name the listener whose bind failed (a quorum node binds its controller
            # listener first, so the order of listeners does not tell).
            binding = () if app.binding is None else (app.binding,)
            failed = StartupError(failure_line(config, exc, binding))
            raise failed from exc
        if on_started is not None and not stop.is_set():
            await on_started(app)
        await stop.wait()
        if app.failure is None:
            _log.info("shutting down")
    finally:
        try:
            await app.stop()
        except (OSError, StorageError) as exc:
            closing = f"closing failed, the next start recovers: {failure_line(config, exc)}"
            if failed is not None:
                raise StartupError(f"{failed}; then {closing}") from exc
            if app.failure is not None:
                raise StopError(app.failure) from exc
            raise StopError(closing) from exc
    if app.failure is not None:
        raise StopError(app.failure)


_ANOTHER_DIR = "give the broker another directory (--data-dir)"


def run_broker(config: BrokerConfig) -> None:
    """Run until SIGTERM/SIGINT; :class:`StartupError` if the broker could not start,
    :class:`StopError` if it could not close its logs."""
    import uvloop

    uvloop.run(serve_until_signalled(config))


def failure_line(
    config: BrokerConfig,
    exc: BaseException,
    binding: Sequence[Endpoint] = (),
    *,
    another_dir: str = _ANOTHER_DIR,
) -> str:
    """What went wrong, and the fix, in one line naming the path or config key.

    ``binding``: the listener being bound when the failure happened, if any.
    ``another_dir``: how the command that failed is pointed at another directory.
    """
    if isinstance(exc, LogDirOfflineError):
        exc = exc.cause  # the I/O error itself says what to fix
    if isinstance(exc, LockHeldError):
        directory = exc.path.parent
        return (
            f"{_dir_key(config, directory)}: {directory} is in use by another process "
            f"(it holds {exc.path}); stop that broker first, or {another_dir}"
        )
    if isinstance(exc, OSError) and exc.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
        where = " and ".join(map(str, binding or config.listeners))
        if exc.errno == errno.EADDRINUSE:
            # --port sets a lone listener; with several, only listeners can move one.
            fix = "(--port)" if len(config.listeners) == 1 else "in listeners"
            return f"listeners: {where} is in use by another process; choose another port {fix}"
        return f"listeners: {where} is not an address of this machine; choose another (--host)"
    if isinstance(exc, OSError):
        reason = exc.strerror or str(exc)
        fix = _DIR_FIXES.get(exc.errno or 0, "").format(another_dir=another_dir)
        if exc.filename is None:
            # A write or fsync on a file already open: the error carries no path.
            dirs = ", ".join(str(d) for d in dict.fromkeys(config.log_dirs))
            return f"log.dirs: {reason} while writing to {dirs}{fix}"
        path = Path(exc.filename)
        return f"{_dir_key(config, path)}: cannot use {path}: {reason}{fix}"
    return str(exc)


_DIR_FIXES = {
    errno.ENOTDIR: "; {another_dir}",
    errno.EACCES: "; let the broker's user write there, or {another_dir}",
    errno.EPERM: "; let the broker's user write there, or {another_dir}",
    errno.EROFS: "; mount it writable, or {another_dir}",
    errno.ENOSPC: "; free space on that disk, or {another_dir}",
    errno.EDQUOT: "; free space within the quota, or {another_dir}",
}


def _dir_key(config: BrokerConfig, path: Path) -> str:
    """The config key that names the dir holding ``path``."""
    if config.get_str("metadata.log.dir"):
        metadata_dir = config.metadata_log_dir
        if path == metadata_dir or metadata_dir in path.parents:
            return "metadata.log.dir"
    return "log.dirs"
