"""The reduce of one FT-tree round at one node, per chunk: which contributions are counted,
their merge into the subtree's mean, and what has gone up so far. No frames, no timers.

Counting: a unit is accepted only when its contributor set is disjoint from everything counted
for that chunk; a unit whose set is already covered is a duplicate (ACKed, not counted); a
partial overlap is refused, unless the unit holds every unit it overlaps and none of them went
up yet (it replaces them). Hence no contribution is ever counted twice. A unit whose values are
far beyond our own gradient is refused too (``plausible``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from agent.protocol.allreduce import merge_means
from agent.protocol.wire import DType
from agent.protocol.wire_choice import narrowest

IMPLAUSIBLE_FACTOR = 1000.0  # x our own largest gradient value, at least 1 (see plausible)

Unit = tuple[frozenset[int], np.ndarray]


def peak(values: np.ndarray) -> float:
    """The largest magnitude in ``values`` (0 when empty): two reductions, no temporary
    |values| array (every unit received passes here)."""
    if not len(values):
        return 0.0
    return max(float(values.max()), -float(values.min()))


class Offer(enum.Enum):
    """What a contribution would be to a chunk."""

    NEW = "new"  # disjoint from what is counted, or replaces units it holds
    DUPLICATE = "duplicate"  # every contributor is counted already
    OVERLAP = "overlap"  # counts some contributors twice: refused


@dataclass
class ChunkPart:
    """One chunk's contributions at this node."""

    units: list[Unit] = field(default_factory=list)
    covered: set[int] = field(default_factory=set)
    forwarded: int = 0  # units merged into what went up so far
    first_sent: bool = False
    narrowest: DType = DType.F32  # wire_auto: the narrowest format of the units merged here


class ChunkReducer:
    def __init__(self, chunks: int, own_peak: float, passes_up: bool) -> None:
        """``passes_up``: this node sends its means to a parent (not the root)."""
        self.parts = [ChunkPart() for _ in range(chunks)]
        self.value_limit = IMPLAUSIBLE_FACTOR * max(own_peak, 1.0)
        self.passes_up = passes_up

    def __len__(self) -> int:
        return len(self.parts)

    def covered(self, j: int) -> set[int]:
        return self.parts[j].covered

    def narrowest(self, j: int) -> DType:
        return self.parts[j].narrowest

    def plausible(self, values: np.ndarray) -> bool:
        """A mean of honest gradients is never far larger than our own gradient (same model,
        same data distribution): a unit beyond ``IMPLAUSIBLE_FACTOR`` times our largest value
        is a buggy or hostile peer's."""
        return not peak(values) > self.value_limit  # (not <=: NaN is another check's business)

    def classify(self, j: int, ids: frozenset[int]) -> Offer:
        part = self.parts[j]
        if ids <= part.covered:
            return Offer.DUPLICATE
        if ids & part.covered and not self._subsumes(part, ids):
            return Offer.OVERLAP
        return Offer.NEW

    def _subsumes(self, part: ChunkPart, ids: frozenset[int]) -> bool:
        """A unit that holds every unit it overlaps replaces them, if none of them went up
        yet: coverage only grows and nothing is counted twice. A child that saw its parent's
        Will sends what the parent had ACKed around it; the parent, back a moment later, sends
        its subtree's mean with that child's share in it. Refused as an overlap, it left the
        root waiting for the rest of that subtree until its wait ran out."""
        overlapped = [i for i, (u, _) in enumerate(part.units) if u & ids]
        if not all(part.units[i][0] <= ids for i in overlapped):
            return False
        return not self.passes_up or min(overlapped) >= part.forwarded

    def accept(self, j: int, ids: frozenset[int], values: np.ndarray, dtype: DType = DType.F32) -> None:
        """Count a unit ``classify`` called NEW (replacing the units it holds)."""
        part = self.parts[j]
        if ids & part.covered:
            part.units = [unit for unit in part.units if not unit[0] & ids]
            part.covered = set().union(*(u for u, _ in part.units))
        part.units.append((ids, values))
        part.covered |= ids
        part.narrowest = narrowest(part.narrowest, dtype)

    def ready(self, j: int, expected: set[int]) -> bool:
        return expected <= self.parts[j].covered

    def first_sent(self, j: int) -> bool:
        return self.parts[j].first_sent

    def all_first_sent(self) -> bool:
        return all(p.first_sent for p in self.parts)

    def take_unsent(self, j: int) -> Unit | None:
        """The mean of the units not passed on yet (marked passed on now), if any; the first
        call opens the chunk: later units follow as separate disjoint supplements."""
        part = self.parts[j]
        part.first_sent = True
        if part.forwarded >= len(part.units):
            return None
        ids, mean = merge_means(part.units[part.forwarded :])
        part.forwarded = len(part.units)
        return ids, mean

    def sent_so_far(self, j: int) -> Unit | None:
        """The mean of every unit passed on so far (None before the first)."""
        part = self.parts[j]
        if not part.first_sent or part.forwarded == 0:
            return None
        return merge_means(part.units[: part.forwarded])

    def merged(self, j: int) -> Unit:
        """The mean of every unit counted for chunk ``j``."""
        return merge_means(self.parts[j].units)
