"""A fake driver for the group coordinator: fake time, an in-memory __consumer_offsets."""

from __future__ import annotations

import itertools
import struct
from collections import defaultdict
from collections.abc import Callable, Sequence

from tidelog.coordinator import (
    Effects,
    GroupConfig,
    GroupCoordinator,
    HeartbeatRequest,
    JoinGroupRequest,
    JoinGroupResult,
    LeaveGroupRequest,
    LeaveGroupResult,
    MemberIdentity,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetCommitResult,
    Response,
    SyncGroupRequest,
    SyncGroupResult,
    Write,
)
from tidelog.protocol.error_codes import ErrorCode
from tidelog.records import Record, decode_records

E = ErrorCode


def subscription(topics: Sequence[str], version: int = 1) -> bytes:
    """A ConsumerProtocolSubscription of ``version`` (0-3) for ``topics``."""
    out = bytearray(struct.pack(">hi", version, len(topics)))
    for t in topics:
        raw = t.encode()
        out += struct.pack(">h", len(raw)) + raw
    out += struct.pack(">i", -1)  # user data: null
    if version >= 1:
        out += struct.pack(">i", 0)  # owned partitions: none
    if version >= 2:
        out += struct.pack(">i", -1)  # generation id
    if version >= 3:
        out += struct.pack(">h", -1)  # rack id: null
    return bytes(out)


class Harness:
    """Drives a GroupCoordinator like the broker will: completions, writes, appends."""

    def __init__(
        self,
        config: GroupConfig | None = None,
        *,
        auto_write: bool = True,
        topic_exists: Callable[[str, int], bool] | None = None,
    ) -> None:
        ids = itertools.count(1)
        self.config = config or GroupConfig()
        self.coord = GroupCoordinator(
            self.config,
            topic_exists=topic_exists,
            member_id_factory=lambda client_id: f"{client_id}-{next(ids)}",
        )
        self.now = 1_000_000
        self.responses: dict[object, list[Response]] = defaultdict(list)
        self.log: dict[int, list[bytes]] = defaultdict(list)
        self.auto_write = auto_write
        self.held: list[Write] = []
        self._tokens = itertools.count(1)

    # -- plumbing

    def token(self, prefix: str = "t") -> str:
        return f"{prefix}{next(self._tokens)}"

    def apply(self, effects: Effects) -> None:
        for c in effects.completions:
            self.responses[c.token].append(c.response)
        for w in effects.writes:
            self.log[w.partition].append(w.to_batch(self.now))
            if self.auto_write:
                self.apply(self.coord.write_completed(w.write_id, self.now))
            else:
                self.held.append(w)

    def release(self, error: ErrorCode = E.NONE) -> None:
        """Complete the held writes (when ``auto_write`` is off)."""
        held, self.held = self.held, []
        for w in held:
            self.apply(self.coord.write_completed(w.write_id, self.now, error))

    def result(self, token: object) -> Response | None:
        got = self.responses.get(token)
        if not got:
            return None
        assert len(got) == 1, f"token {token!r} completed {len(got)} times"
        return got[0]

    def join_result(self, token: object) -> JoinGroupResult:
        r = self.result(token)
        assert isinstance(r, JoinGroupResult), r
        return r

    def sync_result(self, token: object) -> SyncGroupResult:
        r = self.result(token)
        assert isinstance(r, SyncGroupResult), r
        return r

    def advance(self, ms: int) -> None:
        self.now += ms
        self.apply(self.coord.tick(self.now))

    def records(self, partition: int) -> list[Record]:
        out: list[Record] = []
        for batch in self.log[partition]:
            out.extend(decode_records(batch))
        return out

    # -- requests

    def join(
        self,
        member_id: str = "",
        *,
        group: str = "g",
        protocols: Sequence[tuple[str, bytes]] = (("range", b"m"),),
        protocol_type: str = "consumer",
        session: int = 10_000,
        rebalance: int = 30_000,
        instance: str | None = None,
        client_id: str = "c",
        version: int = 9,
    ) -> str:
        token = self.token("join")
        req = JoinGroupRequest(
            group_id=group,
            member_id=member_id,
            protocol_type=protocol_type,
            protocols=protocols,
            session_timeout_ms=session,
            rebalance_timeout_ms=rebalance,
            group_instance_id=instance,
            client_id=client_id,
            client_host="/127.0.0.1",
            api_version=version,
        )
        self.apply(self.coord.join_group(token, self.now, req))
        return token

    def join_new(self, **kwargs: object) -> tuple[str, str]:
        """KIP-394 first join: get a member id, join with it. Returns (member id, token)."""
        first = self.join(**kwargs)  # type: ignore[arg-type]
        r = self.join_result(first)
        assert r.error is E.MEMBER_ID_REQUIRED, r
        return r.member_id, self.join(r.member_id, **kwargs)  # type: ignore[arg-type]

    def sync(
        self,
        member_id: str,
        generation: int,
        assignments: Sequence[tuple[str, bytes]] = (),
        *,
        group: str = "g",
        instance: str | None = None,
        protocol_type: str | None = None,
        protocol_name: str | None = None,
    ) -> str:
        token = self.token("sync")
        req = SyncGroupRequest(
            group, generation, member_id, instance, protocol_type, protocol_name, assignments
        )
        self.apply(self.coord.sync_group(token, self.now, req))
        return token

    def heartbeat(
        self, member_id: str, generation: int, *, group: str = "g", instance: str | None = None
    ) -> ErrorCode:
        return self.coord.heartbeat(
            self.now, HeartbeatRequest(group, generation, member_id, instance)
        )

    def leave(self, *members: MemberIdentity, group: str = "g") -> LeaveGroupResult:
        token = self.token("leave")
        self.apply(self.coord.leave_group(token, self.now, LeaveGroupRequest(group, members)))
        r = self.result(token)
        assert isinstance(r, LeaveGroupResult)
        return r

    def commit(
        self,
        offsets: dict[tuple[str, int], int],
        *,
        group: str = "g",
        generation: int = -1,
        member_id: str = "",
        metadata: str | None = "",
        leader_epoch: int = -1,
        retention: int = -1,
        version: int = 8,
    ) -> str:
        token = self.token("commit")
        req = OffsetCommitRequest(
            group,
            [
                OffsetCommitPartition(t, p, o, metadata, leader_epoch)
                for (t, p), o in offsets.items()
            ],
            generation_id=generation,
            member_id=member_id,
            retention_time_ms=retention,
            api_version=version,
        )
        self.apply(self.coord.commit_offsets(token, self.now, req))
        return token

    def commit_errors(self, token: str) -> list[ErrorCode]:
        r = self.result(token)
        assert isinstance(r, OffsetCommitResult), r
        return [p.error for p in r.partitions]

    # -- whole flows

    def form_group(
        self, n: int, *, group: str = "g", **kwargs: object
    ) -> tuple[list[str], int, str]:
        """n members join (KIP-394 style) and sync; returns (member ids, generation, leader)."""
        members: list[str] = []
        tokens: list[str] = []
        for i in range(n):
            mid, tok = self.join_new(group=group, client_id=f"c{i}", **kwargs)
            members.append(mid)
            tokens.append(tok)
        # the initial rebalance delay keeps the group open until no one joins for a delay
        for _ in range(20):
            if all(self.result(t) is not None for t in tokens):
                break
            self.advance(self.config.group_initial_rebalance_delay_ms)
        results = [self.join_result(t) for t in tokens]
        gen = results[0].generation_id
        leader = results[0].leader
        assert all(r.error is E.NONE and r.generation_id == gen for r in results)
        sync_tokens = []
        for mid in members:
            assignment = [(m, f"assign-{m}".encode()) for m in members] if mid == leader else []
            sync_tokens.append(self.sync(mid, gen, assignment, group=group))
        for mid, tok in zip(members, sync_tokens, strict=True):
            assert self.sync_result(tok).assignment == f"assign-{mid}".encode()
        return members, gen, leader
