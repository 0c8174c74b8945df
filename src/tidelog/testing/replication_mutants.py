"""Replicas that break one replication rule on purpose, used only by the tests that prove the
replication simulation's checker catches each broken rule."""

from __future__ import annotations

from collections.abc import Sequence

from tidelog.replication.replica import FetchAnswer, FetchRequest, Replica


class TruncateToHighWatermarkReplica(Replica):
    """Kafka before KIP-101: a new follower truncates to its own high watermark and then
    fetches without a last fetched epoch, so the leader never checks its log."""

    def become_follower(
        self,
        leader_id: int,
        leader_epoch: int,
        partition_epoch: int,
        replicas: Sequence[int] = (),
        isr: Sequence[int] = (),
    ) -> None:
        super().become_follower(leader_id, leader_epoch, partition_epoch, replicas, isr)
        self.log.truncate_to(self.high_watermark)

    def last_fetched_epoch(self) -> int:
        return -1


class IgnoreOwnEpochEndReplica(Replica):
    """Kafka before KIP-279: on DivergingEpoch the follower truncates to the leader's end
    offset without looking at where its own copy of that epoch ends, and trusts that its log
    now ends in the leader's epoch."""

    _assumed_epoch: int | None = None

    def truncation_offset(self, diverging: tuple[int, int]) -> int:
        return min(diverging[1], self.log.log_end_offset)

    def on_fetch_answer(self, request: FetchRequest, answer: FetchAnswer) -> bool:
        applied = super().on_fetch_answer(request, answer)
        if applied:
            self._assumed_epoch = answer.diverging[0] if answer.diverging is not None else None
        return applied

    def last_fetched_epoch(self) -> int:
        if self._assumed_epoch is not None:
            return self._assumed_epoch
        return super().last_fetched_epoch()


class NoStrictMinIsrReplica(Replica):
    """Before KIP-966: the high watermark advances whatever the size of the ISR, so the last
    replica standing commits alone."""

    def _may_advance(self, isr: Sequence[int]) -> bool:
        return True


class UnflushedAckReplica(Replica):
    """Counts appended but unflushed data towards the high watermark while promising that
    acks=all means fsynced on min.insync.replicas replicas."""

    def _own_acknowledged_offset(self) -> int:
        return self.log.log_end_offset

    def _follower_fsyncs(self) -> bool:
        return False


class CountDivergingFetchReplica(Replica):
    """Takes a follower's fetch offset as its log end offset even when it answers that the
    follower's log diverges."""

    def on_follower_fetch(self, request: FetchRequest, now_ms: int) -> FetchAnswer:
        answer = super().on_follower_fetch(request, now_ms)
        state = self._followers.get(request.replica_id)
        if answer.diverging is not None and state is not None:
            self._record_follower_position(
                state, request.fetch_offset, self.log.log_end_offset, now_ms
            )
        return answer


class SilentIsrReplica(Replica):
    """Computes the high watermark over the replicas that fetched in this epoch, skipping ISR
    members it has not heard from yet."""

    def _acknowledged_by(self, replica_id: int) -> int | None:
        state = self._followers.get(replica_id)
        if state is None or state.log_end_offset < 0:
            return self._own_acknowledged_offset()
        return state.log_end_offset


MUTANTS: dict[str, type[Replica]] = {
    "truncate-to-hw": TruncateToHighWatermarkReplica,
    "ignore-own-epoch-end": IgnoreOwnEpochEndReplica,
    "no-strict-min-isr": NoStrictMinIsrReplica,
    "unflushed-ack": UnflushedAckReplica,
    "count-diverging-fetch": CountDivergingFetchReplica,
    "hw-skips-silent-isr": SilentIsrReplica,
}
