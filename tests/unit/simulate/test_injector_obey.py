"""The simulator's answer to the dashboard's fault controls: applied, or ignored and why."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.protocol.messages import Control
from simulate.fleet import AgentSpec, Fleet
from simulate.injector import Injector


@pytest.fixture
def injector(tmp_path: Path) -> Injector:
    specs = [AgentSpec(n, "mqtt://127.0.0.1:1", {}, tmp_path / str(n), tmp_path / f"{n}.log")
             for n in range(3)]
    published: list[Control] = []
    return Injector(Fleet(specs), published.append, lambda *_a, **_k: None)


@pytest.mark.parametrize(("control", "outcome"), [
    (Control("crash", 9), "ignored: node 9 is not in this fleet (nodes 0-2)"),
    (Control("cut", 1, peer=7), "ignored: peer 7 is not in this fleet (nodes 0-2)"),
    (Control("cut", 1, peer=1), "ignored: a link needs two different nodes, not 1->1"),
    (Control("crash", 1), "ignored: node 1 is not running"),  # none was started here
    (Control("hang", 2), "ignored: node 2 is not running"),
    (Control("resume", 2), "ignored: node 2 is not hung"),
    (Control("isolate", 0), "ignored: isolation needs the node in a network namespace "
                            "(root, and an isolate fault)"),
    (Control("loss", 1, value=0.1), "applied: loss node 1, by the agents themselves"),
    (Control("cut", 0, peer=2), "applied: cut link 0->2, by the agents themselves"),
])
def test_obey_says_what_it_did_or_why_not(injector: Injector, control: Control, outcome: str) -> None:
    assert injector.obey(control) == outcome
