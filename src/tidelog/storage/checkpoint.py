"""Checkpoint files and the durable file operations they rely on.

Kafka's checkpoint text format, used for ``recovery-point-offset-checkpoint``,
``log-start-offset-checkpoint`` and each partition's ``leader-epoch-checkpoint``::

    0                      <- format version
    2                      <- number of entry lines
    orders 0 1234          <- entries: space separated fields
    orders 1 99

A checkpoint is replaced atomically: the text goes to ``<name>.tmp``, which is
fsynced and renamed over ``<name>``; then the directory is fsynced so the rename
itself survives a crash. A reader therefore sees the old file or the new one,
never a mix; a leftover ``.tmp`` is ignored (and overwritten by the next write).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from tidelog.storage.errors import CorruptCheckpointError

CHECKPOINT_VERSION = 0
# A checkpoint file is small text; refuse to read one of absurd size.
_MAX_CHECKPOINT_BYTES = 64 * 1024 * 1024

FsyncFn = Callable[[int], None]


def fsync_dir(path: Path, fsync: FsyncFn = os.fsync) -> None:
    """Make the directory's entries (creations, renames, removals) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: Path, data: bytes, fsync: FsyncFn = os.fsync) -> None:
    """Replace ``path`` with ``data`` atomically: temp file, fsync, rename, fsync dir."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent, fsync)


def format_checkpoint(entries: Sequence[Sequence[str | int]]) -> bytes:
    lines = [str(CHECKPOINT_VERSION), str(len(entries))]
    for entry in entries:
        fields = [str(field) for field in entry]
        if any(not field or any(ch.isspace() for ch in field) for field in fields):
            raise ValueError(f"checkpoint field with whitespace or empty: {entry!r}")
        lines.append(" ".join(fields))
    return ("\n".join(lines) + "\n").encode("utf-8")


def write_checkpoint(
    path: Path, entries: Sequence[Sequence[str | int]], fsync: FsyncFn = os.fsync
) -> None:
    """Atomically replace the checkpoint at ``path`` with ``entries``."""
    write_durably(path, format_checkpoint(entries), fsync)


def parse_checkpoint(data: bytes, fields: int, source: str = "checkpoint") -> list[list[str]]:
    """Entries of a checkpoint, each a list of exactly ``fields`` strings."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise CorruptCheckpointError(f"{source} is not UTF-8 text") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) < 2:
        raise CorruptCheckpointError(f"{source} lacks its version and count lines")
    if lines[0].strip() != str(CHECKPOINT_VERSION):
        raise CorruptCheckpointError(f"{source} has unknown version {lines[0]!r}")
    try:
        count = int(lines[1].strip())
    except ValueError:
        raise CorruptCheckpointError(f"{source} has a bad count line {lines[1]!r}") from None
    if count != len(lines) - 2:
        raise CorruptCheckpointError(
            f"{source} declares {count} entries but holds {len(lines) - 2}"
        )
    entries: list[list[str]] = []
    for number, line in enumerate(lines[2:], start=3):
        parts = line.split()
        if len(parts) != fields:
            raise CorruptCheckpointError(
                f"{source} line {number} has {len(parts)} fields, expected {fields}: {line!r}"
            )
        entries.append(parts)
    return entries


def read_checkpoint(path: Path, fields: int) -> list[list[str]]:
    """Entries of the checkpoint at ``path``; an absent file reads as no entries."""
    try:
        with open(path, "rb") as file:
            data = file.read(_MAX_CHECKPOINT_BYTES + 1)
    except FileNotFoundError:
        return []
    if len(data) > _MAX_CHECKPOINT_BYTES:
        raise CorruptCheckpointError(f"{path} is larger than {_MAX_CHECKPOINT_BYTES} bytes")
    return parse_checkpoint(data, fields, str(path))


def parse_int_field(value: str, source: str, low: int = -(2**63), high: int = 2**63 - 1) -> int:
    try:
        number = int(value, 10)
    except ValueError:
        raise CorruptCheckpointError(f"{source}: {value!r} is not an integer") from None
    if not low <= number <= high:
        raise CorruptCheckpointError(f"{source}: {number} is out of range")
    return number
