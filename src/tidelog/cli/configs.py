"""`tidelog configs describe|alter`: Kafka's kafka-configs for topics, brokers and users.

For ``--entity-type users`` the configs are SCRAM credentials, written as kafka-configs
writes them: ``--add-config 'SCRAM-SHA-256=[iterations=8192,password=alice-secret]'``
(iterations default to 4096) and ``--delete-config SCRAM-SHA-512``; the password is salted
here and never sent (AlterUserScramCredentials).

Client quotas (``--entity-type users|clients|ips``) are set as kafka-configs sets them:
``--entity-type users --entity-name alice --entity-type clients --entity-default
--add-config producer_byte_rate=1024,consumer_byte_rate=2048`` (each ``--entity-name`` or
``--entity-default`` names the entity type given before it); ``--delete-config KEY``
removes a key (AlterClientQuotas, DescribeClientQuotas).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import Any

from tidelog.cli.output import UsageError, add_bootstrap, guarded, parse_pairs, print_table
from tidelog.client import Admin, AlterConfigOp, ConfigResource

_TYPES = {"topics": "topic", "brokers": "broker", "users": "user", "clients": "client", "ips": "ip"}
#: Quota entity types by the command line's entity type, and how Kafka's tool names them.
_QUOTA_TYPES = {"users": "user", "clients": "client-id", "ips": "ip"}
_QUOTA_LABELS = {"user": "user-principal", "client-id": "client-id", "ip": "ip"}
_EXACT, _DEFAULT, _ANY = 0, 1, 2
_SCRAM_CONFIG = re.compile(r"\s*(SCRAM-SHA-(?:256|512))=\[([^\]]*)\]\s*(?:,|$)")
_DEFAULT_ITERATIONS = 4096


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "configs",
        help="describe and alter topic, broker, user, client and ip configs",
        description="Describe and alter topic, broker, user, client and ip configs: "
        "`configs alter ...` or, as kafka-configs takes it, `configs --alter ...`.",
    )
    # kafka-configs' own form: the action as --alter or --describe, options alongside.
    flags = parser.add_mutually_exclusive_group()
    flags.add_argument("--alter", action="store_true", help="change configs")
    flags.add_argument("--describe", action="store_true", help="show configs")
    _add_options(parser, "both", entity_required=False)
    parser.set_defaults(run=guarded("configs", _by_flag))
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    for action, helptext in (("describe", "show configs"), ("alter", "change configs")):
        _add_options(actions.add_parser(action, help=helptext), action, entity_required=True)


def _add_options(parser: argparse.ArgumentParser, action: str, *, entity_required: bool) -> None:
    add_bootstrap(parser)
    parser.add_argument(
        "--entity-type", dest="entity_types", action="append", required=entity_required,
        choices=sorted(_TYPES), help="repeat for a user and client-id quota entity",
    )  # fmt: skip
    parser.add_argument(
        "--entity-name", dest="entity_names", action="append",
        help="topic name, broker id, user, client id or ip (for the type before it)",
    )  # fmt: skip
    parser.add_argument(
        "--entity-default", dest="entity_names", action="append_const", const=None,
        help="the default user, client id or ip (quotas)",
    )  # fmt: skip
    if action in ("describe", "both"):
        parser.add_argument("--all", action="store_true", help="include defaults")
        parser.set_defaults(run=guarded("configs describe", _describe))
    if action in ("alter", "both"):
        parser.add_argument("--add-config", action="append", default=[], metavar="K=V,...")
        parser.add_argument("--delete-config", action="append", default=[], metavar="K,...")
        parser.set_defaults(run=guarded("configs alter", _alter))


def _by_flag(args: argparse.Namespace) -> int:
    """``configs --alter|--describe ...`` (no ACTION word)."""
    if not (args.alter or args.describe):
        raise UsageError("give --alter or --describe (or the action: configs alter|describe)")
    if not args.entity_types:
        raise UsageError("--entity-type is required")
    return _alter(args) if args.alter else _describe(args)


def _single_entity(args: argparse.Namespace) -> None:
    """Topics, brokers and SCRAM users take one --entity-type and one --entity-name."""
    names = args.entity_names or []
    if len(args.entity_types) != 1 or len(names) != 1 or names[0] is None:
        raise UsageError(f"--entity-type {args.entity_types[0]} takes exactly one --entity-name")
    args.entity_type, args.entity_name = args.entity_types[0], names[0]


def _resource(args: argparse.Namespace) -> ConfigResource:
    return ConfigResource(_TYPES[args.entity_type], args.entity_name)


def _is_quota(args: argparse.Namespace, keys: list[str]) -> bool:
    """Whether the command is about client quotas: clients or ips, several entity types,
    a default entity, or users with keys that are not SCRAM mechanisms."""
    types = args.entity_types
    if any(t not in _QUOTA_TYPES for t in types):
        return False
    if types != ["users"] or None in (args.entity_names or []):
        return True
    return bool(keys) and not any(k.strip().upper().startswith("SCRAM-") for k in keys)


def _quota_entity(args: argparse.Namespace, *, describe: bool) -> list[tuple[str, str | None]]:
    names = args.entity_names or []
    if len(names) > len(args.entity_types) or (
        not describe and len(names) < len(args.entity_types)
    ):
        raise UsageError("give one --entity-name or --entity-default after each --entity-type")
    kinds = [_QUOTA_TYPES[t] for t in args.entity_types]
    if len(set(kinds)) != len(kinds):
        raise UsageError("each --entity-type may be given once")
    return [(kind, names[i] if i < len(names) else "") for i, kind in enumerate(kinds)]


def _entity_label(entity: list[tuple[str, str | None]] | dict[str, str | None]) -> str:
    pairs = list(entity.items()) if isinstance(entity, dict) else entity
    pairs = sorted(pairs, key=lambda pair: list(_QUOTA_LABELS).index(pair[0]))  # user first
    return ", ".join(
        f"the default {_QUOTA_LABELS.get(kind, kind)}"
        if name is None
        else f"{_QUOTA_LABELS.get(kind, kind)} '{name}'"
        for kind, name in pairs
    )


def _alter_quotas(args: argparse.Namespace) -> int:
    entity = _quota_entity(args, describe=False)
    ops: dict[str, float | None] = {}
    for key, text in parse_pairs(args.add_config, "--add-config").items():
        try:
            ops[key] = float(text)
        except ValueError:
            raise UsageError(f"--add-config {key}={text}: the value must be a number") from None
    for item in args.delete_config:
        ops.update((k.strip(), None) for k in item.split(",") if k.strip())
    if not ops:
        raise UsageError("nothing to alter: give --add-config and/or --delete-config")
    with Admin({"bootstrap.servers": args.bootstrap_server}) as admin:
        admin.alter_client_quotas([(dict(entity), ops)])
    print(f"Completed updating config for {_entity_label(entity)}.")
    return 0


def _describe_quotas(args: argparse.Namespace) -> int:
    """Print each matching entity's quotas; how many there were."""
    components = [
        (kind, _ANY if name == "" else _DEFAULT if name is None else _EXACT, name or None)
        for kind, name in _quota_entity(args, describe=True)
    ]
    with Admin({"bootstrap.servers": args.bootstrap_server}) as admin:
        found = admin.describe_client_quotas(components, strict=True)
    for entity, values in found:
        shown = ", ".join(f"{key}={value}" for key, value in sorted(values.items()))
        print(f"Quota configs for {_entity_label(entity)} are {shown}")
    return len(found)


def _describe(args: argparse.Namespace) -> int:
    if _is_quota(args, []):
        _describe_quotas(args)
        return 0
    _single_entity(args)
    if args.entity_type == "users":
        # A user has quotas and SCRAM credentials, as kafka-configs shows them both.
        return _describe_user(args, with_quotas=_describe_quotas(args) > 0)
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


def _describe_user(args: argparse.Namespace, *, with_quotas: bool) -> int:
    """The user's SCRAM credentials; a user with quotas and no credentials is not an error
    (asking for every user's avoids the broker's RESOURCE_NOT_FOUND for that case)."""
    with Admin({"bootstrap.servers": args.bootstrap_server}) as admin:
        found = admin.describe_user_scram_credentials(None if with_quotas else [args.entity_name])
    if args.entity_name not in found:
        return 0
    credentials = ",".join(
        f"{mechanism}=iterations={iterations}" for mechanism, iterations in found[args.entity_name]
    )
    print(f"SCRAM credential configs for user-principal '{args.entity_name}' are {credentials}")
    return 0


def _alter(args: argparse.Namespace) -> int:
    keys = [k.partition("=")[0] for item in args.add_config for k in item.split(",")]
    keys += [k for item in args.delete_config for k in item.split(",")]
    if _is_quota(args, keys):
        return _alter_quotas(args)
    _single_entity(args)
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
