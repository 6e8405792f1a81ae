"""Issue 17: a scenario restarts the simulator's own mosquitto (outage 5 s) mid-run, with and
without persistence: the broker is stopped and started again on the same port, every agent
reconnects, the report says so, and the fleet trains to its last round with one view and one
model again within a few rounds (the agents hold their views while the broker is away and
until the statuses it lost come back)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from simulate.report import broker_recovery
from tests.integration.simulate_helpers import FAST, pid_alive, read_events, run_simulate

pytestmark = pytest.mark.integration

ROUNDS, AT_ROUND, OUTAGE = 30, 10, 5.0
SCENARIO = f"""name = "broker-restart-5s"
[fleet]
nodes = 7
rounds = {ROUNDS}
[agent]
eval_every = 0
[[faults]]
kind = "broker-restart"
at_round = {AT_ROUND}
outage = {OUTAGE}
"""

Run = tuple[int, dict[str, Any], list[dict[str, Any]]]


@pytest.fixture(scope="module", params=[True, False], ids=["persistence", "no-persistence"])
def restart_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    tmp = tmp_path_factory.mktemp("broker-restart")
    scenario = tmp / "scenario.toml"
    scenario.write_text(SCENARIO)
    flags = [] if request.param else ["--no-persistence"]
    # Pinned to agents for now: through devices the resync after the restart took 2.1-3.3 s
    # (4 of 4 runs; J3's report on issue 52); the runtime under test is the same in both.
    done = run_simulate("--via-agents", "--scenario", str(scenario), "--broker", "mosquitto", "--out",
                        str(tmp / "run"), "--json", *flags, *FAST)
    assert done.stdout, done.stderr[-3000:]
    return done.returncode, json.loads(done.stdout), read_events(tmp / "run")


def _broker(events: list[dict[str, Any]], event: str) -> dict[str, Any]:
    found = [e for e in events if e["type"] == "broker" and e.get("event") == event]
    assert len(found) == 1, f"broker {event}: {found}"
    return found[0]


def test_the_broker_is_restarted_on_its_port_and_every_agent_reconnects(restart_run: Run) -> None:
    _, summary, events = restart_run
    (fault,) = summary["faults"]
    assert fault["kind"] == "broker-restart" and fault["status"] == "injected"
    assert fault["at_round"] >= AT_ROUND and fault["end_round"] is not None
    stopped, started = _broker(events, "stopped"), _broker(events, "started")
    assert started["t"] - stopped["t"] >= OUTAGE and started["pid"] != stopped["pid"]
    assert not pid_alive(stopped["pid"]) and not pid_alive(started["pid"])
    born = {e["node"] for e in events if e["type"] == "status" and e["t"] > started["t"]
            and e["state"] != "offline"}
    assert born == set(range(7)), f"agents that re-published their status: {sorted(born)}"
    assert fault["detected"] and "agents [0, 1, 2, 3, 4, 5, 6] reconnected" in fault["evidence"]


def test_the_fleet_trains_to_its_last_round_with_one_model(restart_run: Run) -> None:
    code, summary, events = restart_run
    assert code == 0 and summary["rounds"] == ROUNDS and not summary["halted"]
    assert summary["models_identical_at_end"] and summary["last_round_reporters"] == 7
    recovery = broker_recovery(events, _broker(events, "stopped")["t"])
    assert recovery is not None and recovery.reporting == tuple(range(7))
    assert recovery.settled_round is not None and recovery.first_round is not None
    # Every member drifts in the round the broker died in (the root applied its own gradient,
    # the others nothing or their own) and resyncs from the coordinator in pairs: those paired
    # with a peer that drifted too take turns: 4-7 rounds, under a second on a quiet host, ~2.5 s
    # beside a fleet (the resyncs' asks are padded against amplification). Seconds are the
    # benchmark's to measure; here only that it takes less than the outage did.
    assert recovery.settled_round - recovery.first_round <= 8
    assert _first_report(events, recovery.settled_round) - _first_report(events, recovery.first_round) < OUTAGE


def _first_report(events: list[dict[str, Any]], round: int) -> float:
    return min(e["t"] for e in events if e["type"] == "telemetry" and e["round"] == round)
