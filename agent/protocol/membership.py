"""Membership: who takes part in which round, without a consensus protocol.

Every agent keeps a retained ``online`` (or ``joining``) status with an ``offline`` Last Will,
so the broker announces crashes. The coordinator, the lowest id that is live, publishes a
retained ``View(epoch + 1, members, arity, coordinator, from_round)`` when the live set
differs from the newest view; ``from_round`` lies two rounds ahead so the view reaches
everybody before it applies. Every node uses, in round r, the newest view (highest epoch)
whose ``from_round <= r``. Pure: statuses and views in, views to publish out.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.protocol.messages import Status, View

LEAD_ROUNDS = 2  # a new view applies this many rounds after the coordinator's current one
LIVE_STATES = ("online", "joining")


@dataclass(frozen=True)
class PublishView:
    view: View


class Membership:
    def __init__(self, node: int, arity: int = 2, initial: View | None = None) -> None:
        self.node = node
        self.arity = arity
        self.states: dict[int, str] = {}
        self.incarnations: dict[int, int] = {}
        self.views: list[View] = [initial] if initial is not None else []
        self.round = 0

    # ------------------------------------------------------------------ inputs

    def on_status(self, status: Status) -> list[PublishView]:
        if status.incarnation < self.incarnations.get(status.node, 0):
            return []  # an older life of that node (a late Will, a stale retained status)
        self.incarnations[status.node] = status.incarnation
        self.states[status.node] = status.state
        return self._coordinate()

    def on_view(self, view: View) -> bool:
        """Keep a view if it is newer than every one known; True when it was new."""
        if self.views and (view.epoch, -view.coordinator) <= (self.newest.epoch, -self.newest.coordinator):
            return False
        self.views.append(view)
        self.views = self.views[-8:]
        return True

    def round_started(self, round: int) -> list[PublishView]:
        self.round = round
        return self._coordinate()

    # ------------------------------------------------------------------ queries

    @property
    def newest(self) -> View:
        return self.views[-1]

    def live(self) -> list[int]:
        return sorted(n for n, s in self.states.items() if s in LIVE_STATES)

    def coordinator(self) -> int | None:
        """The lowest id not known to be offline or joining, among the newest view and the
        online ones (a joiner does not know the fleet's round yet, so it never coordinates)."""
        gone = {n for n, s in self.states.items() if s != "online"}
        current = set(self.newest.members) if self.views else set()
        online = {n for n, s in self.states.items() if s == "online"}
        candidates = sorted((current - gone) | online)
        return candidates[0] if candidates else None

    def view_for(self, round: int) -> View | None:
        usable = [v for v in self.views if v.from_round <= round]
        return max(usable, key=lambda v: v.epoch) if usable else None

    def members_for(self, round: int) -> tuple[int, ...]:
        view = self.view_for(round)
        return tuple(view.members) if view is not None else ()

    # ------------------------------------------------------------------ coordinator

    def _coordinate(self) -> list[PublishView]:
        if self.coordinator() != self.node:
            return []
        # Absence of a status is not news (statuses trickle in at start-up): only an explicit
        # offline removes a member, only online/joining adds one.
        gone = {n for n, s in self.states.items() if s not in LIVE_STATES}
        current = set(self.newest.members) if self.views else set()
        live = sorted((current - gone) | set(self.live()))
        if self.views and list(self.newest.members) == live:
            return []
        epoch = self.newest.epoch + 1 if self.views else 1
        start = self.round + LEAD_ROUNDS
        if self.views:
            start = max(start, self.newest.from_round + 1)
        view = View(epoch=epoch, members=live, arity=self.arity, coordinator=self.node,
                    from_round=start)
        self.on_view(view)
        return [PublishView(view)]
