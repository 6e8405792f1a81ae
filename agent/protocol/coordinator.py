"""Who is in the tree: the view, decided by the lowest live id (pure).

Every agent runs a ``ViewKeeper``; it tracks the retained statuses (the broker's Last Will
turns a crash into ``offline``) and the retained view. Only the coordinator, the lowest id
that is online, ever proposes a view; the others just adopt what it publishes, each at the
start of the view's ``from_round``, so all members switch trees at the same round.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.protocol.messages import Status, View

# Rounds between publishing a view and using it: enough for every member to receive it
# before it starts that round, even one that lags a round behind the coordinator.
VIEW_LEAD_ROUNDS = 2


@dataclass
class ViewKeeper:
    node: int
    arity: int
    expected_members: int
    join_grace: float
    started_at: float
    statuses: dict[int, str] = field(default_factory=dict)
    latest: View | None = None
    active: View | None = None
    _proposed: tuple[int, ...] | None = None

    def on_status(self, status: Status) -> None:
        self.statuses[status.node] = status.state

    def on_view(self, view: View) -> None:
        if self.latest is None or view.epoch > self.latest.epoch:
            self.latest = view

    def live(self) -> tuple[int, ...]:
        return tuple(sorted(n for n, s in self.statuses.items() if s in ("online", "joining")))

    def coordinator(self) -> int | None:
        live = self.live()
        return live[0] if live else None

    def propose(self, now: float, current_round: int) -> View | None:
        """The view to publish now, if this node coordinates and membership changed."""
        live = self.live()
        if not live or live[0] != self.node or self.node not in live:
            return None
        if self.latest is None:
            waited = now - self.started_at
            if len(live) < self.expected_members and waited < self.join_grace:
                return None
            return self._make(live, epoch=1, from_round=current_round)
        if tuple(self.latest.members) == live or self._proposed == live:
            return None
        return self._make(live, self.latest.epoch + 1, current_round + VIEW_LEAD_ROUNDS)

    def _make(self, members: tuple[int, ...], epoch: int, from_round: int) -> View:
        self._proposed = members
        view = View(epoch=epoch, members=list(members), arity=self.arity,
                    coordinator=self.node, from_round=from_round)
        self.on_view(view)
        return view

    def view_for(self, round: int) -> View | None:
        """Adopt the latest view once its round has come; until then keep the active one."""
        if self.latest is not None and self.latest.from_round <= round:
            self.active = self.latest
        return self.active
