"""When a scenario's faults fire and heal (simulate.fault_schedule), against a stand-in injector."""

from __future__ import annotations

from typing import Any

import pytest

from simulate import fault_schedule
from simulate.fault_schedule import FaultSchedule
from simulate.injector import Plan
from simulate.scenario import parse_scenario
from simulate.telemetry import EventLog, FleetWatch

SCENARIO = """
[fleet]
nodes = 4
rounds = 20
[[faults]]
kind = "crash"
node = 1
at_round = 3
restart_round = 6
[[faults]]
kind = "hang"
node = 2
at_round = 4
phase = "mid"
[[faults]]
kind = "link"
nodes = [0, 3]
at_round = 5
heal_round = 8
"""


class FakeInjector:
    def __init__(self) -> None:
        self.done: list[tuple[str, str]] = []
        self.fail: set[str] = set()

    def inject(self, fault: Any, plan: Plan) -> None:
        if fault.kind in self.fail:
            raise RuntimeError("no such process")
        self.done.append(("inject", fault.kind))

    def undo(self, fault: Any, plan: Plan) -> None:
        self.done.append(("undo", fault.kind))

    def finished(self, fault: Any) -> bool:
        return False


def schedule(plans: list[Plan] | None = None) -> tuple[FaultSchedule, list[dict[str, Any]]]:
    faults = list(parse_scenario(SCENARIO).faults)
    log = EventLog(None)
    said: list[dict[str, Any]] = []
    log.listeners.append(said.append)
    return FaultSchedule(faults, plans or [Plan("signal")] * len(faults), log, FleetWatch()), said


def test_faults_fire_at_their_round_and_heal_at_their_end() -> None:
    faults, _ = schedule()
    injector = FakeInjector()
    for fleet_round in range(3):
        faults.fire(fleet_round, injector)  # type: ignore[arg-type]
    assert injector.done == [] and faults.injected == 0
    faults.fire(3, injector)  # type: ignore[arg-type]
    assert injector.done == [("inject", "crash")]
    assert faults.restart_pending(rounds=20) and not faults.restart_pending(rounds=6)
    faults.fire(6, injector)  # type: ignore[arg-type]
    faults.fire(8, injector)  # type: ignore[arg-type]
    assert ("undo", "crash") in injector.done and ("undo", "link") in injector.done
    assert [s.state for s in faults.slots] == ["done", "armed", "done"]  # the hang: half a round on
    assert not faults.restart_pending(rounds=20)


def test_a_mid_round_fault_waits_half_a_median_round(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [50.0]
    monkeypatch.setattr(fault_schedule.time, "monotonic", lambda: clock[0])
    faults, _ = schedule()
    injector = FakeInjector()
    faults.fire(4, injector)  # type: ignore[arg-type]
    hang = faults.slots[1]
    assert hang.state == "armed" and ("inject", "hang") not in injector.done
    assert faults.next_wait() == pytest.approx(0.1)  # half of the 0.2 s taken without a median
    clock[0] += 0.1
    faults.fire(4, injector)  # type: ignore[arg-type]
    assert hang.state == "active" and ("inject", "hang") in injector.done


def test_a_planned_skip_and_a_failed_injection_are_skipped_and_said() -> None:
    faults, said = schedule([Plan("signal"), Plan("signal", skip="needs root"), Plan("proxy")])
    assert faults.slots[1].state == "skipped"
    injector = FakeInjector()
    injector.fail.add("link")
    faults.fire(5, injector)  # type: ignore[arg-type]
    assert [s.state for s in faults.slots] == ["active", "skipped", "skipped"]
    skips = [r for r in said if r.get("action") == "skip"]
    assert [(r["index"], r["detail"]) for r in skips] == [(1, "needs root"), (2, "no such process")]
