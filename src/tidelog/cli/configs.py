"""`tidelog configs describe|alter`: Kafka's kafka-configs for topics, brokers and users.

For ``--entity-type users`` the configs are SCRAM credentials, written as kafka-configs
writes them: ``--add-config 'SCRAM-SHA-256=[iterations=8192,password=alice-secret]'``
(iterations default to 4096) and ``--delete-config SCRAM-SHA-512``; the password is salted
here and never sent (AlterUserScramCredentials).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import Any

from tidelog.cli.output import UsageError, add_bootstrap, guarded, parse_pairs, print_table
from tidelog.client import Admin, AlterConfigOp, ConfigResource

_TYPES = {"topics": "topic", "brokers": "broker", "users": "user"}
_SCRAM_CONFIG = re.compile(r"\s*(SCRAM-SHA-(?:256|512))=\[([^\]]*)\]\s*(?:,|$)")
_DEFAULT_ITERATIONS = 4096


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "configs",
        help="describe and alter topic and broker configs",
        description="Describe and alter topic and broker configs.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for action, helptext in (("describe", "show configs"), ("alter", "change configs")):
        sub = actions.add_parser(action, help=helptext)
        add_bootstrap(sub)
        sub.add_argument("--entity-type", required=True, choices=sorted(_TYPES))
        sub.add_argument("--entity-name", required=True, help="topic name, broker id or user")
        if action == "describe":
            sub.add_argument("--all", action="store_true", help="include defaults")
            sub.set_defaults(run=guarded("configs describe", _describe))
        else:
            sub.add_argument("--add-config", action="append", default=[], metavar="K=V,...")
            sub.add_argument("--delete-config", action="append", default=[], metavar="K,...")
            sub.set_defaults(run=guarded("configs alter", _alter))


def _resource(args: argparse.Namespace) -> ConfigResource:
    return ConfigResource(_TYPES[args.entity_type], args.entity_name)


def _describe(args: argparse.Namespace) -> int:
    if args.entity_type == "users":
        return _describe_user(args)
    resource = _resource(args)
    with Admin({"bootstrap.servers": args.bootstrap_server}) as admin:
        entries = admin.describe_configs([resource])[resource]
    shown = [e for e in entries.values() if args.all or not e.is_default]
    print(f"Configs for {args.entity_type[:-1]} {args.entity_name}:")
    print_table(
        ("NAME", "VALUE", "SOURCE", "READ-ONLY"),
        (
            (
                e.name,
                "(sensitive)" if e.is_sensitive else e.value,
                e.source,
                str(e.read_only).lower(),
            )
            for e in shown
        ),
    )
    return 0


@dataclass(frozen=True)
class ScramConfig:
    """One ``SCRAM-SHA-256=[...]`` item: the mechanism and its fields."""

    mechanism: str
    iterations: int
    password: str
    name: str | None = None


def parse_scram_configs(
    items: list[str], flag: str = "--add-config", with_name: bool = False
) -> list[ScramConfig]:
    """``SCRAM-SHA-256=[iterations=8192,password=secret]`` items (with ``name=`` too for
    ``storage format --add-scram``), as kafka-configs and kafka-storage take them."""
    allowed = ("name", "iterations", "password") if with_name else ("iterations", "password")
    shape = ",".join(f"{key}=..." for key in allowed)
    out: list[ScramConfig] = []
    for item in items:
        position = 0
        while position < len(item.rstrip()):
            match = _SCRAM_CONFIG.match(item, position)
            if match is None:
                raise UsageError(
                    f"{flag} {item!r}: expected SCRAM-SHA-256=[{shape}] or SCRAM-SHA-512=[...]"
                )
            position = match.end()
            mechanism = match.group(1)
            fields: dict[str, str] = {}
            for part in match.group(2).split(","):
                key, sep, value = part.partition("=")
                if not sep or key.strip() not in allowed:
                    raise UsageError(f"{flag} {mechanism}: {part!r} is not one of {shape}")
                fields[key.strip()] = value
            for required in ("name", "password") if with_name else ("password",):
                if not fields.get(required):
                    raise UsageError(f"{flag} {mechanism}: {required}=... is required")
            iterations_text = fields.get("iterations", str(_DEFAULT_ITERATIONS))
            if not iterations_text.strip().isdigit():
                raise UsageError(f"{flag} {mechanism}: iterations must be a number")
            out.append(
                ScramConfig(mechanism, int(iterations_text), fields["password"], fields.get("name"))
            )
    return out


def _alter_user(args: argparse.Namespace) -> int:
    user = args.entity_name
    upsertions = [
        (user, c.mechanism, c.iterations, c.password) for c in parse_scram_configs(args.add_config)
    ]
    deletions = [
        (user, name.strip().upper())
        for item in args.delete_config
        for name in item.split(",")
        if name.strip()
    ]
    unknown = [m for _, m in deletions if m not in ("SCRAM-SHA-256", "SCRAM-SHA-512")]
    if unknown:
        raise UsageError(f"--delete-config {unknown[0]}: expected SCRAM-SHA-256 or SCRAM-SHA-512")
    if not upsertions and not deletions:
        raise UsageError("nothing to alter: give --add-config and/or --delete-config")
    with Admin({"bootstrap.servers": args.bootstrap_server}) as admin:
        admin.alter_user_scram_credentials(upsertions, deletions)
    print(f"Completed updating config for user {user}.")
    return 0


def _describe_user(args: argparse.Namespace) -> int:
    with Admin({"bootstrap.servers": args.bootstrap_server}) as admin:
        found = admin.describe_user_scram_credentials([args.entity_name])
    credentials = ",".join(
        f"{mechanism}=iterations={iterations}" for mechanism, iterations in found[args.entity_name]
    )
    print(f"SCRAM credential configs for user-principal '{args.entity_name}' are {credentials}")
    return 0


def _alter(args: argparse.Namespace) -> int:
    if args.entity_type == "users":
        return _alter_user(args)
    ops = [
        AlterConfigOp(k, v, "set") for k, v in parse_pairs(args.add_config, "--add-config").items()
    ]
    for item in args.delete_config:
        ops += [AlterConfigOp(k.strip(), None, "delete") for k in item.split(",") if k.strip()]
    if not ops:
        raise UsageError("nothing to alter: give --add-config and/or --delete-config")
    with Admin({"bootstrap.servers": args.bootstrap_server}) as admin:
        admin.alter_configs({_resource(args): ops})
    print(f"Completed updating config for {args.entity_type[:-1]} {args.entity_name}.")
    return 0
