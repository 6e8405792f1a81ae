"""Periodic averaging's ``auto`` sync period: how many local steps H the fleet takes per round.

A round of periodic averaging is H local optimizer steps (compute, each member on its own)
and one sync (the allreduce of the model delta, the same size whatever H is). Its wall time is
``H * step + sync``, so the share of it spent communicating is ``sync / (sync + H * step)``.
The coordinator picks the fewest steps that keep this share at most ``comm_share``: fewer local
steps train more per sample (the members drift apart less), more cost less time per sample.

The members measure their own step and sync times and announce them in their statuses; the
coordinator takes the medians of the fresh ones (a straggler's slow steps or a fast member's
long wait for it do not set the fleet's pace) and publishes H in the view, so every member
takes the same number of steps from the same round on. Hysteresis keeps views rare: a period
is judged only after it ran ``SETTLE_ROUNDS`` rounds, and changed only when the ideal one
differs from it by ``CHANGE_RATIO`` or more. Pure: timings in, a decision out.
"""

from __future__ import annotations

import enum
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

MIN_SYNC_EVERY = 1
MAX_SYNC_EVERY = 64  # beyond this the members drift apart for little saved time
AUTO_START = 1  # an auto fleet's period until the coordinator has measured: every-step averaging
DEFAULT_COMM_SHARE = 0.2
CHANGE_RATIO = 1.25  # the ideal period must differ by this factor before the view changes
SETTLE_ROUNDS = 3  # rounds a period runs before it is judged (the first ones carry the switch)
FRESH_ROUNDS = 8  # a member's announced timing counts this many rounds after the round it names
TIMING_EVERY = 2  # a member of an auto fleet announces its timing every this many rounds
TIMING_WINDOW = 5  # a member's timing: the medians of its last this many measured rounds


@dataclass(frozen=True)
class Timing:
    """One member's measurement: seconds per local optimizer step, and seconds from its
    contribution being ready to the round's result (the sync, including any wait for slower
    members)."""

    step_s: float
    sync_s: float


@dataclass(frozen=True)
class PeriodRule:
    comm_share: float = DEFAULT_COMM_SHARE
    lo: int = MIN_SYNC_EVERY
    hi: int = MAX_SYNC_EVERY

    def __post_init__(self) -> None:
        if not 0 < self.comm_share < 1:
            raise ValueError(f"comm_share must be in (0, 1), got {self.comm_share}")
        if not 1 <= self.lo <= self.hi:
            raise ValueError(f"need 1 <= lo <= hi, got {self.lo}..{self.hi}")


class Hold(enum.Enum):
    SETTLING = "the period has not run long enough to judge"
    UNMEASURED = "too few members announced their timing"
    WITHIN = "the period is near the ideal one"


@dataclass(frozen=True)
class KeepPeriod:
    why: Hold


@dataclass(frozen=True)
class ChangePeriod:
    sync_every: int
    fleet: Timing  # the medians the choice came from

    def describe(self, current: int) -> str:
        return (f"sync every {self.sync_every} local steps (was {current}): step {self.fleet.step_s * 1e3:.1f} ms, "
                f"sync {self.fleet.sync_s * 1e3:.0f} ms, communication {comm_share(self.fleet, current):.0%} "
                f"-> {comm_share(self.fleet, self.sync_every):.0%} of the round")


PeriodDecision = KeepPeriod | ChangePeriod


def comm_share(timing: Timing, sync_every: int) -> float:
    """The share of a round's wall time spent in its sync."""
    total = timing.sync_s + sync_every * timing.step_s
    return timing.sync_s / total if total > 0 else 0.0


def sync_every_for(timing: Timing, rule: PeriodRule) -> int:
    """The fewest local steps whose sync takes at most ``rule.comm_share`` of the round:
    ``sync / (sync + H * step) <= share``, i.e. ``H >= sync * (1 - share) / (share * step)``,
    held to ``[lo, hi]``."""
    if timing.sync_s <= 0:
        return rule.lo
    if timing.step_s <= 0:
        return rule.hi
    share = rule.comm_share
    # A hair below the exact bound so that an exact ratio is not rounded up by float error.
    needed = math.ceil(timing.sync_s * (1 - share) / (share * timing.step_s) - 1e-9)
    return max(rule.lo, min(rule.hi, needed))


def median_timing(timings: Sequence[Timing]) -> Timing:
    """The median step and the median sync: of a member's recent rounds (a round that met a
    fault is one outlier), or of the fleet's members (its pace, not a straggler's)."""
    return Timing(statistics.median(t.step_s for t in timings), statistics.median(t.sync_s for t in timings))


def decide_period(current: int, rounds_run: int, timings: Sequence[Timing], members: int,
                  rule: PeriodRule) -> PeriodDecision:
    """The coordinator's decision for an auto fleet now at ``current`` local steps, run for
    ``rounds_run`` rounds, from the fresh ``timings`` of the view's ``members``."""
    if rounds_run < SETTLE_ROUNDS:
        return KeepPeriod(Hold.SETTLING)
    if not timings or 2 * len(timings) <= members:
        return KeepPeriod(Hold.UNMEASURED)
    fleet = median_timing(timings)
    ideal = sync_every_for(fleet, rule)
    if max(ideal, current) < CHANGE_RATIO * min(ideal, current):
        return KeepPeriod(Hold.WITHIN)
    return ChangePeriod(ideal, fleet)
