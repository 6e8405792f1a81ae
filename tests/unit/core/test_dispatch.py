"""One dispatcher for both drivers (agent/core/dispatch.py): every action of the core's union
has a handler, a state pull and a state announcement are answered from the driver's state by
the dispatcher itself, what a handler returns runs after what was queued, and the in-memory
fleet handles every action the agent does (a refusal too)."""

from __future__ import annotations

from typing import get_args

import numpy as np
import pytest

from agent.core import AgentCore, CoreConfig
from agent.core.actions import (
    AnnounceState,
    ApplyControl,
    ApplyUpdate,
    Channel,
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
from agent.core.dispatch import ActionDispatcher, Follow
from agent.core.events import StatusSeen
from agent.protocol.allreduce import AllreduceConfig
from agent.protocol.membership import ModelIdentity, Refusal
from agent.protocol.messages import Status
from agent.protocol.wire import Frame, Kind
from simulate.virtual_fleet import FleetConfig, SimAgent, VirtualFleet

CONFIG = CoreConfig(node=1, allreduce=AllreduceConfig(chunk_size=4), state_size=10, state_chunk_values=4)


class Recorder:
    """A driver that records each effect it is asked for."""

    def __init__(self, follow: list[CoreAction] | None = None) -> None:
        self.done: list[object] = []
        self.follow = follow

    def publish(self, message: Publish) -> None:
        self.done.append(message)

    def state(self) -> np.ndarray:
        return np.arange(10, dtype=np.float32)

    def compute(self, action: ComputeGradient) -> Follow:
        self.done.append(action)
        return self.follow

    def apply_update(self, action: ApplyUpdate) -> None:
        self.done.append(action)

    def load_state(self, action: LoadState) -> None:
        self.done.append(action)

    def save_checkpoint(self, action: SaveCheckpoint) -> None:
        self.done.append(action)

    def apply_control(self, action: ApplyControl) -> Follow:
        self.done.append(action)
        return None

    def report_round(self, action: ReportRound) -> None:
        self.done.append(action)

    def displaced(self, action: Displaced) -> None:
        self.done.append(action)

    def refused(self, action: Refusal) -> None:
        self.done.append(action)

    def fleet_finished(self, action: FleetFinished) -> None:
        self.done.append(action)


def test_every_action_of_the_union_has_a_handler() -> None:
    dispatcher = ActionDispatcher(AgentCore(CONFIG, 1), Recorder())
    assert set(dispatcher.table) == set(get_args(CoreAction))
    assert len(dispatcher.table) == 12


def test_a_state_pull_and_an_announcement_are_answered_from_the_drivers_state() -> None:
    driver = Recorder()
    pull = Frame(Kind.MODEL_PULL, CONFIG.allreduce.job, 0, 2, 0, 1)
    ActionDispatcher(AgentCore(CONFIG, 1), driver).run([SendState(pull, 0), AnnounceState(0), AnnounceState(0)])
    frames = [p for p in driver.done if isinstance(p, Publish) and p.channel is Channel.LINK]
    digests = [p for p in driver.done if isinstance(p, Publish) and p.channel is Channel.STATE]
    assert len(frames) == 3 and {p.dst for p in frames} == {2}  # 10 values, chunks of 4
    assert np.frombuffer(b"".join(p.frame.payload for p in frames), np.float32).tolist() == list(range(10))
    assert len(digests) == 1  # a round's digest is announced once
    assert not [a for a in driver.done if isinstance(a, SendState | AnnounceState)]  # never the driver's


def test_what_a_handler_returns_runs_after_what_was_queued() -> None:
    later = ApplyUpdate(0, np.zeros(2), 0.1)
    driver = Recorder(follow=[later])
    compute, load = ComputeGradient(0, (0, 1)), LoadState(0, np.zeros(2))
    ActionDispatcher(AgentCore(CONFIG, 1), driver).run([compute, load])
    assert driver.done == [compute, load, later]


def _sim_agent() -> tuple[VirtualFleet, SimAgent]:
    fleet = VirtualFleet(FleetConfig(nodes=3, rounds=1, length=10))
    return fleet, SimAgent(fleet, 1, 0, fleet.initial_state.copy())


@pytest.mark.parametrize("action", [
    Refusal(ModelIdentity("a" * 16), ModelIdentity("b" * 16), 0),
    FleetFinished(5, (0, 2), 3),
])
def test_the_in_memory_fleet_says_why_an_agent_stops(action: Refusal | FleetFinished) -> None:
    fleet, agent = _sim_agent()
    agent.execute([action])
    assert fleet.finished_lines[1][1] == action.line()


def test_the_in_memory_fleet_stops_on_a_second_life_of_a_node() -> None:
    _, agent = _sim_agent()
    with pytest.raises(RuntimeError, match="displaced"):
        agent.execute(agent.core.handle(StatusSeen(Status(1, "online", incarnation=9)), 0.0))
