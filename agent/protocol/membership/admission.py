"""Joining and admission: one model per fleet, and members that come back as a new life.

Every status names the agent's model (``ModelIdentity``: fingerprint, name, parameter count)
and the coordinator's view names the fleet's, its own. The coordinator never admits a node
whose fingerprint differs (``admits``): it is not live for views. A node whose model differs
from the view it would take is *refused* (``refusal``): it takes no view and the driver stops
it. Its frames cannot reach the fleet either: the frames' job hash mixes in the fingerprint
(wire.job_hash), so they are rejected as a foreign job. A member of the newest view that
restarted before its Will removed it (a new incarnation) has no state: it joins again.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.protocol.messages import Status, View


@dataclass(frozen=True)
class ModelIdentity:
    """The model an agent trains, as it announces it: ``fingerprint`` (16 hex, over shapes,
    parameter count and initial weights), ``name`` and ``params``; "" when unknown."""

    fingerprint: str = ""
    name: str = ""
    params: int = 0

    @classmethod
    def of_status(cls, status: Status) -> ModelIdentity:
        return cls(status.fingerprint, status.model, status.params)

    @classmethod
    def of_view(cls, view: View) -> ModelIdentity:
        return cls(view.fingerprint, view.model, view.params)

    def describe(self) -> str:
        return f"model {self.name or '?'}, {self.params:,} params"


@dataclass(frozen=True)
class Refusal:
    """This agent's model is not the fleet's: it must not take part (and says why, once)."""

    own: ModelIdentity
    fleet: ModelIdentity
    coordinator: int

    def line(self) -> str:
        return (f"refused: this agent's model fingerprint {self.own.fingerprint or '(none)'} differs "
                f"from the fleet's {self.fleet.fingerprint} ({self.own.describe()} vs "
                f"{self.fleet.describe()}, coordinator node {self.coordinator}); every agent of a "
                f"job must run the same model")


def admits(fleet: ModelIdentity, status: Status) -> bool:
    """Whether a coordinator whose model is ``fleet`` takes the node of ``status`` into its
    views: same fingerprint (a coordinator that does not know its own admits everybody)."""
    return not fleet.fingerprint or status.fingerprint == fleet.fingerprint


def refusal(own: ModelIdentity, view: View, coordinator_model: str | None) -> Refusal | None:
    """The refusal of an agent with model ``own`` by ``view``, whose coordinator's latest live
    status names ``coordinator_model`` (None: not heard). None when the agent may take part:
    same fingerprint, a view that names none, or a view its coordinator no longer stands for
    (a retained view of an earlier run of the job, with another model)."""
    if not view.fingerprint or view.fingerprint == own.fingerprint or coordinator_model != view.fingerprint:
        return None
    return Refusal(own, ModelIdentity.of_view(view), view.coordinator)


class Admission:
    """Which nodes and views run our model, and which members came back as a new life."""

    def __init__(self, identity: ModelIdentity | None = None) -> None:
        self.identity = identity or ModelIdentity()
        self.foreign: set[int] = set()  # live nodes whose model is not ours: never admitted
        self.models: dict[int, str] = {}  # node -> the fingerprint its latest live status names
        self.refused: Refusal | None = None  # the fleet's view names another model than ours
        self.unconfirmed: View | None = None  # a view of another model, its coordinator unheard
        self.new_lives: set[int] = set()  # members restarted before their Will removed them

    def heard(self, status: Status) -> View | None:
        """A status of a life we follow: its model. Returns the view held for its coordinator
        (``unconfirmed``) when this is that coordinator: to be offered again now."""
        if status.state == "offline":
            self.models.pop(status.node, None)
        else:
            self.models[status.node] = status.fingerprint
        if status.state == "offline" or admits(self.identity, status):
            self.foreign.discard(status.node)  # a new life may run another model
        else:
            self.foreign.add(status.node)
        if self.unconfirmed is not None and self.unconfirmed.coordinator == status.node:
            view, self.unconfirmed = self.unconfirmed, None
            return view  # now we know whether its coordinator stands for its model
        return None

    def new_life(self, status: Status, known_incarnation: int | None, members: list[int]) -> None:
        """A member of the newest view (``members``) restarted (a new incarnation) before its
        Will removed it: it has no state and waits for a view to join, which no membership
        change would bring."""
        known = status.incarnation if known_incarnation is None else known_incarnation
        if status.state != "offline" and status.node in members and status.incarnation > known:
            self.new_lives.add(status.node)

    def takes(self, view: View) -> bool:
        """Whether ``view`` runs our model; one of another model is never kept: we are refused
        once its coordinator is heard running that model (held until then)."""
        if not view.fingerprint or view.fingerprint == self.identity.fingerprint:
            return True
        coordinator_model = self.models.get(view.coordinator)
        why = refusal(self.identity, view, coordinator_model)
        if why is not None:
            self.refused = self.refused or why
        elif coordinator_model is None:
            self.unconfirmed = view
        return False
