"""`tidelog console`: the web console for a Kafka-compatible cluster, served by uvicorn.

The console's packages (Starlette, Jinja2, uvicorn, python-multipart) are the ``console``
extra: they are imported only when this command runs, so the rest of `tidelog` works
without them.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import sys
from pathlib import Path
from typing import Any

from tidelog.cli.output import UsageError, add_bootstrap, fail

COMMAND = "console"


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "console",
        help="serve the web console for a cluster",
        description=(
            "Serve the web console (overview, topics, messages and search, consumer groups "
            "and offset resets, produce) for any Kafka-compatible cluster."
        ),
    )
    add_bootstrap(parser)
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)"
    )
    parser.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080)")
    parser.add_argument("--auth-user", metavar="USER", help="require HTTP basic auth as USER")
    parser.add_argument(
        "--auth-password-file",
        metavar="FILE",
        help="file whose first line is the password of --auth-user",
    )
    parser.add_argument(
        "--read-only", action="store_true", help="show only: no create, delete, produce or reset"
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    parser.set_defaults(run=run)


def _password(args: argparse.Namespace) -> str | None:
    if args.auth_user is None:
        if args.auth_password_file is not None:
            raise UsageError("--auth-password-file needs --auth-user")
        return None
    if args.auth_password_file is None:
        raise UsageError("--auth-user needs --auth-password-file")
    try:
        lines = Path(args.auth_password_file).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UsageError(
            f"--auth-password-file: {exc.strerror}: {args.auth_password_file}"
        ) from None
    if not lines or not lines[0]:
        raise UsageError(f"--auth-password-file {args.auth_password_file}: the first line is empty")
    return lines[0]


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run(args: argparse.Namespace) -> int:
    try:
        password = _password(args)
        if not 0 < args.port < 65536:
            raise UsageError(f"--port {args.port}: expected 1..65535")
    except UsageError as exc:
        return fail(COMMAND, exc, 2)
    try:
        import uvicorn

        from tidelog.console.app import ConsoleConfig, create_app
    except ImportError as exc:
        return fail(
            COMMAND,
            f"the console needs the 'console' extra (pip install 'tidelog[console]'): {exc}",
        )
    logging.basicConfig(
        level=args.log_level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s"
    )
    if args.auth_user is None and not _is_loopback(args.host):
        logging.warning(
            "console: listening on %s without --auth-user: anyone who reaches it can change "
            "the cluster",
            args.host,
        )
    app = create_app(
        ConsoleConfig(
            bootstrap_servers=args.bootstrap_server,
            auth_user=args.auth_user,
            auth_password=password,
            read_only=args.read_only,
        )
    )
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level.lower(),
        access_log=False,
        # The stdlib loop: the client's connections expect asyncio's own transports, and
        # uvicorn would pick uvloop (installed for the broker) otherwise.
        loop="asyncio",
    )
    return 0
