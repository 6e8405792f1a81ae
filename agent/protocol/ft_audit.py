"""The audit of one FT-tree round at one node: the copies our grandchildren send us of the units
they send their parents (our children), and the check of each child's unit against them
(audit.py), so that an inner child's own part weighs one member's bound, as a leaf's does."""

from __future__ import annotations

import numpy as np

from agent.protocol.audit import Audit, AuditOutcome, CopyBook, audit_unit
from agent.protocol.ft_scope import RoundScope
from agent.protocol.notes import NoteKind
from agent.protocol.wire import Frame, RejectReason

_REASONS = {Audit.CLIPPED: RejectReason.OWN_PART_CLIPPED, Audit.REFUSED: RejectReason.OWN_PART_REFUSED}


class UnitAuditor:
    def __init__(self, scope: RoundScope) -> None:
        self.scope = scope
        self.copies = CopyBook()
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
        self.copies.keep(frame.chunk_index, ancestors[0], frame.contributors, frame.values())

    def check(self, j: int, origin: int, ids: frozenset[int], values: np.ndarray) -> AuditOutcome | None:
        """The check of a unit of chunk ``j`` from ``origin`` (None: not one we audit: a leaf's,
        or audits are off); its own part beyond the bound is counted and noted."""
        scope, bound = self.scope, self.scope.ctx.influence
        if not scope.cfg.audit_units or bound is None or origin not in scope.tree or not scope.tree.children(origin):
            return None
        outcome = audit_unit(origin, j, ids, values, self.copies.of(j, origin), bound)
        self.outcomes[outcome.audit] += 1
        reason = _REASONS.get(outcome.audit)
        if reason is not None:
            scope.stats.refused[reason] += 1
            scope.out.note(NoteKind.INFLUENCE_BOUNDED, origin, f"chunk {j} own part {outcome.audit.value}: "
                           f"{outcome.own_norm:.3g} beyond {bound.limit(j):.3g}")
        return outcome
