"""``meta.properties``: which cluster and node a log dir belongs to.

Every log dir (and the metadata log dir) holds one, in Kafka's KRaft format::

    #
    #Written by tidelog
    cluster.id=<22 characters of base64url>
    directory.id=<22 characters of base64url>
    node.id=1
    version=1

``tidelog storage format`` writes it before the first start (:func:`format_dirs`, under
the dirs' locks: :mod:`tidelog.metadata.storage_format`), as ``kafka-storage format`` does.
On start, :func:`ensure_meta_properties` reads the file of every dir. All dirs that have
one must agree on ``cluster.id`` and ``node.id``, and these must match the configured
``node.id`` and (when set) ``cluster.id``; otherwise the broker refuses to start, since it
would be mixing data of different clusters or nodes. Dirs without the file get one, with
the cluster id found elsewhere, the configured one, or a new random one (first start).
"""

from __future__ import annotations

import base64
import binascii
import os
import random
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tidelog.metadata.configs import parse_properties
from tidelog.metadata.errors import MetaPropertiesError
from tidelog.runtime.system import random_uuid
from tidelog.storage.checkpoint import FsyncFn, write_durably

__all__ = [
    "META_PROPERTIES",
    "FormatResult",
    "MetaProperties",
    "check_cluster_id",
    "ensure_meta_properties",
    "format_dirs",
    "generate_cluster_id",
    "read_meta_properties",
    "write_meta_properties",
]

META_PROPERTIES = "meta.properties"
_MAX_BYTES = 64 * 1024
#: Where an id is drawn when the caller injects no random source (tests of this module);
#: a node passes its :class:`~tidelog.runtime.system.Runtime`'s.
_SYSTEM_RANDOM = random.SystemRandom()


def _base64_uuid(source: random.Random) -> str:
    while True:
        text = base64.urlsafe_b64encode(random_uuid(source).bytes).decode("ascii").rstrip("=")
        # Kafka avoids ids that read as command-line options (`--cluster-id -x...`).
        if not text.startswith("-"):
            return text


def generate_cluster_id(source: random.Random = _SYSTEM_RANDOM) -> str:
    """A new cluster id: a random UUID in base64url, 22 characters (Kafka's form)."""
    return _base64_uuid(source)


def check_cluster_id(cluster_id: str) -> None:
    """Refuse what is not a cluster id in Kafka's form: 16 bytes in URL-safe base64
    without padding (22 characters), as :func:`generate_cluster_id` makes them.

    Kafka's format parses the id as a UUID for the same reason: the id travels in
    Metadata and DescribeCluster responses and every node of a cluster must agree on it
    byte for byte. The canonical spelling only (decoding and encoding again gives it
    back), so one id has one spelling.
    """
    problem = ""
    try:
        raw = base64.urlsafe_b64decode(cluster_id + "==")
    except (binascii.Error, ValueError):
        raw = b""
    if len(cluster_id) != 22 or len(raw) != 16:
        problem = "it must be 22 characters of URL-safe base64 (16 bytes)"
    elif base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=") != cluster_id:
        problem = "it is not the canonical base64 spelling of 16 bytes"
    if problem:
        raise MetaPropertiesError(
            f"cluster id {cluster_id!r} is not valid: {problem}; "
            "make one with `tidelog storage random-uuid`"
        )


@dataclass(frozen=True)
class MetaProperties:
    cluster_id: str
    node_id: int
    directory_id: str | None = None
    version: int = 1


def directory_uuids(dirs: Sequence[str | Path]) -> dict[Path, uuid.UUID]:
    """Each dir's ``directory.id`` as a UUID (how BrokerHeartbeat names a log dir); dirs
    without meta.properties, or with an id that is not 16 bytes of base64url, are left
    out."""
    ids: dict[Path, uuid.UUID] = {}
    for directory in dirs:
        props = read_meta_properties(directory)
        if props is None or props.directory_id is None:
            continue
        try:
            raw = base64.urlsafe_b64decode(props.directory_id + "==")
        except (binascii.Error, ValueError):
            continue
        if len(raw) == 16:
            ids[Path(directory)] = uuid.UUID(bytes=raw)
    return ids


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
    source: random.Random = _SYSTEM_RANDOM,
) -> str:
    """Check (and where missing, write) meta.properties in ``dirs``; the cluster id.

    ``source`` draws the ids of the first start (cluster id, directory ids)."""
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
        known = generate_cluster_id(source)
    for directory in dict.fromkeys(Path(d) for d in dirs):
        if directory not in found:
            props = MetaProperties(known, node_id, _base64_uuid(source))
            write_meta_properties(directory, props, fsync)
    return known


@dataclass(frozen=True)
class FormatResult:
    """What :func:`format_dirs` did: dirs it formatted, and dirs already formatted that it
    left as they were (``--ignore-formatted``)."""

    formatted: tuple[Path, ...]
    already_formatted: tuple[Path, ...]


def format_dirs(
    dirs: Sequence[str | Path],
    *,
    cluster_id: str,
    node_id: int,
    ignore_formatted: bool = False,
    fsync: FsyncFn = os.fsync,
    source: random.Random = _SYSTEM_RANDOM,
) -> FormatResult:
    """Write meta.properties (``cluster_id``, ``node_id``, a new directory id) into every
    dir of ``dirs`` that has none, as ``kafka-storage format`` does.

    Everything is checked before anything is written, so a refusal leaves every dir as it
    was: an invalid ``cluster_id``; a dir already formatted, unless ``ignore_formatted``;
    and even then a formatted dir of another cluster or node, since the node could not
    start on that mix. The caller holds the dirs' locks (:func:`format_storage` does).
    """
    check_cluster_id(cluster_id)
    unique = list(dict.fromkeys(Path(d) for d in dirs))
    if not unique:
        raise MetaPropertiesError("no directory to format: log.dirs is empty")
    already: list[Path] = []
    for directory in unique:
        props = read_meta_properties(directory)
        if props is None:
            continue
        path = directory / META_PROPERTIES
        if not ignore_formatted:
            raise MetaPropertiesError(
                f"{directory} is already formatted ({path} has cluster.id {props.cluster_id}); "
                "use --ignore-formatted to leave it as it is and format the others"
            )
        if props.cluster_id != cluster_id or props.node_id != node_id:
            raise MetaPropertiesError(
                f"{path} has cluster.id {props.cluster_id} and node.id {props.node_id}, "
                f"not {cluster_id} and {node_id}; a node's dirs must all agree"
            )
        already.append(directory)
    formatted = [d for d in unique if d not in already]
    for directory in formatted:
        write_meta_properties(
            directory, MetaProperties(cluster_id, node_id, _base64_uuid(source)), fsync
        )
    return FormatResult(tuple(formatted), tuple(already))
