"""Plain tree allreduce, no fault tolerance (the baseline): no ACKs, no reroute, no pull.

A node forwards chunk j of its subtree mean once chunk j of every child arrived; the root
broadcasts; receivers forward. A lost frame or a dead node stalls its part of the tree until
the hard deadline, when every node falls back to its own value (reported degraded).
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
from agent.protocol.topology import Tree
from agent.protocol.wire import Flag, Frame, Kind


class PlainTreeRound:
    def __init__(self, ctx: RoundContext) -> None:
        config, tree, node, round, gradient = ctx.config, ctx.tree, ctx.node, ctx.round, ctx.gradient
        model_hash, now = ctx.model_hash, ctx.now
        self.cfg, self.tree, self.node, self.round = config, tree, node, round
        self.grad, self.model_hash = gradient, model_hash
        self.parent = tree.parent(node)
        self.children = tree.children(node)
        self.bounds = chunk_bounds(len(gradient), config.chunk_size)
        self.n = len(self.bounds)
        self.parts: list[dict[int, tuple[frozenset[int], np.ndarray]]] = [{} for _ in self.bounds]
        self.final: list[tuple[frozenset[int], np.ndarray] | None] = [None] * self.n
        self.root_hash: int | None = model_hash if self.parent is None else None
        self.deadline = now + config.round_deadline
        self.stats = RoundStats()
        self.result: RoundResult | None = None
        self.out = Outbox(self.stats)

    def start(self, now: float) -> list[Action]:
        for j in range(self.n):
            self._maybe_forward(j, now)
        return self.out.flush()

    def on_frame(self, frame: Frame, now: float) -> list[Action]:
        self.stats.frames_received += 1
        self.stats.bytes_received += frame_size(frame)
        j = frame.chunk_index
        if (frame.round != self.round or frame.job != self.cfg.job or frame.kind != Kind.DATA
                or j >= self.n or frame.chunk_count != self.n
                or frame.n_values != self.bounds[j][1] - self.bounds[j][0]):
            self.stats.dropped += 1
            return []
        if frame.is_broadcast:
            if frame.sender == self.parent and self.final[j] is None and self.result is None:
                if self.root_hash is None:
                    self.root_hash = frame.model_hash
                self._set_final(j, frame.contributors, frame.values(), now)
        elif frame.sender in self.children and frame.sender not in self.parts[j]:
            self.parts[j][frame.sender] = (frame.contributors, frame.values())
            self._maybe_forward(j, now)
        return self.out.flush()

    def on_timer(self, now: float) -> list[Action]:
        if self.result is None and now >= self.deadline:
            self._finish(now)
        return self.out.flush()

    def next_timer(self) -> float | None:
        return self.deadline if self.result is None else None

    def peer_down(self, peer: int, now: float) -> list[Action]:
        return []  # no fault tolerance: the baseline just waits for its deadline

    def excuse(self, peer: int, now: float) -> list[Action]:
        return []

    def reconnected(self, now: float, away: float = float("inf")) -> list[Action]:
        return []  # no retransmission either: what was lost waits for the deadline

    def peer_back(self, peer: int, now: float) -> list[Action]:
        return []  # no retransmission either: what was lost waits for the deadline

    def peer_away(self, peer: int, now: float) -> list[Action]:
        return []  # no retransmission either: what was lost waits for the deadline

    def peer_spoke(self, peer: int, now: float) -> list[Action]:
        return []  # nothing waits for a verdict here

    def went_on(self, now: float) -> list[Action]:
        return []  # no pulls: what was lost waits for the deadline

    def arriving(self, sender: int | None, now: float) -> list[Action]:
        return []  # its timers wait for the deadline anyway

    def _maybe_forward(self, j: int, now: float) -> None:
        if len(self.parts[j]) < len(self.children):
            return
        lo, hi = self.bounds[j]
        units = [(frozenset({self.node}), self.grad[lo:hi]), *self.parts[j].values()]
        ids, mean = merge_means(units)
        if self.parent is None:
            self._set_final(j, ids, Frame(Kind.DATA, 0, 0, 0).with_values(mean, self.cfg.wire_dtype).values(), now)
        else:
            self.out.send(self.parent, self._frame(j, Flag.NONE, ids).with_values(mean, self.cfg.wire_dtype))

    def _set_final(self, j: int, ids: frozenset[int], values: np.ndarray, now: float) -> None:
        self.final[j] = (ids, values)
        out = self._frame(j, Flag.BROADCAST | Flag.FINAL, ids).with_values(values, self.cfg.wire_dtype)
        for child in self.children:
            self.out.send(child, out)
        if all(f is not None for f in self.final):
            self._finish(now)

    def _frame(self, j: int, flags: Flag, ids: frozenset[int]) -> Frame:
        return Frame(Kind.DATA, self.cfg.job, self.round, self.node, j, self.n, flags,
                     model_hash=self.root_hash or 0, contributors=ids)

    def _finish(self, now: float) -> None:
        self.result = finish_with_fallback(self.node, self.round, self.tree, self.grad, self.bounds,
                                           self.final, self.root_hash, self.stats, now)
        if self.result.degraded:
            self.out.note(NoteKind.DEGRADED, None, f"{len(self.result.missing_chunks)} chunks missing")


def finish_with_fallback(
    node: int, round: int, tree: Tree, grad: np.ndarray, bounds: list[tuple[int, int]],
    final: list[tuple[frozenset[int], np.ndarray] | None], root_hash: int | None,
    stats: RoundStats, now: float, link_states: dict[int, str] | None = None,
) -> RoundResult:
    """The applied vector: the final mean where known (plus our own value if it lacks us),
    our own value elsewhere (RPS fallback)."""
    values = np.empty(len(grad), dtype=np.float32)
    contributors: list[frozenset[int]] = []
    missing: list[int] = []
    own_id = frozenset({node})
    for j, (lo, hi) in enumerate(bounds):
        got = final[j]
        if got is None:
            values[lo:hi] = grad[lo:hi]
            contributors.append(own_id)
            missing.append(j)
            continue
        ids, mean = got if node in got[0] else merge_means([got, (own_id, grad[lo:hi])])
        values[lo:hi] = mean
        contributors.append(ids)
    everyone = frozenset(tree.members)
    return RoundResult(
        round=round, values=values, contributors=tuple(contributors), missing_chunks=tuple(missing),
        degraded=bool(missing) or any(c != everyone for c in contributors),
        root_model_hash=root_hash, stats=stats, link_states=dict(link_states or {}), finished_at=now,
    )
