"""The one way a driver executes an agent core's actions: a table from each action's type to
its handler, the same for the agent users run (agent/runtime.py) and the in-memory fleet
(simulate/virtual_fleet.py).

A driver implements ``Driver``: one method per effect it has (publish, compute a gradient,
apply an update, ...). Answering a state pull (``SendState``) or announcing our state's digest
(``AnnounceState``) is no effect of the driver's: the dispatcher builds those messages here from
the driver's current ``state()`` and publishes them, so every driver answers alike. A handler
may return actions that follow from it (a computed gradient's); they run after those queued.
The table covers every action of the closed union ``CoreAction`` (``ActionDispatcher`` says so
as it is built): a driver cannot drop one silently.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Protocol, TypeVar, get_args

import numpy as np

from agent.core.actions import (
    AnnounceState,
    ApplyControl,
    ApplyUpdate,
    ComputeGradient,
    CoreAction,
    Displaced,
    FleetFinished,
    LoadState,
    Publish,
    ReportRound,
    SaveCheckpoint,
    SendState,
)
from agent.core.agent_core import AgentCore
from agent.protocol.membership import Refusal

Follow = list[CoreAction] | None  # what a handler's effect leads to (None: nothing)


class Driver(Protocol):
    """The effects of one driver (its transport, its model, its files)."""

    def publish(self, message: Publish) -> None: ...

    def state(self) -> np.ndarray:
        """The current training state (the state at the start of the core's round)."""
        ...

    def compute(self, action: ComputeGradient) -> Follow: ...

    def apply_update(self, action: ApplyUpdate) -> None: ...

    def load_state(self, action: LoadState) -> None: ...

    def save_checkpoint(self, action: SaveCheckpoint) -> None: ...

    def apply_control(self, action: ApplyControl) -> Follow: ...

    def report_round(self, action: ReportRound) -> None: ...

    def displaced(self, action: Displaced) -> None: ...

    def refused(self, action: Refusal) -> None: ...

    def fleet_finished(self, action: FleetFinished) -> None: ...


A = TypeVar("A", bound=CoreAction)
Handler = Callable[[CoreAction], Follow]


def _entry(kind: type[A], handler: Callable[[A], Follow]) -> tuple[type[object], Handler]:
    def run(action: CoreAction) -> Follow:
        assert isinstance(action, kind), action
        return handler(action)
    return kind, run


class ActionDispatcher:
    def __init__(self, core: AgentCore, driver: Driver) -> None:
        self.core, self.driver = core, driver
        self.table: dict[type[object], Handler] = dict((
            _entry(Publish, driver.publish),
            _entry(SendState, self._send_state),
            _entry(AnnounceState, self._announce_state),
            _entry(ComputeGradient, driver.compute),
            _entry(ApplyUpdate, driver.apply_update),
            _entry(LoadState, driver.load_state),
            _entry(SaveCheckpoint, driver.save_checkpoint),
            _entry(ApplyControl, driver.apply_control),
            _entry(ReportRound, driver.report_round),
            _entry(Displaced, driver.displaced),
            _entry(Refusal, driver.refused),
            _entry(FleetFinished, driver.fleet_finished),
        ))
        missing = set(get_args(CoreAction)) - set(self.table)
        assert not missing, f"actions without a handler: {missing}"

    def run(self, actions: Iterable[CoreAction]) -> None:
        """Execute ``actions`` in order (and what follows from them, after them)."""
        queue = deque(actions)
        while queue:
            action = queue.popleft()
            queue.extend(self.table[type(action)](action) or ())

    def _send_state(self, action: SendState) -> None:
        for message in self.core.state_frames(action, self.driver.state()):
            self.driver.publish(message)

    def _announce_state(self, action: AnnounceState) -> None:
        if (message := self.core.announcement(action, self.driver.state())) is not None:
            self.driver.publish(message)
