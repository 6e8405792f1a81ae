"""`edgegrove simulate --tls`: the simulator's own mosquitto with TLS and dynamic security.
The agents, the telemetry collector and the dashboard verify the broker with the run's
throw-away CA, and a link cut goes through the dynamic-security admin over TLS."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulate.brokers import mosquitto_available
from tests.integration.simulate_helpers import read_events, run_simulate

pytestmark = pytest.mark.integration

# Twelve rounds after the heal, so the fleet is whole again well before the end.
ROUNDS = 20

SCENARIO = f"""name = "tls-link"
[fleet]
nodes = 4
rounds = {ROUNDS}
[agent]
timeout_mode = "fixed"
timeout = 0.5
eval_every = 0
[[faults]]
kind = "link"
nodes = [1, 3]
at_round = 4
heal_round = 8
"""


def test_simulate_with_tls_and_dynamic_security_runs_and_cuts_links(tmp_path: Path) -> None:
    if not mosquitto_available():
        pytest.fail("mosquitto is not installed: run scripts/setup.sh --dev")
    scenario = tmp_path / "tls-link.toml"
    scenario.write_text(SCENARIO)
    run_dir = tmp_path / "run"
    done = run_simulate("--tls", "--broker", "mosquitto", "--scenario", str(scenario), "--out", str(run_dir),
                        "--json", "--dashboard-port", "0", "--baseline", "none",
                        "--agent-option", "eval_samples=1000", "--agent-option", "join_grace=60",
                        "--stall-timeout", "60")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["rounds"] == ROUNDS and not summary["halted"] and summary["error"] is None
    assert [(f["mechanism"], f["status"]) for f in summary["faults"]] == [("broker-dynsec", "injected")]
    events = read_events(run_dir)
    broker = [e for e in events if e["type"] == "broker"]
    assert broker and broker[0]["url"].startswith("mqtts://") and broker[0]["tls"] is True, broker
    # The collector read every agent's telemetry over TLS after the heal, and the last round's.
    # Under load the TLS connections drop and an agent may catch up past the last round by the
    # fleet's state (by design, without a report of the rounds it skipped), so the last round
    # is asked of the fleet, not of every agent.
    telemetry = [e for e in events if e["type"] == "telemetry"]
    assert {e["node"] for e in telemetry if e["round"] >= 8} == set(range(4)), telemetry[-8:]
    assert any(e["round"] == ROUNDS - 1 for e in telemetry)
    assert summary["models_identical_at_end"] is True
    # The dashboard followed the fleet through the same TLS broker: every agent's status and
    # the coordinator's view (the simulator's own feed gives it neither).
    seen = [json.loads(line) for line in (run_dir / "dashboard-events.jsonl").read_text().splitlines()]
    assert {e["node"] for e in seen if e["kind"] == "join"} == set(range(4)), seen[:10]
    assert any(e["kind"] == "view_change" for e in seen), seen[:10]
