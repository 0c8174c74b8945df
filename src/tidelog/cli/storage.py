"""`tidelog storage`: prepare a node's directories, in the style of ``kafka-storage``.

``tidelog storage random-uuid`` prints a new cluster id; ``tidelog storage format
--cluster-id ID --config FILE`` writes ``meta.properties`` with it into every log dir and
the metadata log dir before the node's first start, so that the nodes of a cluster share
one id. ``tidelog serve`` on unformatted dirs formats them itself (a single node needs no
format step).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tidelog.metadata.configs import BrokerConfig
from tidelog.metadata.errors import ConfigError, MetadataError
from tidelog.metadata.meta_properties import generate_cluster_id
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
    format_parser.set_defaults(run=run_format)


def run_random_uuid(args: argparse.Namespace) -> int:
    print(generate_cluster_id(Runtime.system().random))
    return 0


def run_format(args: argparse.Namespace) -> int:
    try:
        config = BrokerConfig.load(args.config, args.override)
    except (ConfigError, OSError) as exc:
        print(f"tidelog storage format: {exc}", file=sys.stderr)
        return 2
    try:
        result = format_storage(
            config, args.cluster_id, Runtime.system(), ignore_formatted=args.ignore_formatted
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
    return 0
