"""How long a node of one FT-tree round waits for its subtree's contributions before it passes
on what it has: a share of the round's deadline by the levels its subtree spans, or (adaptive
timeouts) what its clean rounds took, at most the straggler deadline's share; longer while a
child that owes data is demonstrably still sending it, shorter after our connection dropped
(children may have sent around us)."""

from __future__ import annotations

import math

from agent.protocol.allreduce import DEADLINE_STRETCH, DOWNLINK_BUSY_HOLD
from agent.protocol.ft_reducer import ChunkReducer
from agent.protocol.ft_scope import RoundScope
from agent.protocol.ft_watch import FIRST_FRAME_MARGIN, PeerWatch


class ContributionWait:
    def __init__(self, scope: RoundScope, watch: PeerWatch, reducer: ChunkReducer) -> None:
        self.scope, self.watch, self.reducer = scope, watch, reducer
        self.at = scope.start_time + self._reduce_wait()  # when the wait runs out
        self.back_at: float | None = None  # when our connection came back in this round

    def _subtree_share(self) -> float:
        """The part of the tree's levels this node's subtree spans (1 at the root)."""
        scope, tree = self.scope, self.scope.tree
        below = max(tree.depth(m) for m in scope.subtree) - tree.depth(scope.node)
        return (below + 1) / (tree.height + 1)

    def _span(self) -> float:
        cfg = self.scope.cfg
        return cfg.round_deadline * cfg.reduce_fraction * self._subtree_share()

    def _cap(self, stretch: float = 1.0) -> float:
        """The longest wait for contributions: half of what the base wait leaves of the round
        (of the round put off by ``stretch`` while its links drain)."""
        base = self._span()
        return base + (self.scope.cfg.round_deadline * stretch - base) / 2

    def _reduce_wait(self) -> float:
        """The base share of the deadline, or (adaptive) a quarter more than this node's share
        of its clean rounds took, up to ``_cap``. On slow links a round can take longer than
        the base share: the broadcast of the previous round reaches the leaves late, so their
        data comes late, every round, cleanly."""
        base = self._span()
        peak = self.scope.links.round_peak
        if not self.scope.adaptive or peak is None:
            return min(base, self._straggler_wait())
        usual = 1.25 * peak * self._subtree_share()
        return min(max(base, min(self._cap(), usual)), self._straggler_wait())

    def _straggler_wait(self) -> float:
        """The longest wait for a member slower than the rest (straggler_deadline; none when
        0): the subtree's share of it, so that a node below passes on what it has in time for
        the levels above. A child demonstrably sending still extends it (draining_until)."""
        deadline = self.scope.cfg.straggler_deadline
        return deadline * self._subtree_share() if deadline > 0 else math.inf

    def draining_until(self, now: float) -> float:
        """The wait for contributions is over at ``now``, unless a child that still owes some
        is demonstrably sending them (adaptive timeouts): a frame from it came within its RTO
        plus one unit's transmission, so its next unit is on the way. Then the wait extends to
        when that next unit is due, but never beyond the point that leaves half of what is
        left of the round for the broadcast."""
        scope = self.scope
        if not scope.adaptive:
            return now
        # Past the straggler deadline a busy link is no reason: the frame may be anybody's (on a
        # busy host a fleet waited out a straggler's steps this way); a child must be sending.
        late = now >= scope.start_time + self._straggler_wait()
        owing = [c for c in scope.children if self.owes(c, late)]
        # Our link is busy with a large frame, or a link in a subtree we wait for (its nodes'
        # PROGRESS): contributions are on the way. Other members' links carry none of them.
        draining = self.watch.draining(now, {n for c in owing for n in scope.tree.subtree(c)})
        cap = scope.start_time + self._cap(DEADLINE_STRETCH if draining else 1.0)
        due = now + DOWNLINK_BUSY_HOLD if draining and not late else now
        for child in owing:
            heard = self.watch.last_heard.get(child)
            if heard is not None and (self.back_at is None or heard >= self.back_at):
                due = max(due, heard + scope.rto(child) + scope.transmit(child, scope.unit_bytes))
        return min(due, cap) if due > now else now

    def owes(self, child: int, late: bool = False) -> bool:
        """``child`` is up and its subtree still owes us data for some chunk."""
        scope = self.scope
        owed = scope.expected & set(scope.tree.subtree(child))
        if child in scope.down or not owed:
            return False
        short = [j for j in range(len(self.reducer)) if not owed <= self.reducer.covered(j)]
        if late:
            # Past the straggler deadline, a child that passed on what it had for every
            # chunk (without its straggler) has sent: only a chunk of which nothing came is.
            short = [j for j in short if not owed & self.reducer.covered(j)]
        return bool(short)

    def stop_soon(self, now: float) -> None:
        """A child that started this round while our Will was out sends around us, never to
        us: wait for our children only as long as their first frame usually takes, then pass
        on what we have and each unit as it comes (a unit or two more up our link: our parent
        may count on us for some). A whole wait for a child that went around us left the root
        waiting for one that had sent to us: 0.5-1.8 s rounds."""
        scope = self.scope
        if not scope.children:
            return
        usual = [f for c in scope.children if (f := scope.links.first_frame(c)) is not None]
        if len(usual) == len(scope.children):
            at = scope.start_time + FIRST_FRAME_MARGIN * max(usual)
        else:
            at = now + max(scope.rto(c) for c in scope.children)
        self.at = min(self.at, max(now, at))
