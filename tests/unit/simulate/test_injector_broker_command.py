"""The operator's broker restart from the dashboard: the simulator stops its own broker and
starts it again after the outage; with a broker not its own it says why not."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from agent.protocol.messages import Control
from simulate.fleet import AgentSpec, Fleet
from simulate.injector import Injector


class Broker:
    def __init__(self) -> None:
        self.pid: int | None = 4242
        self.calls: list[str] = []
        self.started = threading.Event()

    def stop(self) -> None:
        self.calls.append("stop")
        self.pid = None

    def start(self) -> None:
        self.calls.append("start")
        self.pid = 4343
        self.started.set()


def injector(tmp_path: Path, broker: Broker | None, records: list[tuple[str, dict[str, Any]]]) -> Injector:
    specs = [AgentSpec(n, "mqtt://127.0.0.1:1", {}, tmp_path / str(n), tmp_path / f"{n}.log") for n in range(3)]
    return Injector(Fleet(specs), lambda _c: None, lambda kind, **data: records.append((kind, data)),
                    restartable=broker)


def test_the_operators_broker_restart_stops_the_broker_and_starts_it_again(tmp_path: Path) -> None:
    broker, records = Broker(), []
    sim = injector(tmp_path, broker, records)
    try:
        assert sim.obey(Control("broker_restart", 0, value=0.05)) == "applied: broker stopped, back in 0.05 s"
        assert broker.started.wait(10)
        assert broker.calls == ["stop", "start"]
        assert [(kind, data["event"]) for kind, data in records] == [("broker", "stopped"), ("broker", "started")]
    finally:
        sim.close()


def test_a_broker_not_the_simulators_own_or_down_already_is_not_restarted(tmp_path: Path) -> None:
    records: list[tuple[str, dict[str, Any]]] = []
    assert injector(tmp_path, None, records).obey(Control("broker_restart", 0, value=3.0)).startswith(
        "ignored: the broker is not the simulator's own")
    down = Broker()
    down.pid = None
    assert injector(tmp_path, down, records).obey(Control("broker_restart", 0, value=3.0)) == (
        "ignored: the broker is down already (a restart is under way)")
    assert injector(tmp_path, Broker(), records).obey(Control("broker_restart", 0)).startswith(
        "ignored: a broker restart needs its outage")
    assert records == []
