"""Synchronous parameter server (``ps-sync``, the thesis's Figure 13 baseline).

The round's root (the view's lowest id) is the server. Every worker sends it its whole
gradient, chunk by chunk; the server averages what arrived once every expected worker's chunk
is there, or at ``reduce_fraction`` of the round's deadline (a silent worker is left out), and
sends the mean to every member. Every member applies the server's mean as sent, its own
gradient in it or not, so the models stay identical. A chunk whose mean never came (the server
went down: the fleet declares it so, or the deadline passes) is skipped: nothing is applied
there, on every member alike, and the round is reported degraded; the next view's server is
the next lowest id, and its root hash tells a member whose model differs to fetch the fleet's.

It is ``rps`` with one owner for every chunk: the same timers, no ACKs, no retries.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agent.protocol.allreduce import Action, RoundContext, RoundResult, RoundStats
from agent.protocol.rps import RpsRound
from agent.protocol.topology import Tree
from agent.protocol.wire import Frame


class PsSyncRound(RpsRound):
    def __init__(self, ctx: RoundContext) -> None:
        super().__init__(ctx)
        self.root_hash: int | None = ctx.model_hash if ctx.node == ctx.tree.root else None

    def owner(self, j: int) -> int:
        return self.tree.root

    def start(self, now: float) -> list[Action]:
        if self.result is not None:
            return self.out.flush()  # skipped before it started (the server known down): nothing to send
        return super().start(now)

    def peer_down(self, peer: int, now: float) -> list[Action]:
        if peer == self.tree.root and self.result is None:
            self._finish(now)  # no mean will come: skip the round now, not at the deadline
        return super().peer_down(peer, now)

    def on_frame(self, frame: Frame, now: float) -> list[Action]:
        if frame.is_broadcast and frame.sender == self.tree.root and self.root_hash is None:
            self.root_hash = frame.model_hash
        return super().on_frame(frame, now)

    def _result(self, now: float) -> RoundResult:
        return finish_as_sent(self.node, self.round, self.tree, self.grad, self.bounds,
                              self.final, self.root_hash, self.stats, now)

    def _degraded_detail(self, result: RoundResult) -> str:
        return skip_detail(self.final, self.members)


def finish_as_sent(
    node: int, round: int, tree: Tree, grad: np.ndarray, bounds: list[tuple[int, int]],
    final: Sequence[tuple[frozenset[int], np.ndarray] | None], root_hash: int | None,
    stats: RoundStats, now: float,
) -> RoundResult:
    """The applied vector: the mean as sent where it came (with or without our own gradient:
    every member applies the same), nothing (zeros: the chunk is skipped) elsewhere."""
    values = np.zeros(len(grad), dtype=np.float32)
    contributors: list[frozenset[int]] = []
    for j, (lo, hi) in enumerate(bounds):
        got = final[j]
        if got is not None:
            values[lo:hi] = got[1]
        contributors.append(frozenset() if got is None else got[0])
    everyone = frozenset(tree.members)
    return RoundResult(
        round=round, values=values, contributors=tuple(contributors), missing_chunks=(),
        degraded=any(c != everyone for c in contributors),
        root_model_hash=root_hash, stats=stats, link_states={}, finished_at=now,
    )


def skip_detail(final: Sequence[tuple[frozenset[int], np.ndarray] | None], members: Sequence[int]) -> str:
    """A degraded round's note: the chunks skipped and the members left out of the others."""
    skipped = sum(1 for f in final if f is None)
    counted = [f[0] for f in final if f is not None]
    left_out = sorted(set(members) - frozenset.intersection(*counted)) if counted else sorted(members)
    return f"{skipped} of {len(final)} chunks skipped (nothing applied there), left out {left_out}"
