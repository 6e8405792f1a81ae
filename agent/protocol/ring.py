"""Ring allreduce (``ring``, the thesis's Figure 13 baseline: Keras MultiWorkerMirrored's).

The members, in id order, form a ring; each sends only to its successor, on the link topic
``link/<me>/<successor>`` like a tree's link. The vector is cut into N segments. Reduce-scatter:
segment k starts at member k, and each member merges its own part into the partial mean it got
from its predecessor and passes it on; after N - 1 hops the member before k holds segment k's
mean over everyone. All-gather: that member sends the mean round the ring, each member keeping
it and passing it on, until the one before the member that completed it. Every member applies
the same means (the completer's, as sent), so the models stay identical.

No ACKs, no retries, no routing around: one silent member stops every segment. The round then
ends at once when the fleet declares the member down or excuses it (or at the deadline), and
is skipped where it has no mean: nothing is applied there, on every member alike, so the models
stay identical; the round is reported degraded, and the next view's ring leaves the member
out. A member whose model differs anyway (a member that went down mid all-gather left some
with a mean the others lack; a rejoiner) learns it from the root's (the lowest id's) model hash,
which the all-gather of the segment the root completes carries to every member unchanged, and
fetches the fleet's state; only the members unlike the root do.
"""

from __future__ import annotations

import itertools

import numpy as np

from agent.protocol.allreduce import (
    Action,
    Outbox,
    RoundContext,
    RoundResult,
    RoundStats,
    frame_size,
    merge_means,
)
from agent.protocol.notes import NoteKind
from agent.protocol.ps_sync import finish_as_sent, skip_detail
from agent.protocol.wire import Flag, Frame, Kind


def ring_segments(length: int, members: int) -> list[tuple[int, int]]:
    """[start, stop) of each member's segment: N nearly equal parts (some empty if length < N)."""
    edges = [length * k // members for k in range(members + 1)]
    return list(itertools.pairwise(edges))


class RingRound:
    def __init__(self, ctx: RoundContext) -> None:
        self.cfg, self.tree, self.node, self.round = ctx.config, ctx.tree, ctx.node, ctx.round
        self.grad, self.model_hash = ctx.gradient, ctx.model_hash
        self.members = ctx.tree.members
        size = len(self.members)
        self.pos = self.members.index(ctx.node)
        self.successor = self.members[(self.pos + 1) % size]
        self.predecessor = self.members[(self.pos - 1) % size]
        self.bounds = ring_segments(len(ctx.gradient), size)
        self.n = size
        self.final: list[tuple[frozenset[int], np.ndarray] | None] = [None] * self.n
        self.root_hash: int | None = ctx.model_hash if ctx.node == ctx.tree.root else None
        self.deadline = ctx.now + ctx.config.round_deadline
        self.stats = RoundStats()
        self.result: RoundResult | None = None
        self.out = Outbox(self.stats)

    def completer(self, k: int) -> int:
        """The member that completes segment k's mean: the one before segment k's start."""
        return self.members[(k - 1) % self.n]

    def start(self, now: float) -> list[Action]:
        if self.result is not None:
            return self.out.flush()  # skipped before it started (a member known down): nothing to pass on
        if self.n == 1:
            self._merge(0, frozenset(), np.zeros(0, dtype=np.float32), now)
        else:
            lo, hi = self.bounds[self.pos]
            self._pass(self.pos, Flag.NONE, frozenset({self.node}), self.grad[lo:hi])
        return self.out.flush()

    def on_frame(self, frame: Frame, now: float) -> list[Action]:
        self.stats.frames_received += 1
        self.stats.bytes_received += frame_size(frame)
        k = frame.chunk_index
        if (frame.round != self.round or frame.job != self.cfg.job or frame.kind != Kind.DATA
                or k >= self.n or frame.chunk_count != self.n or frame.sender != self.predecessor
                or frame.n_values != self.bounds[k][1] - self.bounds[k][0]
                or self.final[k] is not None or self.result is not None):
            self.stats.dropped += 1
            return []
        if frame.is_broadcast:
            if frame.contributors != frozenset(self.members):
                self.stats.dropped += 1
                return []
            if self.completer(k) == self.tree.root:
                self.root_hash = frame.model_hash  # the root's model, as the root stamped it
            if self.successor != self.completer(k):
                # passed on as stamped by its completer, before the round may finish here
                self._pass(k, Flag.BROADCAST | Flag.FINAL, frame.contributors, frame.values(), frame.model_hash)
            self._set_final(k, frame.contributors, frame.values(), now)
        elif self.node in frame.contributors or not frame.contributors <= set(self.members):
            self.stats.dropped += 1
        else:
            self._merge(k, frame.contributors, frame.values(), now)
        return self.out.flush()

    def on_timer(self, now: float) -> list[Action]:
        if self.result is None and now >= self.deadline:
            self._finish(now)
        return self.out.flush()

    def next_timer(self) -> float | None:
        return self.deadline if self.result is None else None

    def peer_down(self, peer: int, now: float) -> list[Action]:
        if self.result is None and peer in self.members and peer != self.node:
            self._finish(now)  # the ring is broken: the round is skipped, not waited out
        return self.out.flush()

    def excuse(self, peer: int, now: float) -> list[Action]:
        return self.peer_down(peer, now)

    def reconnected(self, now: float, away: float = float("inf")) -> list[Action]:
        return []  # no retransmission: the deadline or the fleet's verdict ends the round

    def peer_back(self, peer: int, now: float) -> list[Action]:
        return []

    def peer_away(self, peer: int, now: float) -> list[Action]:
        return []

    def peer_spoke(self, peer: int, now: float) -> list[Action]:
        return []

    def went_on(self, now: float) -> list[Action]:
        return []

    def arriving(self, sender: int | None, now: float) -> list[Action]:
        return []

    def _merge(self, k: int, ids: frozenset[int], values: np.ndarray, now: float) -> None:
        """Reduce-scatter: our part of segment k joins the partial mean; pass it on, or, once it
        holds everyone, start its all-gather."""
        lo, hi = self.bounds[k]
        own = (frozenset({self.node}), self.grad[lo:hi])
        merged_ids, mean = merge_means([(ids, values), own] if ids else [own])
        if merged_ids != frozenset(self.members):
            self._pass(k, Flag.NONE, merged_ids, mean)
            return
        out = self._frame(k, Flag.BROADCAST | Flag.FINAL, merged_ids).with_values(mean, self.cfg.wire_dtype)
        if self.n > 1:
            self.out.send(self.successor, out)
        self._set_final(k, merged_ids, out.values(), now)  # as the others decode it

    def _pass(self, k: int, flags: Flag, ids: frozenset[int], values: np.ndarray,
              model_hash: int | None = None) -> None:
        frame = self._frame(k, flags, ids, model_hash)
        self.out.send(self.successor, frame.with_values(values, self.cfg.wire_dtype))

    def _set_final(self, k: int, ids: frozenset[int], values: np.ndarray, now: float) -> None:
        self.final[k] = (ids, values)
        if all(f is not None for f in self.final):
            self._finish(now)

    def _frame(self, k: int, flags: Flag, ids: frozenset[int], model_hash: int | None = None) -> Frame:
        return Frame(Kind.DATA, self.cfg.job, self.round, self.node, k, self.n, flags,
                     model_hash=self.model_hash if model_hash is None else model_hash, contributors=ids)

    def _finish(self, now: float) -> None:
        self.result = finish_as_sent(self.node, self.round, self.tree, self.grad, self.bounds,
                                     self.final, self.root_hash, self.stats, now)
        if self.result.degraded:
            self.out.note(NoteKind.DEGRADED, None, skip_detail(self.final, self.members))
