"""The per-child record of a parent: in which rounds a child's own contribution was far beyond a
member's bound, and whether that makes it a liar, to be left out from then on.

Where a unit is first merged, its sender's own part (a leaf's unit; an inner node's own part,
taken apart from its children's audit copies, audit.py) is held to a member's bound, and far
beyond it (``REFUSE_FACTOR`` bounds) counted as zero. One such round proves little; a child
whose own part is that far off in ``FLAG_ROUNDS`` of its last ``WINDOW`` rounds is flagged: from
then on its own part counts as zero in every round (its children's units still count, through
their copies), and its parent notes the evidence once. Honest non-IID data never came near
this: 7 agents on ``dirichlet:0.1``, 300 rounds, no own part and no leaf unit refused
(docs/SECURITY.md). Directions were no evidence at all: with ``dirichlet:0.1`` an honest
subtree's unit is anti-aligned with the rest of the fleet in 74-100 % of rounds, so a sign flip
looks more honest than the truth.

Kept by the core across rounds (the round machine writes, it reads); pure: no clock, no IO.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

WINDOW = 8  # the rounds a child's record looks back on
FLAG_ROUNDS = 3  # rounds of those with its own part far beyond the bound that flag it


@dataclass
class ChildRecord:
    refused_rounds: deque[int] = field(default_factory=lambda: deque(maxlen=WINDOW))
    flagged_at: int | None = None  # the round it was flagged in


@dataclass
class PlausibilityBook:
    records: dict[int, ChildRecord] = field(default_factory=dict)

    def flagged(self, child: int) -> bool:
        record = self.records.get(child)
        return record is not None and record.flagged_at is not None

    def refused(self, child: int, round: int) -> bool:
        """``child``'s own part was far beyond a member's bound in ``round``; True when that
        flags it now (once)."""
        record = self.records.setdefault(child, ChildRecord())
        if record.flagged_at is not None:
            return False
        if round not in record.refused_rounds:
            record.refused_rounds.append(round)
        recent = [r for r in record.refused_rounds if r > round - WINDOW]
        if len(recent) < FLAG_ROUNDS:
            return False
        record.flagged_at = round
        return True

    def evidence(self, child: int) -> str:
        record = self.records.get(child)
        if record is None:
            return "no record"
        rounds = ", ".join(str(r) for r in record.refused_rounds)
        return f"own part far beyond a member's bound in rounds {rounds}: left out from round {record.flagged_at}"
