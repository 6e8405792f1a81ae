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

import enum
from dataclasses import dataclass, field

WINDOW = 8  # the rounds a child's record looks back on
FLAG_ROUNDS = 3  # rounds of those with its own part far beyond the bound (refused) that flag it
# Being beyond the bound (clipped) flags nobody: an honest dirichlet:0.1 leaf was clipped in
# 40-47 of 300 rounds, 7 in a row at the end of one run (its parent's norms shrink faster than
# its own), as a leaf flipping its gradient x-3 is. It marks a suspect (audit.as_counted).


class Evidence(enum.Enum):
    """How far a child's own part was off in one round."""

    BEYOND = "beyond"  # beyond a member's bound (clipped)
    FAR = "far"  # far beyond it (refused, or implausible)


@dataclass
class ChildRecord:
    rounds: dict[int, Evidence] = field(default_factory=dict)  # the last WINDOW rounds with evidence
    flagged_at: int | None = None  # the round it was flagged in

    def note(self, round: int, evidence: Evidence) -> None:
        if self.rounds.get(round) is not Evidence.FAR:
            self.rounds[round] = evidence
        for old in [r for r in self.rounds if r <= round - WINDOW]:
            del self.rounds[old]

    def convicts(self) -> bool:
        return sum(e is Evidence.FAR for e in self.rounds.values()) >= FLAG_ROUNDS


@dataclass
class PlausibilityBook:
    records: dict[int, ChildRecord] = field(default_factory=dict)
    # Members whose own values we saw beyond a member's bound, in a unit or an audit copy:
    # their parent may have left them out (audit.as_counted).
    suspects: set[int] = field(default_factory=set)

    def flagged(self, child: int) -> bool:
        record = self.records.get(child)
        return record is not None and record.flagged_at is not None

    def observe(self, child: int, round: int, evidence: Evidence) -> bool:
        """``child``'s own part was off in ``round`` as ``evidence`` says; True when that
        flags it now (once)."""
        self.suspects.add(child)
        record = self.records.setdefault(child, ChildRecord())
        if record.flagged_at is not None:
            return False
        record.note(round, evidence)
        if not record.convicts():
            return False
        record.flagged_at = round
        return True

    def evidence(self, child: int) -> str:
        record = self.records.get(child)
        if record is None:
            return "no record"
        far = [r for r, e in sorted(record.rounds.items()) if e is Evidence.FAR]
        beyond = [r for r, e in sorted(record.rounds.items()) if e is Evidence.BEYOND]
        return (f"own part far beyond a member's bound in rounds {far}, beyond it in {beyond}: "
                f"left out from round {record.flagged_at}")
