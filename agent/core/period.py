"""Periodic averaging's local steps per round: as the round's view says (sync-every auto: the
coordinator's pick, agent/protocol/sync_period.py), else as configured. This member's running
step and sync times, announced in its status, and the members' as their statuses announce
them; as coordinator, the choice of the period from them."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace

from agent.protocol.allreduce import Note
from agent.protocol.membership import Membership, PublishView, Tuning
from agent.protocol.messages import Status, View
from agent.protocol.notes import NoteKind
from agent.protocol.sync_period import (
    FRESH_ROUNDS,
    TIMING_EVERY,
    TIMING_WINDOW,
    ChangePeriod,
    PeriodRule,
    Timing,
    decide_period,
    median_timing,
)


@dataclass
class PeriodPolicy:
    configured: int | None  # sync_every (the start with auto); None: a gradient per step
    rule: PeriodRule | None = None  # sync-every auto; None: the configured period throughout
    recent: deque[Timing] = field(default_factory=lambda: deque(maxlen=TIMING_WINDOW))  # our rounds
    reported: dict[int, tuple[int, Timing]] = field(default_factory=dict)  # node -> (round, timing)
    period: int = 0  # the period of the rounds we last started, and the first of them
    since: int = 0
    announced_round: int = -TIMING_EVERY

    @property
    def auto(self) -> bool:
        return self.rule is not None and self.configured is not None

    def local_steps(self, view: View) -> int | None:
        """Local steps of a round of ``view``; None: one gradient, averaged (no periodic averaging)."""
        if self.configured is None:
            return None
        return view.sync_every or self.configured

    def started(self, round: int, view: View) -> int | None:
        """A round of ``view`` starts here: its local steps (a new period counts from here)."""
        steps = self.local_steps(view)
        if steps is not None and steps != self.period:
            self.period, self.since = steps, round
        return steps

    def measured(self, compute_s: float, sync_s: float, steps: int) -> None:
        """A round of ours that started as usual ended: ``steps`` local steps took
        ``compute_s``, the sync ``sync_s``."""
        self.recent.append(Timing(max(compute_s, 0.0) / max(steps, 1), max(sync_s, 0.0)))

    @property
    def own(self) -> Timing | None:
        return median_timing(self.recent) if self.recent else None

    def heard(self, status: Status) -> None:
        if status.step_s > 0 and status.sync_s > 0:
            self.reported[status.node] = (status.round, Timing(status.step_s, status.sync_s))

    def announced(self) -> Timing:
        """What our status says of our timing (auto fleets; zeros: nothing to say)."""
        own = self.own
        if not self.auto or own is None:
            return Timing(0.0, 0.0)
        return Timing(round(own.step_s, 6), round(own.sync_s, 6))

    def announce_due(self, round: int) -> bool:
        """Our timing should go out again (in our status) at the end of ``round``."""
        if not self.auto or not self.recent or round < self.announced_round + TIMING_EVERY:
            return False
        self.announced_round = round
        return True

    def choose(self, node: int, membership: Membership, round: int) -> tuple[list[PublishView], Note | None]:
        """As coordinator of an auto fleet: the period of the rounds from ``LEAD_ROUNDS`` on."""
        view = membership.views.latest
        if not self.auto or view is None or membership.coordinator() != node:
            return [], None
        current = self.local_steps(view)
        assert current is not None and self.rule is not None
        fresh = {n: t for n, (r, t) in self.reported.items() if n in view.members and r + FRESH_ROUNDS >= round}
        if (own := self.own) is not None:
            fresh[node] = own
        decision = decide_period(current, round - self.since if current == self.period else 0,
                                 list(fresh.values()), len(view.members), self.rule)
        if not isinstance(decision, ChangePeriod):
            return [], None
        out = membership.retune(replace(Tuning.of(view), sync_every=decision.sync_every))
        if not out:
            return [], None
        return out, Note(NoteKind.SYNC_PERIOD, None,
                         f"{decision.describe(current)}, from round {membership.views.newest.from_round}")
