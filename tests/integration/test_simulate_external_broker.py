"""Issue 17: the user's own broker. `edgegrove broker --job ext` then `edgegrove simulate
--broker mqtt://... --credentials <its credentials.json>` runs job ext, cuts a link through the
broker's dynamic security with the admin credentials, and ends with exit 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from simulate.brokers import free_port, mosquitto_available
from tests.integration.simulate_helpers import FAST, read_events, run_simulate

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration

SCENARIO = """name = "ext-links"
[fleet]
nodes = 7
rounds = 16
[agent]
timeout_mode = "fixed"
timeout = 0.5
eval_every = 0
[[faults]]
kind = "link"
nodes = [1, 3]
at_round = 4
heal_round = 8
[[faults]]
kind = "link"
nodes = [2, 6]
at_round = 9
heal_round = 12
"""


@pytest.fixture
def ext_broker(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """`edgegrove broker --job ext` on a free port, stopped by its handle (SIGTERM)."""
    if not mosquitto_available():
        pytest.fail("mosquitto is not installed: run scripts/setup.sh --dev")
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgegrove.cli", "broker", "--kind", "mosquitto", "--job", "ext",
         "--nodes", "7", "--port", str(free_port()), "--workdir", str(tmp_path / "broker"),
         "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once mosquitto runs
        assert line, "edgegrove broker exited before printing its address"
        yield json.loads(line)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_simulate_on_the_users_broker_takes_its_job_and_cuts_links_through_dynsec(
        ext_broker: dict[str, Any], tmp_path: Path) -> None:
    assert ext_broker["job"] == "ext" and ext_broker["dynsec"] is True
    scenario = tmp_path / "ext-links.toml"
    scenario.write_text(SCENARIO)
    run_dir = tmp_path / "run"
    done = run_simulate("--broker", ext_broker["url"], "--credentials", ext_broker["credentials"],
                        "--scenario", str(scenario), "--out", str(run_dir), "--json", *FAST)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"simulate: job ext (from --credentials {ext_broker['credentials']})" in done.stderr
    summary = json.loads(done.stdout)
    assert summary["rounds"] == 16 and not summary["halted"] and summary["error"] is None
    faults = summary["faults"]
    assert [f["mechanism"] for f in faults] == ["broker-dynsec", "broker-dynsec"]
    assert all(f["status"] == "injected" and f["end_round"] is not None for f in faults), faults
    events = read_events(run_dir)
    assert {e["job"] for e in events if e["type"] == "run" and e.get("phase") == "start"} == {"ext"}
    assert {e["node"] for e in events if e["type"] == "telemetry" and e["round"] == 15} == set(range(7))
