"""RPS allreduce (reduce-scatter + all-gather among all members), for comparison.

Chunk j is owned by member j mod N. Everybody sends chunk j of its gradient to the owner; the
owner averages what arrived (waiting at most ``reduce_fraction`` of the deadline) and sends
the mean of chunk j to everybody. No ACKs, no retries: a chunk that never arrives falls back
to the node's own value (the RPS paper's rule), and the round is reported degraded.
"""

from __future__ import annotations

import numpy as np

from agent.protocol.allreduce import (
    Action,
    Outbox,
    RoundContext,
    RoundResult,
    RoundStats,
    chunk_bounds,
    frame_size,
    merge_means,
)
from agent.protocol.notes import NoteKind
from agent.protocol.tree import finish_with_fallback
from agent.protocol.wire import Flag, Frame, Kind


class RpsRound:
    def __init__(self, ctx: RoundContext) -> None:
        config, tree, node, round, gradient = ctx.config, ctx.tree, ctx.node, ctx.round, ctx.gradient
        model_hash, now = ctx.model_hash, ctx.now
        self.cfg, self.tree, self.node, self.round = config, tree, node, round
        self.grad, self.model_hash = gradient, model_hash
        self.members = tree.members
        self.bounds = chunk_bounds(len(gradient), config.chunk_size)
        self.n = len(self.bounds)
        self.owned = [j for j in range(self.n) if self.owner(j) == node]
        self.parts: dict[int, dict[int, np.ndarray]] = {j: {} for j in self.owned}
        self.final: list[tuple[frozenset[int], np.ndarray] | None] = [None] * self.n
        self.expected: set[int] = set(self.members)
        self.gather_at = now + config.round_deadline * config.reduce_fraction
        self.deadline = now + config.round_deadline
        self.stats = RoundStats()
        self.result: RoundResult | None = None
        self.out = Outbox(self.stats)

    def owner(self, j: int) -> int:
        return self.members[j % len(self.members)]

    def start(self, now: float) -> list[Action]:
        for j, (lo, hi) in enumerate(self.bounds):
            if self.owner(j) == self.node:
                self.parts[j][self.node] = self.grad[lo:hi]
            else:
                frame = self._frame(j, Flag.NONE, frozenset({self.node}))
                self.out.send(self.owner(j), frame.with_values(self.grad[lo:hi], self.cfg.wire_dtype))
        for j in self.owned:
            self._maybe_publish(j, now, force=False)
        return self.out.flush()

    def on_frame(self, frame: Frame, now: float) -> list[Action]:
        self.stats.frames_received += 1
        self.stats.bytes_received += frame_size(frame)
        j = frame.chunk_index
        if (frame.round != self.round or frame.job != self.cfg.job or frame.kind != Kind.DATA
                or j >= self.n or frame.chunk_count != self.n or frame.sender not in self.expected
                or frame.n_values != self.bounds[j][1] - self.bounds[j][0]):
            self.stats.dropped += 1
            return []
        if frame.is_broadcast:
            if frame.sender == self.owner(j) and self.final[j] is None and self.result is None:
                self._set_final(j, frame.contributors, frame.values(), now)
        elif j in self.parts and self.final[j] is None and frame.contributors == {frame.sender}:
            self.parts[j].setdefault(frame.sender, frame.values())
            self._maybe_publish(j, now, force=False)
        return self.out.flush()

    def on_timer(self, now: float) -> list[Action]:
        if now >= self.gather_at:
            for j in self.owned:
                self._maybe_publish(j, now, force=True)
        if self.result is None and now >= self.deadline:
            self._finish(now)
        return self.out.flush()

    def next_timer(self) -> float | None:
        if self.result is not None:
            return None
        if any(self.final[j] is None for j in self.owned):
            return min(self.gather_at, self.deadline)
        return self.deadline

    def peer_down(self, peer: int, now: float) -> list[Action]:
        self.expected.discard(peer)
        for j in self.owned:
            self._maybe_publish(j, now, force=False)
        return self.out.flush()

    def excuse(self, peer: int, now: float) -> list[Action]:
        return self.peer_down(peer, now)

    def reconnected(self, now: float, away: float = float("inf")) -> list[Action]:
        return []  # its gather timer already republishes what is missing

    def peer_back(self, peer: int, now: float) -> list[Action]:
        return []  # its gather timer already republishes what is missing

    def peer_away(self, peer: int, now: float) -> list[Action]:
        return []  # its gather timer already republishes what is missing

    def peer_spoke(self, peer: int, now: float) -> list[Action]:
        return []  # nothing waits for a verdict here

    def went_on(self, now: float) -> list[Action]:
        return []  # its gather timer already republishes what is missing

    def arriving(self, sender: int | None, now: float) -> list[Action]:
        return []  # no link timers: its gather timer waits as long

    def _maybe_publish(self, j: int, now: float, force: bool) -> None:
        parts = self.parts[j]
        if self.final[j] is not None or not (force or self.expected <= set(parts)):
            return
        ids, mean = merge_means([(frozenset({n}), v) for n, v in sorted(parts.items())])
        out = self._frame(j, Flag.BROADCAST | Flag.FINAL, ids).with_values(mean, self.cfg.wire_dtype)
        for member in self.members:
            if member != self.node:
                self.out.send(member, out)
        self._set_final(j, ids, out.values(), now)

    def _set_final(self, j: int, ids: frozenset[int], values: np.ndarray, now: float) -> None:
        self.final[j] = (ids, values)
        if all(f is not None for f in self.final):
            self._finish(now)

    def _frame(self, j: int, flags: Flag, ids: frozenset[int]) -> Frame:
        return Frame(Kind.DATA, self.cfg.job, self.round, self.node, j, self.n, flags,
                     model_hash=self.model_hash, contributors=ids)

    def _finish(self, now: float) -> None:
        self.result = self._result(now)
        if self.result.degraded:
            self.out.note(NoteKind.DEGRADED, None, self._degraded_detail(self.result))

    def _result(self, now: float) -> RoundResult:
        """What the round applies; a chunk whose mean never came falls back to our own."""
        return finish_with_fallback(self.node, self.round, self.tree, self.grad, self.bounds,
                                    self.final, None, self.stats, now)

    def _degraded_detail(self, result: RoundResult) -> str:
        return f"{len(result.missing_chunks)} chunks missing"
