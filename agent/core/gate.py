"""Whether the round an agent is at may start: not while the root of its tree is down, nor any
member of a ring (no round of that view can finish: wait, bounded, for the coordinator's view
without it; see ``indispensable``), not
while most of the view is down at once, and not without a broker connection. It also measures
how long a round waited before it could start."""

from __future__ import annotations

from agent.protocol.allreduce import Algorithm
from agent.protocol.membership import Membership, view_root
from agent.protocol.messages import View
from agent.protocol.rounds import indispensable


class RoundGate:
    def __init__(self, node: int, membership: Membership, root_wait: float,
                 algorithm: Algorithm = Algorithm.FT_TREE) -> None:
        self.node, self.membership, self.root_wait = node, membership, root_wait
        self.algorithm = algorithm
        self.root_wait_until: float | None = None  # waiting for a view without a dead root (or ring member)
        self.blocked: tuple[int, float] | None = None  # (round, since when) it could not start

    def dead_root_blocks(self, view: View | None, now: float) -> bool:
        """The view's root is down (or, for a ring, any member: each is its segment's root)."""
        return view is not None and self.node in view.members and self._root_is_down(view, now)

    def _root_is_down(self, view: View, now: float) -> bool:
        """No round of a tree whose root is offline or silent can finish, nor of a ring with a
        member so: wait (bounded) for the coordinator's view without it rather than run to the
        deadline, or (a ring) skip round after round and race ahead of the fleet's views."""
        needed = indispensable(self.algorithm, view.members, view_root(view)) - {self.node}
        newest = self.membership.views.latest
        if (not any(self.membership.is_down(m) for m in needed) or len(view.members) == 1
                or (newest is not None and newest.epoch > view.epoch)):
            # A newer view (from a later round) says where the new tree starts: the rounds
            # before it end at once on this one, as they did for the members that got here
            # first (late ones waited the whole root wait here, 5 s, and the fleet for them).
            self.root_wait_until = None
            return False
        if self.root_wait_until is None:
            self.root_wait_until = now + self.root_wait
        if now >= self.root_wait_until:
            self.root_wait_until = None
            return False
        return True

    def mostly_down(self, view: View) -> bool:
        """Most of the view down at once (a broker that went away published every Will):
        alone we would race through rounds nobody else runs. Wait for the view to change.
        Exactly half with the view's lowest member is the side that goes on (the tie rule of
        ``Membership.has_quorum``: a site cut off a fleet of two sites)."""
        up = [m for m in view.members if m == self.node or not self.membership.is_down(m)]
        half_with_lowest = len(up) * 2 == len(view.members) and min(view.members) in up
        return len(view.members) > 2 and len(up) * 2 <= len(view.members) and not half_with_lowest

    def hold(self, round: int, now: float) -> None:
        """Round ``round`` cannot start now."""
        if self.blocked is None or self.blocked[0] != round:
            self.blocked = (round, now)

    def open(self, round: int, now: float) -> float:
        """Round ``round`` starts now: the seconds it waited to."""
        since = self.blocked[1] if self.blocked is not None and self.blocked[0] == round else now
        self.blocked = None
        return now - since
