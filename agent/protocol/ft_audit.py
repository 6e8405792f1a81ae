"""The audit of one FT-tree round at one node: the copies our grandchildren send us of the units
they send their parents (our children), the check of each child's unit against them
(audit.py), so that an inner child's own part weighs one member's bound as a leaf's does, and
the record of children whose own part was far beyond it (plausibility.py): a liar's own part
is left out."""

from __future__ import annotations

import numpy as np

from agent.protocol.audit import Audit, CopyBook, audit_unit
from agent.protocol.ft_scope import RoundScope
from agent.protocol.influence import Influence, bound_unit
from agent.protocol.notes import NoteKind
from agent.protocol.plausibility import Evidence, PlausibilityBook
from agent.protocol.wire import Frame, RejectReason

_REASONS = {Audit.CLIPPED: RejectReason.OWN_PART_CLIPPED, Audit.REFUSED: RejectReason.OWN_PART_REFUSED}


class UnitAuditor:
    def __init__(self, scope: RoundScope) -> None:
        self.scope = scope
        self.copies = CopyBook()
        self.record = scope.ctx.plausibility or PlausibilityBook()
        self.outcomes: dict[Audit, int] = dict.fromkeys(Audit, 0)  # units checked this round, by outcome

    def on_copy(self, frame: Frame) -> None:
        """An audit copy: kept when it comes straight from a grandchild of ours and speaks
        for its subtree only; else dropped (it is never counted either way)."""
        scope, tree, origin = self.scope, self.scope.tree, frame.origin
        ancestors = tree.ancestors(origin) if origin in tree and origin != scope.node else ()
        if (frame.sender != origin or len(ancestors) < 2 or ancestors[1] != scope.node
                or not frame.contributors or not frame.contributors <= tree.subtree(origin)):
            scope.stats.dropped += 1
            return
        values, bound = frame.values(), scope.ctx.influence
        self.copies.keep(frame.chunk_index, ancestors[0], frame.contributors, values)
        leaf_copy = not tree.children(origin) and frame.contributors == {origin}  # its own values
        if leaf_copy and bound is not None and bound_unit(values, frame.chunk_index, bound)[0] is not Influence.WITHIN:
            self.record.suspects.add(origin)  # beyond a member's bound: its parent may leave it out

    def check(self, j: int, origin: int, ids: frozenset[int], values: np.ndarray) -> np.ndarray | None:
        """What to count for a unit of chunk ``j`` from ``origin`` instead of the unit as
        sent, or None: the unit as sent, under the whole-unit bound. A liar's own part is left
        out (its whole unit, when its children's copies are not all here); an inner node's
        own part beyond a member's bound leaves the bounded pieces, counted and noted."""
        scope, bound = self.scope, self.scope.ctx.influence
        if bound is None:
            return None
        liar, inner = self.record.flagged(origin), origin in scope.tree and bool(scope.tree.children(origin))
        if not (inner and scope.cfg.audit_units):
            return np.zeros(len(values), np.float32) if liar and origin in ids else None
        suspects = frozenset(self.record.suspects & ids)
        outcome = audit_unit(origin, j, ids, values, self.copies.of(j, origin), bound, left_out=liar, suspects=suspects)
        self.outcomes[outcome.audit] += 1
        if outcome.audit is Audit.UNAUDITED:
            return np.zeros(len(values), np.float32) if liar else None
        reason = _REASONS.get(outcome.audit)
        if reason is not None and not liar:
            scope.stats.refused[reason] += 1
            scope.out.note(NoteKind.INFLUENCE_BOUNDED, origin, f"chunk {j} own part {outcome.audit.value}: "
                           f"{outcome.own_norm:.3g} beyond {bound.limit(j):.3g}")
        if outcome.audit is not Audit.WITHIN and not liar:
            self.off(origin, Evidence.FAR if outcome.audit is Audit.REFUSED else Evidence.BEYOND)
        return None if outcome.audit is Audit.WITHIN else outcome.values

    def off(self, origin: int, evidence: Evidence) -> None:
        """``origin``'s own contribution was beyond a member's bound this round: on its
        record; noted with the evidence when that makes it a liar."""
        if self.record.observe(origin, self.scope.round, evidence):
            self.scope.stats.refused[RejectReason.LIAR_LEFT_OUT] += 1
            self.scope.out.note(NoteKind.LIAR, origin, self.record.evidence(origin))
