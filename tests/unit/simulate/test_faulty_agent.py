"""The simulator's agent: `edgegrove agent` with its transport wrapped in the fault injector."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import agent.runtime
from agent.config import AgentConfig
from agent.protocol.messages import Control
from agent.protocol.topics import Topics
from agent.runtime import TransportWrapper
from simulate import faulty_agent
from simulate.faults import FaultyTransport
from simulate.fleet import AgentSpec
from tests.unit.simulate.test_faults import FakeClock, FakeInner


def _started_with(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> tuple[AgentConfig, TransportWrapper | None]:
    seen: list[tuple[AgentConfig, TransportWrapper | None]] = []

    def fake_run_agent(config: AgentConfig, wrap_transport: TransportWrapper | None = None) -> int:
        seen.append((config, wrap_transport))
        return 0

    monkeypatch.setattr(agent.runtime, "run_agent", fake_run_agent)
    assert faulty_agent.main(argv) == 0
    assert len(seen) == 1
    return seen[0]


def test_the_agents_transport_is_wrapped_in_the_fault_injector_of_its_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config, wrap = _started_with(monkeypatch, ["--id", "3", "--job", "j"])
    assert config.id == 3 and wrap is not None
    inner = FakeInner(FakeClock())
    transport = wrap(inner, config)
    assert isinstance(transport, FaultyTransport) and transport.inner is inner
    assert transport.apply_control(Control("cut", 3, peer=1))
    assert not transport.apply_control(Control("cut", 4, peer=1))  # another node's command
    topics = Topics("j")
    transport.publish(topics.link(3, 1), b"x")
    transport.publish(topics.link(3, 2), b"y")
    assert [m.topic for m in inner.published] == [topics.link(3, 2)]


def test_the_device_agent_runs_without_a_wrapper(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.commands import agent as device_agent

    seen: list[TransportWrapper | None] = []
    monkeypatch.setattr(agent.runtime, "run_agent", lambda config, wrap=None: seen.append(wrap) or 0)
    assert device_agent.main(["--id", "0"]) == 0
    assert seen == [None]


def test_the_fleet_launcher_starts_the_faulty_agent(tmp_path: Path) -> None:
    spec = AgentSpec(2, "mqtt://127.0.0.1:1", {"rounds": 3}, tmp_path / "ckpt", tmp_path / "log")
    command = spec.command()
    assert command[:3] == [sys.executable, "-m", "simulate.faulty_agent"]
    assert command[3:5] == ["--id", "2"] and command[-2:] == ["--rounds", "3"]
