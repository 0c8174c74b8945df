"""``meta.properties``: which cluster and node a log dir belongs to.

Every log dir (and the metadata log dir) holds one, in Kafka's KRaft format::

    #
    #Written by tidelog
    cluster.id=<22 characters of base64url>
    directory.id=<22 characters of base64url>
    node.id=1
    version=1

On start, :func:`ensure_meta_properties` reads the file of every dir. All dirs that have
one must agree on ``cluster.id`` and ``node.id``, and these must match the configured
``node.id`` and (when set) ``cluster.id``; otherwise the broker refuses to start, since it
would be mixing data of different clusters or nodes. Dirs without the file get one, with
the cluster id found elsewhere, the configured one, or a new random one (first start).
"""

from __future__ import annotations

import base64
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tidelog.metadata.configs import parse_properties
from tidelog.metadata.errors import MetaPropertiesError
from tidelog.storage.checkpoint import FsyncFn, write_durably

__all__ = [
    "META_PROPERTIES",
    "MetaProperties",
    "ensure_meta_properties",
    "generate_cluster_id",
    "read_meta_properties",
    "write_meta_properties",
]

META_PROPERTIES = "meta.properties"
_MAX_BYTES = 64 * 1024


def _base64_uuid() -> str:
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        # Kafka avoids ids that read as command-line options.
        if not text.startswith("-"):
            return text


def generate_cluster_id() -> str:
    """A new cluster id: a random UUID in base64url, 22 characters (Kafka's form)."""
    return _base64_uuid()


@dataclass(frozen=True)
class MetaProperties:
    cluster_id: str
    node_id: int
    directory_id: str | None = None
    version: int = 1


def read_meta_properties(log_dir: str | Path) -> MetaProperties | None:
    """The dir's meta.properties; None when it has none."""
    path = Path(log_dir) / META_PROPERTIES
    try:
        with open(path, "rb") as file:
            data = file.read(_MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise MetaPropertiesError(f"{path} cannot be read: {exc.strerror}") from None
    if len(data) > _MAX_BYTES:
        raise MetaPropertiesError(f"{path} is larger than {_MAX_BYTES} bytes")
    try:
        values = parse_properties(data.decode("utf-8"), str(path))
    except (UnicodeDecodeError, ValueError) as exc:
        raise MetaPropertiesError(f"{path} is not a properties file: {exc}") from None
    cluster_id = values.get("cluster.id")
    node_text = values.get("node.id")
    if not cluster_id or node_text is None or not node_text.isdigit():
        raise MetaPropertiesError(f"{path} lacks a valid cluster.id and node.id")
    version = values.get("version", "1")
    if version != "1":
        raise MetaPropertiesError(f"{path} has version {version}; only version 1 is read")
    return MetaProperties(cluster_id, int(node_text), values.get("directory.id"))


def write_meta_properties(
    log_dir: str | Path, props: MetaProperties, fsync: FsyncFn = os.fsync
) -> None:
    """Replace the dir's meta.properties atomically and durably."""
    lines = ["#", "#Written by tidelog", f"cluster.id={props.cluster_id}"]
    if props.directory_id is not None:
        lines.append(f"directory.id={props.directory_id}")
    lines += [f"node.id={props.node_id}", f"version={props.version}", ""]
    directory = Path(log_dir)
    directory.mkdir(parents=True, exist_ok=True)
    write_durably(directory / META_PROPERTIES, "\n".join(lines).encode("utf-8"), fsync)


def ensure_meta_properties(
    dirs: Sequence[str | Path],
    *,
    node_id: int,
    cluster_id: str | None,
    fsync: FsyncFn = os.fsync,
) -> str:
    """Check (and where missing, write) meta.properties in ``dirs``; the cluster id."""
    found: dict[Path, MetaProperties] = {}
    for directory in dict.fromkeys(Path(d) for d in dirs):
        props = read_meta_properties(directory)
        if props is not None:
            found[directory] = props
    known = cluster_id
    known_from = "the configuration (cluster.id)"
    for directory, props in found.items():
        if props.node_id != node_id:
            raise MetaPropertiesError(
                f"{directory / META_PROPERTIES} belongs to node {props.node_id}, "
                f"but node.id is {node_id}"
            )
        if known is None:
            known, known_from = props.cluster_id, str(directory / META_PROPERTIES)
        elif props.cluster_id != known:
            raise MetaPropertiesError(
                f"{directory / META_PROPERTIES} has cluster.id {props.cluster_id}, "
                f"but {known_from} says {known}"
            )
    if known is None:
        known = generate_cluster_id()
    for directory in dict.fromkeys(Path(d) for d in dirs):
        if directory not in found:
            write_meta_properties(directory, MetaProperties(known, node_id, _base64_uuid()), fsync)
    return known
