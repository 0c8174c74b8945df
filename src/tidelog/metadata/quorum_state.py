"""The quorum-state file: ``<metadata.log.dir>/__cluster_metadata-0/quorum-state``.

The production :class:`~tidelog.metadata.raft.store.QuorumStateStore`: what a Raft node must
remember across restarts to never vote twice in an epoch nor go back to an older one. It is
JSON with the field names of Kafka's ``quorum-state`` (``QuorumStateData``, data version 0)::

    {"clusterId":"","leaderId":1,"leaderEpoch":5,"votedId":-1,"appliedOffset":0,
     "currentVoters":[{"voterId":1},{"voterId":2},{"voterId":3}],"data_version":0}

``leaderId`` and ``votedId`` are -1 when there is none; ``appliedOffset`` is always 0 (as
Kafka writes it). :meth:`FileQuorumStateStore.flush` replaces the file atomically (a
temporary file, fsynced, renamed over it, the directory fsynced); the node flushes before
it grants a vote, acknowledges an epoch or sends a request in a new epoch. A missing file
is epoch 0 with no vote. A file that does not parse is refused with
:class:`QuorumStateError`, never read as a fresh start: that could grant a second vote in
an epoch this node already voted in.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tidelog.metadata.errors import MetadataError
from tidelog.metadata.log import METADATA_PARTITION, METADATA_TOPIC
from tidelog.metadata.raft.store import QuorumState
from tidelog.runtime.system import Fsync
from tidelog.storage.checkpoint import write_durably

__all__ = ["QUORUM_STATE_FILE", "FileQuorumStateStore", "QuorumStateError"]

QUORUM_STATE_FILE = "quorum-state"
DATA_VERSION = 0
# The file is a few hundred bytes; refuse to read one of absurd size.
_MAX_BYTES = 1 << 20
_NONE = -1
_INT32_MAX = 2**31 - 1


class QuorumStateError(MetadataError):
    """The quorum-state file exists but cannot be read as one."""


class FileQuorumStateStore:
    """The quorum-state file of one node; ``voters`` is what it records as currentVoters."""

    def __init__(
        self,
        path: Path,
        voters: Iterable[int],
        *,
        cluster_id: str = "",
        fsync: Fsync = os.fsync,
    ) -> None:
        self.path = path
        self._voters = sorted(voters)
        self._cluster_id = cluster_id
        self._fsync = fsync
        self._pending: QuorumState | None = None

    @classmethod
    def open(
        cls,
        metadata_log_dir: str | Path,
        voters: Iterable[int],
        *,
        cluster_id: str = "",
        fsync: Fsync = os.fsync,
    ) -> FileQuorumStateStore:
        directory = Path(metadata_log_dir) / f"{METADATA_TOPIC}-{METADATA_PARTITION}"
        directory.mkdir(parents=True, exist_ok=True)
        return cls(directory / QUORUM_STATE_FILE, voters, cluster_id=cluster_id, fsync=fsync)

    def read(self) -> QuorumState | None:
        """The durable state; None when the file does not exist (epoch 0, no vote)."""
        try:
            with open(self.path, "rb") as file:
                data = file.read(_MAX_BYTES + 1)
        except FileNotFoundError:
            return None
        return self._parse(data)

    def write(self, state: QuorumState) -> None:
        self._pending = state

    def flush(self) -> None:
        if self._pending is None:
            return
        write_durably(self.path, self._encode(self._pending), self._fsync)
        self._pending = None

    def _encode(self, state: QuorumState) -> bytes:
        document = {
            "clusterId": self._cluster_id,
            "leaderId": _NONE if state.leader_id is None else state.leader_id,
            "leaderEpoch": state.epoch,
            "votedId": _NONE if state.voted_for is None else state.voted_for,
            "appliedOffset": 0,
            "currentVoters": [{"voterId": voter} for voter in self._voters],
            "data_version": DATA_VERSION,
        }
        return json.dumps(document, separators=(",", ":")).encode()

    def _parse(self, data: bytes) -> QuorumState:
        def refuse(problem: str) -> QuorumStateError:
            return QuorumStateError(
                f"quorum-state file {self.path} {problem}; refusing to start without it "
                "(starting afresh could vote twice in one epoch): restore it or remove it "
                "only if this node never voted"
            )

        if len(data) > _MAX_BYTES:
            raise refuse(f"is larger than {_MAX_BYTES} bytes")
        try:
            document: Any = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise refuse(f"is not JSON ({exc})") from None
        if not isinstance(document, dict):
            raise refuse("does not hold a JSON object")
        version = document.get("data_version")
        if version != DATA_VERSION:
            raise refuse(f"has data_version {version!r}, this node reads {DATA_VERSION}")

        def number(name: str, low: int) -> int:
            value = document.get(name)
            if type(value) is not int or not low <= value <= _INT32_MAX:
                raise refuse(f"has {name} {value!r}, not an integer in [{low}, {_INT32_MAX}]")
            return value

        epoch = number("leaderEpoch", 0)
        leader = number("leaderId", _NONE)
        voted = number("votedId", _NONE)
        return QuorumState(
            epoch=epoch,
            voted_for=None if voted == _NONE else voted,
            leader_id=None if leader == _NONE else leader,
        )
