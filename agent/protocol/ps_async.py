"""Asynchronous parameter server (``ps-async``, the thesis's Figure 13 baseline).

The round's root (the view's lowest id) is the server. Each worker sends it its gradient; the
server applies each chunk as it arrives (1/N of it, so that a full round moves the model as
far as the synchronous mean) and answers that worker at once with what it applied so far this
round plus what it owed the worker from earlier rounds (``ServerLedger``). A worker applies
the answer and goes on without waiting for the others: its next gradient is computed on a
model that lacks the updates the server applied after its answer (stale), which it gets with
its next answer. The server ends its own round once every expected worker's chunks arrived, or
at ``reduce_fraction`` of the deadline (a silent worker is left out: it is owed the round's
whole update); a worker's chunk that comes after that is answered with what it is owed, the
round's whole update in it, its own gradient not applied.

The agent core is round-based: a worker runs at most one round ahead of the server (its next
round's frames wait for the server's next round), so the staleness is at most one round. The
members' models differ by the updates in flight; they are not compared (no root hash). A
worker that gets no answer (the fleet declares the server down, or the deadline passes) skips
the round (applies nothing there) and reports it degraded; a new server (the next view's
lowest id) owes nobody anything from before, so what the old one owed is lost.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from agent.protocol.allreduce import (
    Action,
    Outbox,
    RoundContext,
    RoundResult,
    RoundStats,
    chunk_bounds,
    frame_size,
)
from agent.protocol.notes import NoteKind
from agent.protocol.ps_ledger import ServerLedger
from agent.protocol.ps_sync import finish_as_sent, skip_detail
from agent.protocol.wire import Flag, Frame, Kind


class PsAsyncRound:
    def __init__(self, ctx: RoundContext) -> None:
        self.cfg, self.tree, self.node, self.round = ctx.config, ctx.tree, ctx.node, ctx.round
        self.grad, self.model_hash = ctx.gradient, ctx.model_hash
        self.members = ctx.tree.members
        self.server = ctx.tree.root
        self.bounds = chunk_bounds(len(ctx.gradient), ctx.config.chunk_size)
        self.n = len(self.bounds)
        self.ledger = ctx.ledger if ctx.ledger is not None else ServerLedger()
        self.applied = np.zeros(len(ctx.gradient), dtype=np.float64)  # server: this round's update
        self.arrived: list[set[int]] = [set() for _ in self.bounds]  # server: whose chunk j is in
        self.answered: dict[tuple[int, int], np.ndarray] = {}  # server: (worker, j) -> applied then
        self.final: list[tuple[frozenset[int], np.ndarray] | None] = [None] * self.n  # worker
        self.expected: set[int] = set(self.members)
        self.gather_at = ctx.now + ctx.config.round_deadline * ctx.config.reduce_fraction
        self.deadline = ctx.now + ctx.config.round_deadline
        self.stats = RoundStats()
        self.result: RoundResult | None = None
        self.out = Outbox(self.stats)

    @property
    def serving(self) -> bool:
        return self.node == self.server

    def start(self, now: float) -> list[Action]:
        if self.result is not None:
            return self.out.flush()  # skipped before it started (the server known down): nothing to send
        if self.serving:
            self.ledger.forget(set(self.members))
            for j, (lo, hi) in enumerate(self.bounds):
                self.applied[lo:hi] += self.grad[lo:hi] / len(self.members)
                self.arrived[j].add(self.node)
            self._close(now, force=False)
        else:
            for j, (lo, hi) in enumerate(self.bounds):
                frame = self._frame(j, Flag.NONE, frozenset({self.node}))
                self.out.send(self.server, frame.with_values(self.grad[lo:hi], self.cfg.wire_dtype))
        return self.out.flush()

    def on_frame(self, frame: Frame, now: float) -> list[Action]:
        self.stats.frames_received += 1
        self.stats.bytes_received += frame_size(frame)
        j = frame.chunk_index
        if (frame.round != self.round or frame.job != self.cfg.job or frame.kind != Kind.DATA
                or j >= self.n or frame.chunk_count != self.n or frame.sender not in self.members
                or frame.n_values != self.bounds[j][1] - self.bounds[j][0]):
            self.stats.dropped += 1
            return []
        if self.serving and not frame.is_broadcast and frame.contributors == {frame.sender} != {self.node}:
            self._take_gradient(frame, now)
        elif (not self.serving and frame.is_broadcast and frame.sender == self.server
              and self.final[j] is None and self.result is None):
            self.final[j] = (frame.contributors, frame.values())
            if all(f is not None for f in self.final):
                self._finish_worker(now)
        else:
            self.stats.dropped += 1
        return self.out.flush()

    def on_timer(self, now: float) -> list[Action]:
        if self.result is None and self.serving and now >= self.gather_at:
            self._close(now, force=True)
        if self.result is None and now >= self.deadline:
            self._finish_worker(now)
        return self.out.flush()

    def next_timer(self) -> float | None:
        if self.result is not None:
            return None
        return self.gather_at if self.serving else self.deadline

    def peer_down(self, peer: int, now: float) -> list[Action]:
        self.expected.discard(peer)
        if self.result is None and self.serving:
            self._close(now, force=False)
        elif self.result is None and peer == self.server:
            self._finish_worker(now)  # no answer will come: skip the round, degraded
        return self.out.flush()

    def excuse(self, peer: int, now: float) -> list[Action]:
        return self.peer_down(peer, now)

    def reconnected(self, now: float, away: float = float("inf")) -> list[Action]:
        return []  # no retransmission: the deadline bounds the wait

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

    def _take_gradient(self, frame: Frame, now: float) -> None:
        """Apply a worker's chunk now (once) and answer it; after the round closed, only answer."""
        worker, j = frame.sender, frame.chunk_index
        lo, hi = self.bounds[j]
        if worker in self.arrived[j]:
            self.stats.dropped += 1
            return
        self.arrived[j].add(worker)
        answer = self.ledger.take(worker, lo, hi, len(self.grad))  # after the close: the round's update in it
        if self.result is None:
            self.applied[lo:hi] += frame.values() / len(self.members)
            self.answered[(worker, j)] = self.applied[lo:hi].copy()
            answer += self.applied[lo:hi]
        out = self._frame(j, Flag.BROADCAST | Flag.FINAL, frozenset(self.arrived[j]))
        out = out.with_values(answer.astype(np.float32), self.cfg.wire_dtype)
        self.ledger.owe(worker, lo, answer - out.values(), len(self.grad))  # the wire's rounding
        self.out.send(worker, out)
        if self.result is None:
            self._close(now, force=False)

    def _close(self, now: float, force: bool) -> None:
        """The server's round ends: each worker is owed what was applied after its answer (all
        of the round's update if it got none: it comes late, or with its next answer)."""
        if self.result is not None or not (force or all(self.expected <= a for a in self.arrived)):
            return
        for worker in self.members:
            for j, (lo, hi) in enumerate(self.bounds):
                then = self.answered.get((worker, j))
                if worker != self.node:
                    self.ledger.owe(worker, lo, self.applied[lo:hi] - (0.0 if then is None else then), len(self.grad))
        everyone = frozenset(self.members)
        contributors = tuple(frozenset(a) for a in self.arrived)
        self.result = RoundResult(
            round=self.round, values=self.applied.astype(np.float32), contributors=contributors,
            missing_chunks=(), degraded=any(c != everyone for c in contributors),
            root_model_hash=None, stats=self.stats, link_states={}, finished_at=now)
        if self.result.degraded:
            left_out = sorted(everyone - frozenset.intersection(*contributors))
            self.out.note(NoteKind.DEGRADED, None, f"applied without {left_out}")

    def _finish_worker(self, now: float) -> None:
        result = finish_as_sent(self.node, self.round, self.tree, self.grad, self.bounds,
                                self.final, None, self.stats, now)
        # An answer holds the server's update so far, not everyone's mean: degraded only when
        # an answer is missing (the chunk skipped).
        self.result = replace(result, degraded=any(f is None for f in self.final))
        if self.result.degraded:
            self.out.note(NoteKind.DEGRADED, self.server, skip_detail(self.final, self.members))

    def _frame(self, j: int, flags: Flag, ids: frozenset[int]) -> Frame:
        return Frame(Kind.DATA, self.cfg.job, self.round, self.node, j, self.n, flags,
                     model_hash=self.model_hash, contributors=ids)
