"""`tidelog cluster up|describe`: a local cluster in one command, and what a cluster is made of.

``cluster up`` runs N combined broker+controller nodes on loopback as child processes of
this one, each a ``tidelog serve --config FILE``. The files are ``--config-dir``'s
``server-<n>.properties`` (``make cluster`` gives ``examples/cluster/``), or written by
:func:`node_properties` for other sizes -- the same text the example files hold, so the
two cannot drift apart unnoticed (a test compares them). Before the first start every
node's directories are formatted with one cluster id (``tidelog storage format``), since
nodes that formatted themselves would each pick their own. The children run in their own
session: a Ctrl-C reaches this supervisor only, which then stops them one by one and says
so. A node that exits before it is ready stops the start: one line names it with the tail
of its log, and the others are stopped.

``cluster describe`` lists the brokers (fenced ones too) with how many partitions each
leads and how many replicas it holds, the controller the brokers name, and the quorum's
leader, epoch, high watermark and each voter's lag.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tidelog.cli.metadata_quorum import (
    add_quorum_bootstrap,
    describe_quorum,
    print_replication,
)
from tidelog.cli.output import UsageError, fail, guarded, print_table
from tidelog.client import Admin, ClientError, TopicInfo
from tidelog.protocol import ErrorCode

DEFAULT_BASE_DIR = "/tmp/tidelog-cluster"
# Clients reach node n on CLIENT_BASE_PORT + n - 1, its controller listener is
# CONTROLLER_BASE_PORT + n - 1 (what examples/cluster/ holds for three nodes).
CLIENT_BASE_PORT = 19092
CONTROLLER_OFFSET = 100
# How long the nodes may take to elect a controller and register every broker.
READY_TIMEOUT_S = 60.0
# How long a node may take to exit after SIGTERM before it is killed.
STOP_TIMEOUT_S = 15.0
_LOG_NAME = "server.log"
_POLL_S = 0.2


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "cluster",
        help="start a local cluster, or describe a cluster",
        description="Start a local multi-node cluster, or describe a running one.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    up = actions.add_parser(
        "up",
        help="run N broker+controller nodes on loopback until Ctrl-C",
        description=(
            "Format and start N combined broker+controller nodes on 127.0.0.1, wait until "
            "they have elected a controller and registered every broker, print how to reach "
            "them, and stop them all on Ctrl-C or SIGTERM."
        ),
    )
    up.add_argument("--nodes", type=int, default=3, help="how many nodes (default 3)")
    up.add_argument(
        "--base-dir",
        default=DEFAULT_BASE_DIR,
        metavar="DIR",
        help=f"each node's data and log go to DIR/node-<n> (default {DEFAULT_BASE_DIR})",
    )
    up.add_argument(
        "--config-dir",
        metavar="DIR",
        help="take DIR/server-<n>.properties instead of generated files (log.dirs is still "
        "DIR of --base-dir)",
    )
    up.add_argument(
        "--base-port",
        type=int,
        default=CLIENT_BASE_PORT,
        metavar="PORT",
        help=f"client port of node 1 (default {CLIENT_BASE_PORT}); controllers use PORT+"
        f"{CONTROLLER_OFFSET} and up",
    )
    up.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config given to every node, e.g. --override num.partitions=3 (repeatable)",
    )
    up.set_defaults(run=_run_up)

    describe = actions.add_parser(
        "describe", help="brokers, the controller and the metadata quorum"
    )
    add_quorum_bootstrap(describe)
    describe.add_argument(
        "--controllers",
        metavar="HOST:PORT[,HOST:PORT]",
        help="with --bootstrap-server: controller listeners to describe the quorum from",
    )
    describe.set_defaults(run=guarded("cluster describe", _run_describe))


# ---------------------------------------------------------------------------- configuration


def node_properties(node_id: int, nodes: int, base_port: int, log_dir: str) -> str:
    """The properties of node ``node_id`` of an ``nodes``-node local cluster."""
    voters = ",".join(
        f"{n}@127.0.0.1:{base_port + CONTROLLER_OFFSET + n - 1}" for n in range(1, nodes + 1)
    )
    client = base_port + node_id - 1
    controller = base_port + CONTROLLER_OFFSET + node_id - 1
    return (
        f"# Node {node_id} of a {nodes}-node local cluster: broker and controller in one "
        "process, on loopback.\n"
        "# Start them all with `tidelog cluster up` (or `make cluster`); see README.md.\n"
        "process.roles=broker,controller\n"
        f"node.id={node_id}\n"
        f"controller.quorum.voters={voters}\n"
        f"listeners=PLAINTEXT://127.0.0.1:{client},CONTROLLER://127.0.0.1:{controller}\n"
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{client}\n"
        "controller.listener.names=CONTROLLER\n"
        "inter.broker.listener.name=PLAINTEXT\n"
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT\n"
        f"# `tidelog cluster up --base-dir DIR` gives DIR/node-{node_id} instead.\n"
        f"log.dirs={log_dir}\n"
    )


def _properties(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith(("#", "!")) and "=" in line:
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def _listener_address(listeners: str, name: str) -> str:
    for item in listeners.split(","):
        listener, _, address = item.strip().partition("://")
        if listener.strip().upper() == name:
            return address
    raise UsageError(f"listeners={listeners} has no {name} listener")


@dataclass
class Node:
    """One child node: its files, addresses and process."""

    node_id: int
    config: Path
    data_dir: Path
    bootstrap: str
    controller: str
    process: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.data_dir.parent / _LOG_NAME

    def log_tail(self, lines: int = 1) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return "(no log)"
        kept = [line.strip() for line in text if line.strip()]
        return " | ".join(kept[-lines:]) if kept else "(empty log)"


def plan_nodes(args: argparse.Namespace) -> list[Node]:
    """The nodes to run: their config files (given or written) and addresses."""
    if not 1 <= args.nodes <= 9:
        raise UsageError(f"--nodes {args.nodes}: give 1 to 9 nodes")
    highest = args.base_port + CONTROLLER_OFFSET + args.nodes - 1
    if args.base_port < 1024 or highest > 65535:
        raise UsageError(f"--base-port {args.base_port}: ports would leave 1024-65535")
    base = Path(args.base_dir).resolve()
    nodes = []
    for n in range(1, args.nodes + 1):
        node_dir = base / f"node-{n}"
        data_dir = node_dir / "data"
        if args.config_dir:
            config = Path(args.config_dir) / f"server-{n}.properties"
            if not config.is_file():
                raise UsageError(f"--config-dir {args.config_dir}: no server-{n}.properties")
        else:
            node_dir.mkdir(parents=True, exist_ok=True)
            config = node_dir / "server.properties"
            config.write_text(node_properties(n, args.nodes, args.base_port, str(data_dir)))
        values = _properties(config)
        listeners = values.get("listeners", "")
        advertised = values.get("advertised.listeners") or listeners
        nodes.append(
            Node(
                n,
                config.resolve(),
                data_dir,
                _listener_address(advertised, "PLAINTEXT"),
                _listener_address(listeners, values.get("controller.listener.names", "CONTROLLER")),
            )
        )
    return nodes


def format_nodes(nodes: Sequence[Node], overrides: Sequence[str]) -> str:
    """Format every node's directories with one cluster id: the one already there if a node
    was formatted before (a second `cluster up` on the same dirs), else a new one."""
    from tidelog.metadata.configs import BrokerConfig
    from tidelog.metadata.meta_properties import generate_cluster_id, read_meta_properties
    from tidelog.metadata.storage_format import format_storage
    from tidelog.runtime.system import Runtime

    existing = {
        meta.cluster_id
        for node in nodes
        if (meta := read_meta_properties(node.data_dir)) is not None and meta.cluster_id
    }
    if len(existing) > 1:
        raise UsageError(
            f"the nodes under {nodes[0].data_dir.parent.parent} belong to different clusters "
            f"({', '.join(sorted(existing))}): give another --base-dir"
        )
    runtime = Runtime.system()
    cluster_id = existing.pop() if existing else generate_cluster_id(runtime.random)
    for node in nodes:
        node.data_dir.mkdir(parents=True, exist_ok=True)
        config = BrokerConfig.load(str(node.config), [*overrides, _log_dirs(node)])
        format_storage(config, cluster_id, runtime, ignore_formatted=True)
    return cluster_id


def _log_dirs(node: Node) -> str:
    return f"log.dirs={node.data_dir}"


# ---------------------------------------------------------------------------- up


class _Stop(Exception):
    """SIGINT or SIGTERM reached the supervisor."""


def _on_signal(signum: int, frame: object) -> None:
    raise _Stop(signal.Signals(signum).name)


def _start(node: Node, overrides: Sequence[str]) -> None:
    command = [
        sys.executable,
        "-m",
        "tidelog",
        "serve",
        "--config",
        str(node.config),
        *(f"--override={item}" for item in [*overrides, _log_dirs(node)]),
    ]
    node.log = node.log_path.open("ab")
    node.log.write(f"=== {' '.join(command)}\n".encode())
    node.log.flush()
    node.process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=node.log,
        stderr=subprocess.STDOUT,
        # Its own session: a Ctrl-C in the terminal reaches the supervisor, which stops the
        # nodes in order, not every node at once mid-start.
        start_new_session=True,
    )


def _stop(node: Node, *, quiet: bool = False) -> None:
    process = node.process
    if process is None:
        return
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            if not quiet:
                print(f"Killed node {node.node_id}: no exit {STOP_TIMEOUT_S:g}s after SIGTERM.")
        else:
            if not quiet:
                print(f"Stopped node {node.node_id} (exit status {process.returncode}).")
    elif not quiet:
        print(f"Node {node.node_id} had already exited (status {process.returncode}).")
    if node.log is not None:
        node.log.close()
        node.log = None
    node.process = None


def _exited(nodes: Sequence[Node]) -> Node | None:
    return next((n for n in nodes if n.process is not None and n.process.poll() is not None), None)


def _cluster_ready(nodes: Sequence[Node]) -> bool:
    """Whether every node's broker listener lists every broker, unfenced, and the quorum
    has a leader."""
    try:
        for node in nodes:
            with Admin({"bootstrap.servers": node.bootstrap, "request.timeout.ms": 2000}) as admin:
                brokers = admin.describe_cluster().brokers
            if {b.node_id for b in brokers} != {n.node_id for n in nodes}:
                return False
        describe_quorum(",".join(n.controller for n in nodes), through_broker=False)
    except (ClientError, OSError, TimeoutError):
        return False
    return True


def _run_up(args: argparse.Namespace) -> int:
    try:
        nodes = plan_nodes(args)
        cluster_id = format_nodes(nodes, args.override)
    except UsageError as exc:
        return fail("cluster up", exc, 2)
    except Exception as exc:  # a config or formatting failure: one line, nothing started
        return fail("cluster up", exc)
    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _supervise(nodes, cluster_id, args.override)
    except _Stop as stop:
        print(f"\n{stop}: stopping {len(nodes)} node{'s' if len(nodes) != 1 else ''}.")
        return 0
    finally:
        # A second Ctrl-C must not cut the stopping short.
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        for node in nodes:
            _stop(node)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _supervise(nodes: Sequence[Node], cluster_id: str, overrides: Sequence[str]) -> int:
    plural = "s" if len(nodes) != 1 else ""
    print(
        f"Starting {len(nodes)} node{plural} of cluster {cluster_id} (logs in each node's dir)..."
    )
    for node in nodes:
        _start(node, overrides)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not _cluster_ready(nodes):
        dead = _exited(nodes)
        if dead is not None:
            return _failed(nodes, dead, f"exited with status {_status(dead)}")
        if time.monotonic() > deadline:
            late = next((n for n in nodes if not _answers(n)), nodes[0])
            return _failed(nodes, late, f"not ready after {READY_TIMEOUT_S:g}s")
        time.sleep(_POLL_S)
    _print_ready(nodes, cluster_id)
    while True:
        dead = _exited(nodes)
        if dead is not None:
            print(
                f"Node {dead.node_id} exited with status {_status(dead)}: {dead.log_tail()}",
                file=sys.stderr,
            )
            dead.process = None
        time.sleep(_POLL_S)


def _status(node: Node) -> int | None:
    return None if node.process is None else node.process.returncode


def _answers(node: Node) -> bool:
    try:
        with Admin({"bootstrap.servers": node.bootstrap, "request.timeout.ms": 2000}) as admin:
            admin.describe_cluster()
    except (ClientError, OSError, TimeoutError):
        return False
    return True


def _failed(nodes: Sequence[Node], node: Node, why: str) -> int:
    print(
        f"tidelog cluster up: node {node.node_id} {why}; log {node.log_path}: {node.log_tail()}",
        file=sys.stderr,
    )
    for other in nodes:
        _stop(other, quiet=other is node)
    return 1


def _print_ready(nodes: Sequence[Node], cluster_id: str) -> None:
    bootstrap = ",".join(n.bootstrap for n in nodes)
    controllers = ",".join(n.controller for n in nodes)
    try:
        leader = describe_quorum(controllers, through_broker=False).leader_id
    except ClientError:
        leader = -1
    print_table(
        ("NODE", "BROKER", "CONTROLLER", "PID", "QUORUM", "DATA"),
        (
            (
                n.node_id,
                n.bootstrap,
                n.controller,
                n.process.pid if n.process else "-",
                "leader" if n.node_id == leader else "follower",
                n.data_dir,
            )
            for n in nodes
        ),
    )
    print(
        f"\nCluster {cluster_id} is ready.\n"
        f"  bootstrap.servers={bootstrap}\n"
        f"  tidelog topics create --bootstrap-server {nodes[0].bootstrap} --topic demo "
        f"--partitions 3\n"
        f"  kcat -b {bootstrap} -L\n"
        f"  tidelog cluster describe --bootstrap-server {nodes[0].bootstrap} "
        f"--controllers {controllers}\n"
        f"  tidelog metadata-quorum --bootstrap-controller {controllers} describe --status\n"
        "Ctrl-C stops every node.",
        flush=True,
    )


# ---------------------------------------------------------------------------- describe


def replica_counts(topics: Iterable[TopicInfo]) -> tuple[Counter[int], Counter[int]]:
    """How many partitions (internal topics included) each broker leads, and how many
    replicas it holds."""
    leaders: Counter[int] = Counter()
    replicas: Counter[int] = Counter()
    for topic in topics:
        for p in topic.partitions:
            if p.leader >= 0:
                leaders[p.leader] += 1
            replicas.update(p.replicas)
    return leaders, replicas


def _run_describe(args: argparse.Namespace) -> int:
    if args.bootstrap_controller and args.controllers:
        raise UsageError("--controllers goes with --bootstrap-server")
    bootstrap = args.bootstrap_server or args.bootstrap_controller
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        cluster = admin.describe_cluster(include_fenced_brokers=True)
        leaders, replicas = replica_counts(admin.describe_topics().values())
    print(f"ClusterId:    {cluster.cluster_id or ''}")
    print(f"ControllerId: {cluster.controller_id}")
    print()
    print_table(
        ("ID", "HOST:PORT", "RACK", "STATE", "LEADERS", "REPLICAS"),
        (
            (
                b.node_id,
                f"{b.host}:{b.port}",
                b.rack or "-",
                "fenced" if b.fenced else "active",
                leaders.get(b.node_id, 0),
                replicas.get(b.node_id, 0),
            )
            for b in cluster.brokers
        ),
    )
    print()
    quorum_from = args.controllers or args.bootstrap_controller or args.bootstrap_server
    through_broker = quorum_from == args.bootstrap_server
    try:
        quorum = describe_quorum(quorum_from, through_broker=through_broker)
    except ClientError as exc:
        if not through_broker or exc.code is not ErrorCode.UNSUPPORTED_VERSION:
            raise
        # A single node (controller.quorum.voters unset) has no quorum to describe: its
        # brokers do not serve DescribeQuorum. That is its shape, not a failure.
        print("Quorum: none (the brokers do not serve DescribeQuorum: a single node without")
        print("        controller.quorum.voters keeps its metadata log unreplicated)")
        return 0
    print(
        f"Quorum: leader {quorum.leader_id}, epoch {quorum.leader_epoch}, "
        f"high watermark {quorum.high_watermark}"
    )
    print_replication(quorum)
    return 0
