"""`tidelog storage`: prepare a node's directories, in the style of ``kafka-storage``.

``tidelog storage random-uuid`` prints a new cluster id; ``tidelog storage format
--cluster-id ID --config FILE`` writes ``meta.properties`` with it into every log dir and
the metadata log dir before the node's first start, so that the nodes of a cluster share
one id. ``--add-scram 'SCRAM-SHA-256=[name=admin,password=admin-secret]'`` adds a SCRAM
user that exists from the first start (Kafka's way into a cluster with SASL listeners only);
the password is salted here and only the salted keys are written. ``tidelog serve`` on unformatted dirs formats them itself (a single node needs no
format step).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tidelog.cli.configs import parse_scram_configs
from tidelog.cli.output import UsageError
from tidelog.metadata.configs import BrokerConfig
from tidelog.metadata.errors import ConfigError, MetadataError
from tidelog.metadata.meta_properties import generate_cluster_id
from tidelog.metadata.records import UserScramCredentialRecord
from tidelog.metadata.scram import (
    MAX_ITERATIONS,
    MIN_ITERATIONS,
    credential_from_password,
    mechanism_by_name,
)
from tidelog.metadata.storage_format import format_storage
from tidelog.runtime.filelock import LockHeldError
from tidelog.runtime.system import Runtime

_ANOTHER_DIR = "format another directory (log.dirs, metadata.log.dir)"


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "storage",
        help="format a node's directories with a cluster id (like kafka-storage)",
        description="Prepare the log directories of a node before its first start.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    uuid_parser = actions.add_parser(
        "random-uuid",
        help="print a new cluster id",
        description="Print a new random cluster id (22 characters of URL-safe base64).",
    )
    uuid_parser.set_defaults(run=run_random_uuid)

    format_parser = actions.add_parser(
        "format",
        help="write meta.properties with a cluster id into every log dir",
        description=(
            "Write meta.properties (cluster id, node id, a directory id) into every log "
            "directory and the metadata log directory of the configuration. A static "
            "quorum only (controller.quorum.voters): nothing else is written."
        ),
    )
    format_parser.add_argument(
        "-c", "--config", metavar="FILE", required=True, help="the node's properties file"
    )
    format_parser.add_argument(
        "-t", "--cluster-id", metavar="ID", required=True, help="from `storage random-uuid`"
    )
    format_parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a config over the file's, as `tidelog serve` takes it (repeatable)",
    )
    format_parser.add_argument(
        "-g",
        "--ignore-formatted",
        action="store_true",
        help="leave directories already formatted (with this id) as they are",
    )
    format_parser.add_argument(
        "-S",
        "--add-scram",
        action="append",
        default=[],
        metavar="'SCRAM-SHA-256=[name=USER,password=SECRET]'",
        help="a SCRAM credential to create at the first start (iterations=N optional; repeatable)",
    )
    format_parser.set_defaults(run=run_format)


def scram_records(items: list[str]) -> list[UserScramCredentialRecord]:
    """The credential records of ``--add-scram`` items (salted here; never the password)."""
    records = []
    for config in parse_scram_configs(items, "--add-scram", with_name=True):
        mechanism = mechanism_by_name(config.mechanism)
        assert mechanism is not None  # the parser accepts the two SCRAM mechanisms only
        if not MIN_ITERATIONS <= config.iterations <= MAX_ITERATIONS:
            raise UsageError(
                f"--add-scram {config.mechanism}: iterations must be between "
                f"{MIN_ITERATIONS} and {MAX_ITERATIONS}"
            )
        credential = credential_from_password(mechanism, config.password, config.iterations)
        assert config.name is not None
        records.append(
            UserScramCredentialRecord(
                config.name,
                mechanism.type,
                credential.salt,
                credential.stored_key,
                credential.server_key,
                credential.iterations,
            )
        )
    return records


def run_random_uuid(args: argparse.Namespace) -> int:
    print(generate_cluster_id(Runtime.system().random))
    return 0


def run_format(args: argparse.Namespace) -> int:
    try:
        config = BrokerConfig.load(args.config, args.override)
        bootstrap = scram_records(args.add_scram)
    except (ConfigError, OSError, UsageError) as exc:
        print(f"tidelog storage format: {exc}", file=sys.stderr)
        return 2
    try:
        result = format_storage(
            config,
            args.cluster_id,
            Runtime.system(),
            ignore_formatted=args.ignore_formatted,
            bootstrap=bootstrap,
        )
    except (OSError, LockHeldError, MetadataError) as exc:
        from tidelog.broker.app import failure_line

        reason = failure_line(config, exc, another_dir=_ANOTHER_DIR)
        print(f"tidelog storage format: cannot format: {reason}", file=sys.stderr)
        return 1
    for directory in result.already_formatted:
        print(f"Directory {directory} is already formatted; left as it is.")
    for directory in result.formatted:
        print(
            f"Formatted directory {directory} with cluster id {args.cluster_id} "
            f"for node {config.node_id}."
        )
    if not result.formatted:
        print("All of the log directories are already formatted.")
    for record in bootstrap:
        mechanism = "SCRAM-SHA-256" if record.mechanism == 1 else "SCRAM-SHA-512"
        print(f"Added {mechanism} credential for user {record.name} (created at first start).")
    return 0
