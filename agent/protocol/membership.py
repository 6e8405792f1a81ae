"""Membership: who takes part in which round, without a consensus protocol.

Every agent keeps a retained ``online`` (or ``joining``) status with an ``offline`` Last Will,
so the broker announces crashes. Statuses and Wills carry the agent's incarnation, which grows
across restarts of the same id: a status of an older life (a late Will, a stale retained
status) is ignored, so a restarted agent is never mistaken for its dead predecessor.

The coordinator, the lowest id that is online, publishes a retained
``View(epoch + 1, members, arity, coordinator, from_round)`` when the live set differs from
the newest view; ``from_round`` lies two rounds ahead so the view reaches everybody before it
applies. Every node uses, in round r, the newest view (highest epoch) whose
``from_round <= r``, so all members switch trees at the same round.

Start-up gating: while no view exists at all, the coordinator waits until
``expected_members`` are live or ``join_grace`` seconds have passed, then publishes the first
view for the round it is at (everybody is waiting there). Pure: statuses, views and ``now``
in, views to publish out.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.protocol.messages import Status, View

LEAD_ROUNDS = 2  # a new view applies this many rounds after the coordinator's current one
LIVE_STATES = ("online", "joining")
KEPT_VIEWS = 8


@dataclass(frozen=True)
class PublishView:
    view: View


@dataclass(frozen=True)
class StartupGate:
    """When the first view may be published: ``expected_members`` live, or ``join_grace``
    seconds after ``started_at``. The default never waits."""

    expected_members: int = 0
    join_grace: float = 0.0
    started_at: float = 0.0

    def is_open(self, live: int, now: float) -> bool:
        return live >= self.expected_members or now - self.started_at >= self.join_grace


class Membership:
    def __init__(self, node: int, arity: int = 2, initial: View | None = None,
                 gate: StartupGate | None = None) -> None:
        self.node = node
        self.arity = arity
        self.gate = gate or StartupGate()
        self.states: dict[int, str] = {}
        self.incarnations: dict[int, int] = {}
        self.views: list[View] = [initial] if initial is not None else []
        self.round = 0
        self.now = self.gate.started_at

    # ------------------------------------------------------------------ inputs

    def on_status(self, status: Status, now: float) -> list[PublishView]:
        self.now = now
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
        self.views = self.views[-KEPT_VIEWS:]
        return True

    def round_started(self, round: int, now: float) -> list[PublishView]:
        """The node is at ``round``. Idempotent: call it again while waiting for the first
        view, the start-up gate may open by time alone."""
        self.round, self.now = round, now
        return self._coordinate()

    # ------------------------------------------------------------------ queries

    @property
    def newest(self) -> View:
        return self.views[-1]

    @property
    def latest(self) -> View | None:
        return self.views[-1] if self.views else None

    def live(self) -> list[int]:
        return sorted(n for n, s in self.states.items() if s in LIVE_STATES)

    def is_online(self, node: int) -> bool:
        return self.states.get(node) == "online"

    def online_peers(self, among: list[int] | tuple[int, ...]) -> list[int]:
        """The online nodes of ``among`` other than this one: who can serve the state."""
        return [n for n in among if n != self.node and self.is_online(n)]

    def knows_incarnation(self, node: int, incarnation: int) -> bool:
        return self.incarnations.get(node) == incarnation and node in self.states

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
        if not self.views:
            return self._first_view()
        # Absence of a status is not news (statuses trickle in at start-up): only an explicit
        # offline removes a member, only online/joining adds one.
        gone = {n for n, s in self.states.items() if s not in LIVE_STATES}
        live = sorted((set(self.newest.members) - gone) | set(self.live()))
        if list(self.newest.members) == live:
            return []
        start = max(self.round + LEAD_ROUNDS, self.newest.from_round + 1)
        return self._publish(live, self.newest.epoch + 1, start)

    def _first_view(self) -> list[PublishView]:
        live = self.live()
        if not self.gate.is_open(len(live), self.now):
            return []
        return self._publish(live, 1, self.round)

    def _publish(self, members: list[int], epoch: int, from_round: int) -> list[PublishView]:
        view = View(epoch=epoch, members=members, arity=self.arity, coordinator=self.node,
                    from_round=from_round)
        self.on_view(view)
        return [PublishView(view)]
