"""The broker-restart fault: its scenario entry, its plan, the report's verdict from the event
log, and the dashboard's incident for it (no broker, no processes)."""

from __future__ import annotations

from typing import Any

import pytest

from dashboard.records import apply_record
from dashboard.state import FleetState
from simulate import report
from simulate.injector import plan_mechanisms
from simulate.scenario import BrokerRestartFault, ScenarioError, load_scenario, parse_scenario
from tests.unit.simulate.test_report import _fault, _telemetry

NODES = 7


def _scenario(fault: str) -> str:
    return f'name = "t"\n[fleet]\nnodes = 7\nrounds = 40\n[[faults]]\nkind = "broker-restart"\n{fault}'


def test_outage_defaults_to_5_s_and_takes_30() -> None:
    default = parse_scenario(_scenario("at_round = 10\n")).faults[0]
    long = parse_scenario(_scenario("at_round = 10\noutage = 30.0\n")).faults[0]
    assert isinstance(default, BrokerRestartFault) and default.outage == 5.0
    assert isinstance(long, BrokerRestartFault) and long.outage == 30.0
    assert long.targets == () and long.end_round is None
    assert long.describe() == "broker restarted (30 s outage)"


@pytest.mark.parametrize(("entry", "message"), [
    ("at_round = 10\noutage = 0\n", "outage"),
    ("at_round = 10\noutage = -1.5\n", "outage"),
    ("at_round = 10\nheal_round = 12\n", "unknown key"),
    ("at_round = 10\nnode = 3\n", "unknown key"),
    ("at_round = 40\n", "past the end of the run"),
])
def test_bad_broker_restart_entries_say_what_to_fix(entry: str, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(_scenario(entry))


def test_the_shipped_scenario_restarts_the_broker_mid_run() -> None:
    scenario = load_scenario("broker-restart")
    (fault,) = scenario.faults
    assert isinstance(fault, BrokerRestartFault)
    assert 0 < fault.at_round < scenario.fleet.rounds - 10 and fault.outage == 5.0


def test_only_the_simulators_own_broker_is_restarted() -> None:
    fault = parse_scenario(_scenario("at_round = 10\n")).faults
    own = plan_mechanisms(fault, broker_can_revoke=True, broker_restartable=True)[0]
    foreign = plan_mechanisms(fault, broker_can_revoke=True, broker_restartable=False)[0]
    assert own.mechanism == "stop-start" and not own.skip
    assert "own mosquitto" in foreign.skip


def _restart_log(*, back: bool = True, hashes_after: tuple[str, ...] = ("same",) * NODES,
                 quiet: frozenset[int] = frozenset()) -> list[dict[str, Any]]:
    """20 rounds, 1 s apart; the broker stops at t=10.5 (round 10) and is back at t=12.2."""
    records: list[dict[str, Any]] = [_fault("plan", 0, "broker-restart", [], 0, 0.0)]
    for rnd in range(20):
        for node in range(NODES):
            if rnd >= 12 and node in quiet:
                continue
            h = hashes_after[node] if rnd == 12 else "same"
            records.append(_telemetry(node, rnd, model_hash=h) | {"t": 1.0 + rnd})
        if rnd == 10:
            records.append(_fault("inject", 0, "broker-restart", [], 10, 10.5))
            records.append({"type": "broker", "t": 10.5, "event": "stopped", "pid": 1})
        if rnd == 11 and back:
            records.append({"type": "broker", "t": 12.2, "event": "started", "pid": 2})
            records.append({"type": "view", "t": 12.3, "epoch": 2, "coordinator": 0,
                            "members": list(range(NODES)), "arity": 2, "from_round": 14})
    return sorted(records, key=lambda r: r["t"])


def test_a_restart_is_detected_by_the_agents_reporting_after_it() -> None:
    (fault,) = report.fault_outcomes(_restart_log(hashes_after=("a",) + ("b",) * 6))
    assert fault.status == "injected" and fault.detected
    assert "agents [0, 1, 2, 3, 4, 5, 6] reported rounds after it (from round 12)" in fault.evidence
    assert "one model and one view again from round 13 (1 rounds after)" in fault.evidence
    assert "epoch 2 coord 0" in fault.evidence


def test_a_broker_that_never_came_back_is_not_a_detected_restart() -> None:
    (fault,) = report.fault_outcomes(_restart_log(back=False))
    assert not fault.detected and "did not come back" in fault.evidence


def test_a_fleet_that_stays_split_is_said_so() -> None:
    recovery = report.broker_recovery(_restart_log(quiet=frozenset({5})), 10.5)
    assert recovery is not None
    assert recovery.reporting == (0, 1, 2, 3, 4, 6) and recovery.settled_round is None


def test_reports_queued_through_the_outage_are_not_rounds_after_it() -> None:
    """Agents publish a round's report reliably: those of rounds that ended before the broker
    was back arrive after it. With the broker's wall times they are told apart by their own."""
    def late(records: list[dict[str, Any]], wall: bool) -> list[dict[str, Any]]:
        out = []
        for r in records:
            r = dict(r)
            if r["type"] == "telemetry":
                r["wall_time"] = 1000.0 + r["t"]
                if r["round"] == 10:
                    r["t"] = 12.3  # ended at 11.0, delivered once the broker was back
            if r["type"] == "broker":
                r |= {"wall": 1000.0 + r["t"]} if wall else {}
            out.append(r)
        return sorted(out, key=lambda r: r["t"])
    log = _restart_log(hashes_after=("a",) + ("b",) * 6)
    with_wall = report.broker_recovery(late(log, wall=True), 10.5)
    without = report.broker_recovery(late(log, wall=False), 10.5)
    assert with_wall is not None and (with_wall.first_round, with_wall.settled_round) == (12, 13)
    assert without is not None and without.first_round == 10  # an old log: as it arrived


def test_agents_that_reconnect_but_never_train_again_are_detected_and_said_so() -> None:
    records = [r for r in _restart_log() if not (r["type"] == "telemetry" and r["t"] > 12.2)]
    records += [{"type": "status", "t": 12.4, "node": n, "state": "joining", "round": 11, "pid": n}
                for n in range(NODES)]
    records.append({"type": "status", "t": 12.5, "node": 9, "state": "offline", "round": 0})
    (fault,) = report.fault_outcomes(sorted(records, key=lambda r: r["t"]))
    assert fault.detected
    assert "agents [0, 1, 2, 3, 4, 5, 6] reconnected" in fault.evidence
    assert "no agent reported a round after it" in fault.evidence


def test_the_dashboard_opens_and_closes_an_incident_for_it() -> None:
    state = FleetState()
    state, _ = apply_record(state, _fault("inject", 0, "broker-restart", [], 10, 10.5)
                            | {"description": "broker restarted (5 s outage)"}, 10.5)
    assert [(i.kind, i.source) for i in state.incidents] == [("broker-restart", "injected")]
    assert state.incidents[0].active
    state, events = apply_record(state, _fault("heal", 0, "broker-restart", [], 12, 12.2), 12.2)
    assert not state.incidents[0].active
    assert [e.kind for e in events] == ["fault_healed"]


def test_the_summary_says_how_many_agents_the_identical_models_are_among() -> None:
    summary = report.summarize(_restart_log(quiet=frozenset({5, 6})))
    assert summary["models_identical_at_end"] and summary["last_round_reporters"] == NODES - 2
    assert "(among the 5 agents that reported the last round)" in report.render_markdown(summary, [])
