"""Quorum, and the round a new view applies from.

A view may follow the newest one only when it keeps more than half of its members, or exactly
half with the lowest of them (the tie rule of a 50/50 split: docs/PARTITIONS.md). Half the view
gone at once is a broker shutting down, not crashes: the view is held (``MassDownHold``).
``from_round`` lies ``LEAD_ROUNDS`` ahead of the coordinator's round, so the view reaches
everybody before it applies; a view that only adds members applies right after the furthest
round a member can have started (``front``).
"""

from __future__ import annotations

from collections.abc import Iterable

from agent.protocol.membership.views import view_root
from agent.protocol.messages import View

LEAD_ROUNDS = 2  # a new view applies this many rounds after the coordinator's current one
MASS_DOWN_HOLD = 10.0  # s: half the view offline at once is the broker, not crashes: wait


def keeps_quorum(members: list[int], live: list[int] | set[int]) -> bool:
    kept = [m for m in members if m in live]
    return len(kept) * 2 > len(members) or (len(kept) * 2 == len(members) and min(members) in kept)


def has_quorum(live: list[int] | set[int], views: Iterable[View | None]) -> bool:
    """Whether a view of ``live`` keeps the quorum of each of ``views`` (the newest and the
    one in effect: Wills come one by one, and each view against the one just published, not
    yet in effect, kept a majority of it, down to a minority)."""
    return all(keeps_quorum(view.members, live) for view in views if view is not None)


class MassDownHold:
    """Half the view gone at once: a broker shutting down publishes every client's Will, and
    the statuses come back when it does. The view is held for ``MASS_DOWN_HOLD`` s."""

    def __init__(self) -> None:
        self.since: float | None = None

    def holds(self, members: tuple[int, ...] | list[int], gone: set[int], now: float) -> bool:
        down = len(set(members) & gone)
        if down < 2 or down * 2 < len(members):
            self.since = None
            return False
        if self.since is None:
            self.since = now
        return now - self.since < MASS_DOWN_HOLD

    def ends(self, now: float) -> float | None:
        """When the hold running at ``now`` ends; None without one."""
        return self.since + MASS_DOWN_HOLD if self.since is not None and self.since + MASS_DOWN_HOLD > now else None


def front(round: int, node: int, in_effect: View | None, root_finishes_first: bool) -> int:
    """The furthest round a member can have started, as ``node`` at ``round`` sees it: ours
    while we are the root of the round under way (``in_effect``'s) and its result leaves from
    us (the next round starts on that result, and our view goes out before it), else the next."""
    root_leads = root_finishes_first and in_effect is not None and view_root(in_effect) == node
    return round if root_leads else round + 1


def first_round(round: int, live: list[int], gone: set[int], newest: View, in_effect: View | None,
                ahead: int) -> int:
    """The round a new view of ``live`` applies from, published at ``round`` after ``newest``
    (``in_effect`` the view of our round, ``ahead`` the ``front``). Without its root no round
    of the current tree can finish, so nobody gets past the next round with it (the core
    waits): the next. A view that only adds members (a site back from a cut) applies right
    after the furthest round anybody can have started: a round sooner than LEAD_ROUNDS, which
    a view that removes members keeps (each member takes it only once it has seen them go),
    and so does one that takes back a member a pending view drops (its removal stands)."""
    if view_root(newest) in gone:
        return round + 1
    effective = in_effect or newest
    dropping = set(effective.members) - set(newest.members)
    adds_only = set(newest.members) <= set(live) and not dropping & set(live)
    return ahead + 1 if adds_only else round + LEAD_ROUNDS
