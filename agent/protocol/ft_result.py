"""How one FT-tree round's result comes about at one node: the root finalizes each chunk from
its reducer; every other node takes it from its parent, a relay or the root's fan-out, checks
it, passes it on by the round's broadcast strategy and hands it to whoever asked for it; once
the machine ends the round, ``conclude`` says what to apply."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from agent.protocol.allreduce import RoundResult
from agent.protocol.ft_broadcast import (
    BroadcastStrategy,
    FanoutBroadcast,
    ResultBook,
    TreeBroadcast,
)
from agent.protocol.ft_pull import ResultPull
from agent.protocol.ft_receipts import Receipts
from agent.protocol.ft_reducer import ChunkReducer
from agent.protocol.ft_scope import Hop, ResultSource, RoundScope, result_source
from agent.protocol.notes import NoteKind
from agent.protocol.wire import DType, Flag, Frame, Kind, RejectReason
from agent.protocol.wire_choice import narrowest

_REFUSED_RESULT = {ResultSource.ELSEWHERE: RejectReason.RESULT_NOT_FROM_ABOVE,
                   ResultSource.BACKUP_NOT_ROUTED: RejectReason.RESULT_BACKUP_NOT_ROUTED}


class ResultFlow:
    def __init__(self, scope: RoundScope, results: ResultBook, fanout: FanoutBroadcast,
                 pull: ResultPull, receipts: Receipts, reducer: ChunkReducer,
                 plausible: Callable[[np.ndarray, int], bool]) -> None:
        self.scope, self.results, self.pull, self.receipts = scope, results, pull, receipts
        self.reducer, self.plausible = reducer, plausible
        self.fanout = fanout
        self.tree_broadcast = TreeBroadcast(results)

    @property
    def broadcast(self) -> BroadcastStrategy:
        return self.fanout if self.scope.cfg.broadcast == "fanout" else self.tree_broadcast

    def finalize(self, j: int, now: float) -> bool:
        """The root: chunk ``j``'s result from what its reducer counted, quantized once.
        True when every chunk has its result now."""
        cfg = self.scope.cfg
        ids, mean = self.reducer.merged(j)
        dtype = narrowest(cfg.wire_dtype, self.reducer.narrowest(j)) if cfg.wire_auto else cfg.wire_dtype
        frame = self.scope.frame(Kind.DATA, j, Flag.BROADCAST | Flag.FINAL, ids).with_values(mean, dtype)
        if dtype != DType.F32:
            # Everybody applies what the wire carries, the root included: byte-identical.
            mean = frame.values()
        return self._set(j, ids, mean, now, frame)

    def _set(self, j: int, ids: frozenset[int], values: np.ndarray, now: float, wire: Frame) -> bool:
        """``wire``: a frame whose payload carries ``values`` in the wire dtype; it is passed
        on as it is (no second quantization, no copy). True when every chunk has its result."""
        ch = self.results[j]
        ch.final, ch.final_ids = values, ids
        frame = replace(self.scope.frame(Kind.DATA, j, Flag.BROADCAST | Flag.FINAL, ids),
                        dtype=wire.dtype, scale=wire.scale, payload=wire.payload)
        ch.final_frame = frame  # every later copy of the result: these bytes, never re-encoded
        broadcast = self.broadcast
        peers = broadcast.peers()
        broadcast.published(j, frame, now)
        for peer in peers:
            self.results.send_down(j, peer, now)
        self.pull.serve_waiters(j, frame, peers)
        return self.results.complete()

    def on_final(self, frame: Frame, now: float, how: Hop, running: bool) -> bool:
        """A chunk of the result came ``how``; ``running``: the round has no result here yet.
        True when every chunk has its result now."""
        scope, j = self.scope, frame.chunk_index
        if how == Hop.DIRECT and self.broadcast.fanned(frame):
            return self._on_fanned(frame, now, running)
        source = result_source(scope.tree, scope.node, frame, scope.result_carriers())
        if source is not ResultSource.ABOVE:
            scope.stats.dropped += 1
            scope.stats.refused[_REFUSED_RESULT[source]] += 1
            if source is ResultSource.BACKUP_NOT_ROUTED and frame.origin == scope.parent != frame.sender:
                self.pull.ask_parent(now)  # relayed around us by our parent, or so a backup says
            return False
        self.receipts.ack(frame, how, now, batch=running)
        if self.results.has(j):
            return False
        if not frame.contributors or scope.parent is None:
            scope.stats.dropped += 1
            return False
        if scope.root_hash is None:
            scope.root_hash = frame.model_hash
        if scope.cfg.nack and how == Hop.DIRECT and frame.sender == scope.parent:
            self.receipts.nack_gaps(frame, self.results.has)
        values = frame.values()
        return self.plausible(values, frame.sender) and self._set(j, frame.contributors, values, now, frame)

    def _on_fanned(self, frame: Frame, now: float, running: bool) -> bool:
        scope, j = self.scope, frame.chunk_index
        if not self.fanout.take(frame, now, acking=running):
            return False
        values = frame.values()
        if not self.plausible(values, frame.sender):
            return False
        complete = self._set(j, frame.contributors, values, now, frame)
        rest = sum(1 for ch in self.results.chunks[j + 1 :] if ch.final is None)
        if running and rest and scope.parent is not None:
            # The rest of the fan-out follows this chunk at once: what has not come within half
            # an RTO of our parent (and its transmission; when a lost unit would be resent on a
            # link) was lost: ask then, not a pull timeout later.
            self.pull.soon(now + scope.rto(scope.parent) / 2
                           + scope.transmit(scope.tree.root, rest * scope.unit_bytes))
        return complete

    def conclude(self, now: float, skip_missing: bool) -> RoundResult:
        """What this node applies, as the round ends here now."""
        scope = self.scope
        values, contributors, missing = self.results.assemble(scope.grad, scope.node, skip_missing)
        # Members known down (a Will, or silent by the fleet's witnesses) are not waited for:
        # a round without them is complete, not degraded. Nor are we, when the fleet went on
        # without us. (A result may count a member that went down after it sent its data.)
        # A chunk skipped (its root went down) is no result at all, even with everyone else
        # down too (our connection dropped): such a round left our model apart from the fleet's.
        everyone = frozenset(scope.tree.members) - scope.down - {scope.node}
        degraded = bool(missing) or any(not c or not everyone <= c for c in contributors)
        if degraded:
            scope.out.note(NoteKind.DEGRADED, None, f"{len(missing)} chunks missing")
        elif scope.stats.timeouts == 0:
            scope.links.observe_round(now - scope.start_time)
        root_hash, model_hash = scope.root_hash, scope.ctx.model_hash
        if root_hash is not None and root_hash != model_hash:
            scope.out.note(NoteKind.DRIFT, scope.tree.root, f"root {root_hash:#x} mine {model_hash:#x}")
        return RoundResult(
            round=scope.round, values=values, contributors=tuple(contributors),
            missing_chunks=tuple(missing), degraded=degraded, root_model_hash=root_hash,
            stats=scope.stats, link_states=dict(scope.book.states), finished_at=now,
        )
