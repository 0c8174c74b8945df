"""A real metadata-quorum cluster for the fault tests: N combined broker+controller
``tidelog serve`` processes on loopback, a network between their controllers that the test
can cut, and a Jepsen-style history of what clients were told.

**Nodes** are :class:`ClusterNode`, the interoperability suite's
:class:`~interop_broker.BrokerProcess` started from a properties file
(``process.roles=broker,controller``, ``controller.quorum.voters``, a PLAINTEXT and a
CONTROLLER listener): start, stop (SIGTERM), kill (SIGKILL), pause (SIGSTOP), resume
(SIGCONT), restart. All nodes are formatted with one cluster id before their first start.

**The network** between controllers is a TCP proxy per directed link (:class:`ProxyNet`):
node i's ``controller.quorum.voters`` names j at the port of the proxy of link i->j, which
forwards to j's controller listener. Everything a node sends another's controller (votes,
fetches of the metadata log, broker registrations and heartbeats, forwarded requests) takes
that link. :meth:`ProxyNet.cut` drops a link's open connections and black-holes new ones
(accepted, read, never forwarded: requests time out, as across a real partition);
:meth:`ProxyNet.heal` forwards again. Proxies rather than network namespaces: they need no
privileges and cut one direction of one link as easily as a whole node. Clients and the
harness reach every node directly, never through a proxy.

**The history** (:class:`History`) records every CreateTopics the client loop sent, with
what it was told: ``ok`` (created; also TOPIC_ALREADY_EXISTS for a name only this history
uses: an earlier attempt of the same create committed), ``fail`` (certainly not created:
the connection was refused, so nothing was sent; or a validation error), or ``info``
(indeterminate: a timeout or a lost connection after sending, NOT_CONTROLLER and the like --
a proposal may still commit after its proposer lost leadership). :func:`check_creates` is
the checker: every ``ok`` create is on every node, no ``fail`` create is on any, no topic is
there that nobody asked for, and every node holds the same topics with the same ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
for _path in (_HERE, _HERE.parent / "interop"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from interop_broker import BrokerError, BrokerProcess, free_port, send_request  # noqa: E402
from interop_data import wait_until  # noqa: E402

from tidelog.client.messages import build  # noqa: E402
from tidelog.metadata.raft.batches import decode_entries  # noqa: E402
from tidelog.protocol import ApiKey, ErrorCode, request_class  # noqa: E402

METADATA_TOPIC = "__cluster_metadata"
# Quorum timers short enough that a failover takes seconds; their ratios are Kafka's.
QUORUM_OVERRIDES = {
    "controller.quorum.election.timeout.ms": "500",
    "controller.quorum.fetch.timeout.ms": "1000",
    "controller.quorum.request.timeout.ms": "1000",
    "broker.heartbeat.interval.ms": "300",
    "broker.session.timeout.ms": "3000",
    "num.partitions": "1",
}
READY_TIMEOUT_S = 60.0
# CreateTopics timeout the client gives, and how long it waits for the answer.
CREATE_TIMEOUT_MS = 5000
CREATE_SOCKET_TIMEOUT_S = 8.0

# Errors after which the create certainly did not happen (the request itself was refused).
DEFINITE_FAILURES = frozenset(
    {
        ErrorCode.INVALID_TOPIC_EXCEPTION,
        ErrorCode.INVALID_PARTITIONS,
        ErrorCode.INVALID_REPLICATION_FACTOR,
        ErrorCode.INVALID_CONFIG,
        ErrorCode.POLICY_VIOLATION,
    }
)


# ---------------------------------------------------------------------------- the network


class _Link:
    """One directed link: a listening proxy that forwards to ``target_port``."""

    def __init__(self, source: int, destination: int, target_port: int) -> None:
        self.source = source
        self.destination = destination
        self.target_port = target_port
        self.port = 0
        self.up = True
        self.server: asyncio.Server | None = None
        self.transports: set[asyncio.BaseTransport] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self.server.sockets[0].getsockname()[1])

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.transports.add(writer.transport)
        if not self.up:
            # Black hole: read and forget until the other end gives up.
            with contextlib.suppress(Exception):
                while await reader.read(65536):
                    pass
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self.transports.add(up_writer.transport)
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    def cut(self) -> None:
        self.up = False
        for transport in list(self.transports):
            transport.abort()
        self.transports.clear()

    async def close(self) -> None:
        self.cut()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (OSError, asyncio.CancelledError):
        pass
    finally:
        writer.transport.abort()


class ProxyNet:
    """The proxies of every directed link between controllers, on a loop of their own."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.links: dict[tuple[int, int], _Link] = {}

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    def link(self, source: int, destination: int, target_port: int) -> int:
        """The port node ``source`` uses to reach ``destination``'s controller listener."""
        link = _Link(source, destination, target_port)
        self._run(link.start())
        self.links[(source, destination)] = link
        return link.port

    def _set(self, pairs: Iterable[tuple[int, int]], up: bool) -> None:
        def apply() -> None:
            for pair in pairs:
                link = self.links[pair]
                if up:
                    link.up = True
                else:
                    link.cut()

        self._loop.call_soon_threadsafe(apply)
        self._run(asyncio.sleep(0))

    def cut(self, a: int, b: int) -> None:
        """Both directions between ``a`` and ``b``."""
        self._set([(a, b), (b, a)], up=False)

    def isolate(self, node: int) -> None:
        self._set([pair for pair in self.links if node in pair], up=False)

    def heal(self) -> None:
        self._set(list(self.links), up=True)

    def close(self) -> None:
        for link in self.links.values():
            self._run(link.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


# ---------------------------------------------------------------------------- the nodes


class ClusterNode(BrokerProcess):
    """One combined broker+controller: ``port`` its client listener, ``controller_port``
    its controller listener, started from ``config_path``."""

    def __init__(self, node_id: int, workdir: Path) -> None:
        super().__init__(workdir, "tidelog", data_dir=workdir / "data")
        self.node_id = node_id
        self.controller_port = free_port()
        self.config_path = workdir / "server.properties"
        self.paused = False

    def command(self) -> list[str]:
        from interop_broker import venv_bin

        return [str(venv_bin() / "tidelog"), "serve", "--config", str(self.config_path)]

    def write_config(self, voters: dict[int, int], overrides: dict[str, str]) -> None:
        """``voters``: the port this node reaches each voter's controller on."""
        values = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": ",".join(
                f"{n}@127.0.0.1:{port}" for n, port in sorted(voters.items())
            ),
            "listeners": (
                f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}"
            ),
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir),
            **overrides,
        }
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))

    def spawn(self) -> None:
        """Start the process without waiting: a node alone never becomes ready."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.paused = False
        with self.log_path.open("ab") as log:
            self._spawn(stdout=log, stderr=subprocess.STDOUT)

    def start(self, timeout: float = READY_TIMEOUT_S) -> None:
        self.spawn()

    def _signal(self, sig: signal.Signals) -> None:
        proc = self._proc
        assert proc is not None and proc.poll() is None, f"node {self.node_id} is not running"
        proc.send_signal(sig)
        self._append_log(f"=== {sig.name}\n")

    def pause(self) -> None:
        """SIGSTOP: the process keeps its sockets but does nothing until :meth:`resume`."""
        self._signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self._signal(signal.SIGCONT)
        self.paused = False

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.paused and self.running():
            self.resume()
        return super().stop(timeout)

    def restart(self, *, hard: bool = False, timeout: float = READY_TIMEOUT_S) -> None:
        if hard:
            self.kill()
        else:
            self.stop()
        self.spawn()


@dataclass(frozen=True)
class Quorum:
    """DescribeQuorum as one node's controller answered it."""

    leader_id: int
    epoch: int
    high_watermark: int
    log_end_offsets: dict[int, int]


class Cluster:
    """``size`` nodes under ``root``, their controllers linked through a :class:`ProxyNet`."""

    def __init__(self, root: Path, size: int = 3, overrides: dict[str, str] | None = None) -> None:
        self.root = root
        self.net = ProxyNet()
        self.nodes = {n: ClusterNode(n, root / f"node-{n}") for n in range(1, size + 1)}
        self.overrides = {**QUORUM_OVERRIDES, **(overrides or {})}
        for node in self.nodes.values():
            voters = {
                other.node_id: (
                    other.controller_port
                    if other is node
                    else self.net.link(node.node_id, other.node_id, other.controller_port)
                )
                for other in self.nodes.values()
            }
            node.write_config(voters, self.overrides)
        self._format()

    def _format(self) -> None:
        from tidelog.metadata.configs import BrokerConfig
        from tidelog.metadata.meta_properties import generate_cluster_id
        from tidelog.metadata.storage_format import format_storage
        from tidelog.runtime.system import Runtime

        runtime = Runtime.system()
        self.cluster_id = generate_cluster_id(runtime.random)
        for node in self.nodes.values():
            node.data_dir.mkdir(parents=True, exist_ok=True)
            format_storage(BrokerConfig.load(str(node.config_path)), self.cluster_id, runtime)

    # -- life ----------------------------------------------------------------------------

    def start(self) -> None:
        for node in self.nodes.values():
            node.spawn()
        self.wait_ready()

    def wait_ready(self, nodes: Iterable[int] | None = None) -> int:
        """Until a leader leads, and every given (default: running) node lists every
        running node's broker in Metadata; the leader's id."""
        wanted = list(nodes) if nodes is not None else self.running_ids()
        for n in wanted:
            node = self.nodes[n]
            if not node.running():
                raise BrokerError(f"node {n} exited; log tail:\n{node.log_tail()}")

        def ready() -> bool:
            for n in wanted:
                if not self.nodes[n].running():
                    raise BrokerError(f"node {n} exited; log tail:\n{self.nodes[n].log_tail()}")
                if set(self.brokers_seen_by(n) or ()) != set(wanted):
                    return False
            return True

        try:
            wait_until(ready, f"nodes {wanted} to list each other's brokers", READY_TIMEOUT_S)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.log_tails()}") from None
        return self.wait_leader()

    def running_ids(self) -> list[int]:
        return [n for n, node in self.nodes.items() if node.running() and not node.paused]

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()

    def close(self) -> None:
        for node in self.nodes.values():
            node.kill()
        self.net.close()

    def log_tails(self, lines: int = 25) -> str:
        return "\n".join(
            f"--- node {n} ---\n{node.log_tail(lines)}" for n, node in self.nodes.items()
        )

    # -- the quorum ----------------------------------------------------------------------

    def describe_quorum(self, n: int) -> Quorum | None:
        """DescribeQuorum at node ``n``'s controller listener (directly, not through a
        proxy); None unless it answers as the leader."""
        request = build(
            request_class(ApiKey.DESCRIBE_QUORUM, 1),
            {"topics": [{"topic_name": METADATA_TOPIC, "partitions": [{"partition_index": 0}]}]},
        )
        try:
            response = send_request(
                "127.0.0.1", self.nodes[n].controller_port, request, timeout=2.0
            )
        except (OSError, ConnectionError):
            return None
        if int(response.error_code) != 0:
            return None
        partition = response.topics[0].partitions[0]
        if int(partition.error_code) != 0:
            return None
        return Quorum(
            int(partition.leader_id),
            int(partition.leader_epoch),
            int(partition.high_watermark),
            {int(r.replica_id): int(r.log_end_offset) for r in partition.current_voters},
        )

    def leader(self, among: Iterable[int] | None = None) -> Quorum | None:
        """The newest-epoch leader among the answering nodes (a node cut off may still
        believe it leads an older epoch)."""
        answers = [
            q
            for n in (among if among is not None else self.running_ids())
            if (q := self.describe_quorum(n)) is not None and q.leader_id == n
        ]
        return max(answers, key=lambda q: q.epoch, default=None)

    def wait_leader(
        self,
        among: Iterable[int] | None = None,
        *,
        not_in: Iterable[int] = (),
        after_epoch: int = -1,
        timeout: float = READY_TIMEOUT_S,
    ) -> int:
        excluded = set(not_in)

        def found() -> int | None:
            q = self.leader(among)
            if q is None or q.leader_id in excluded or q.epoch <= after_epoch:
                return None
            return q.leader_id

        try:
            return int(wait_until(found, "a quorum leader", timeout))
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.log_tails()}") from None

    # -- what each node holds ------------------------------------------------------------

    def metadata(self, n: int) -> Any | None:
        request = build(request_class(ApiKey.METADATA, 12), {"topics": None})
        try:
            return send_request("127.0.0.1", self.nodes[n].port, request, timeout=5.0)
        except (OSError, ConnectionError):
            return None

    def brokers_seen_by(self, n: int) -> list[int] | None:
        response = self.metadata(n)
        return None if response is None else sorted(int(b.node_id) for b in response.brokers)

    def topics(self, n: int) -> dict[str, str] | None:
        """{name: topic id} of every non-internal topic in node ``n``'s Metadata."""
        response = self.metadata(n)
        if response is None:
            return None
        return {
            t.name: str(t.topic_id)
            for t in response.topics
            if t.name is not None and int(t.error_code) == 0 and not t.is_internal
        }

    def wait_converged(self, timeout: float = READY_TIMEOUT_S) -> dict[int, dict[str, str]]:
        """Until every running node holds the same topics; {node: topics}."""

        def same() -> dict[int, dict[str, str]] | None:
            seen = {n: self.topics(n) for n in self.running_ids()}
            values = list(seen.values())
            if any(v is None for v in values) or any(v != values[0] for v in values):
                return None
            return {n: v for n, v in seen.items() if v is not None}

        try:
            converged: dict[int, dict[str, str]] = wait_until(
                same, "the nodes' topics to agree", timeout
            )
        except AssertionError:
            seen = {n: sorted(self.topics(n) or ()) for n in self.running_ids()}
            raise AssertionError(f"nodes never agreed on their topics: {seen}") from None
        return converged

    def snapshots(self, n: int) -> list[Path]:
        """Node ``n``'s metadata snapshot files (KIP-630 ``.checkpoint``)."""
        return sorted((self.nodes[n].data_dir / f"{METADATA_TOPIC}-0").glob("*.checkpoint"))

    def metadata_log(self, n: int) -> list[tuple[int, int, tuple[bytes, ...]]]:
        """(offset, epoch, records) of every entry in node ``n``'s metadata log files, in
        order: the log as the disk holds it (read while the node is stopped). Records, not
        batch bytes: a follower writes an entry in a batch of its own (its own timestamps)."""
        directory = self.nodes[n].data_dir / f"{METADATA_TOPIC}-0"
        return [
            (entry.offset, entry.epoch, entry.records)
            for segment in sorted(directory.glob("*.log"))
            for entry in decode_entries(segment.read_bytes())
        ]


# ---------------------------------------------------------------------------- the history


@dataclass
class Op:
    """One create as the client saw it."""

    name: str
    node: int
    outcome: str = "invoke"  # then ok | fail | info
    error: str = ""
    started: float = 0.0
    ended: float = 0.0


@dataclass
class History:
    ops: list[Op] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, op: Op) -> None:
        with self.lock:
            self.ops.append(op)

    def by_outcome(self, outcome: str) -> list[Op]:
        with self.lock:
            return [op for op in self.ops if op.outcome == outcome]

    def summary(self) -> str:
        with self.lock:
            counts = {o: sum(op.outcome == o for op in self.ops) for o in ("ok", "fail", "info")}
        return ", ".join(f"{k} {v}" for k, v in counts.items())


def create_topic(port: int, name: str) -> tuple[str, str]:
    """One CreateTopics to the broker at ``port``: (outcome, error) as :class:`History`
    classifies them."""
    request = build(
        request_class(ApiKey.CREATE_TOPICS, 5),
        {
            "topics": [{"name": name, "num_partitions": 1, "replication_factor": 1}],
            "timeout": CREATE_TIMEOUT_MS,
        },
    )
    try:
        response = send_request("127.0.0.1", port, request, timeout=CREATE_SOCKET_TIMEOUT_S)
    except ConnectionRefusedError as exc:
        return "fail", f"refused: {exc}"  # nothing was sent
    except (OSError, ConnectionError) as exc:
        return "info", f"{type(exc).__name__}: {exc}"
    code = ErrorCode.from_wire(int(response.topics[0].error_code))
    if code in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
        return "ok", code.name
    if code in DEFINITE_FAILURES:
        return "fail", code.name
    return "info", code.name


class CreateLoop:
    """Clients creating uniquely named topics in a loop, one client thread per node (so that
    a node that does not answer slows only its own), each create recorded in ``history``;
    until :meth:`stop`."""

    def __init__(self, cluster: Cluster, prefix: str, nodes: Sequence[int] | None = None) -> None:
        self.cluster = cluster
        self.prefix = prefix
        self.nodes = list(nodes) if nodes is not None else list(cluster.nodes)
        self.history = History()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(n,), daemon=True) for n in self.nodes
        ]
        self._counter = itertools.count()
        self._counter_lock = threading.Lock()

    def __enter__(self) -> CreateLoop:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self, node: int) -> None:
        while not self._stop.is_set():
            with self._counter_lock:
                i = next(self._counter)
            op = Op(f"{self.prefix}-{i:05d}", node, started=time.monotonic())
            op.outcome, op.error = create_topic(self.cluster.nodes[node].port, op.name)
            op.ended = time.monotonic()
            self.history.add(op)
            if op.outcome == "fail":
                # A refused connection comes back at once: do not spin on a dead node.
                self._stop.wait(0.05)

    def wait_acknowledged(self, count: int, timeout: float = READY_TIMEOUT_S) -> None:
        """Until ``count`` more creates are acknowledged than now."""
        target = len(self.history.by_outcome("ok")) + count
        wait_until(
            lambda: len(self.history.by_outcome("ok")) >= target,
            f"{count} more acknowledged creates ({self.history.summary()})",
            timeout,
        )

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(CREATE_SOCKET_TIMEOUT_S * 2)


def check_creates(history: History, prefix: str, seen: dict[int, dict[str, str]]) -> list[str]:
    """The checker: what the history allows against what every node holds. Returns the
    violations (empty when the history is consistent)."""
    problems: list[str] = []
    nodes = sorted(seen)
    attempted = {op.name: op for op in history.ops}
    for op in history.by_outcome("ok"):
        missing = [n for n in nodes if op.name not in seen[n]]
        if missing:
            problems.append(f"acknowledged create {op.name} (via node {op.node}) lost on {missing}")
    for op in history.by_outcome("fail"):
        present = [n for n in nodes if op.name in seen[n]]
        if present:
            problems.append(f"failed create {op.name} ({op.error}) present on {present}")
    for n in nodes:
        for name in seen[n]:
            if name.startswith(prefix) and name not in attempted:
                problems.append(f"node {n} holds {name}, which nobody created")
    first = seen[nodes[0]] if nodes else {}
    for n in nodes[1:]:
        if seen[n] != first:
            differing = sorted(set(seen[n].items()) ^ set(first.items()))
            problems.append(f"node {n} differs from node {nodes[0]}: {differing[:5]}")
    return problems
