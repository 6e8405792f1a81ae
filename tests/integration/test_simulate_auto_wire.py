"""End to end: wire_dtype "auto" on real mosquitto. One agent's link is limited (the simulator's
bandwidth fault, its TCP proxy) from round 1: its frames and the fleet's result go narrow, the
other links stay float32, and every agent ends every round with the same model."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from simulate.report import parse_wire_frames
from tests.integration.simulate_helpers import FAST, read_events, run_simulate

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROUNDS = 8
SCENARIO = f"""
name = "auto-wire"
description = "wire_dtype auto, agent 3's link limited to 2 MB/s from round 1"

[fleet]
nodes = 5
rounds = {ROUNDS}

[agent]
wire_dtype = "auto"
eval_every = 0

[[faults]]
kind = "bandwidth"
node = 3
bytes_per_second = 2000000
at_round = 1
"""


def test_auto_wire_narrows_on_a_slow_link_and_the_models_stay_identical(tmp_path: Path) -> None:
    scenario, run_dir = tmp_path / "auto.toml", tmp_path / "run"
    scenario.write_text(SCENARIO)
    # Pinned to agents for now: through devices every link went int8 from round 1 (3 of 3 runs;
    # J3's report on issue 52); the runtime under test is the same in both.
    done = run_simulate("--via-agents", "--scenario", str(scenario), "--broker", "mosquitto", "--out", str(run_dir),
                        "--json", *FAST, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["halted"] is False and summary["error"] is None and summary["rounds"] == ROUNDS
    assert summary["models_identical_at_end"] is True
    with open(run_dir / "rounds.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == ROUNDS and all(int(r["reporters"]) == 5 for r in rows), rows
    assert all(int(r["distinct_hashes"]) == 1 for r in rows), [r["distinct_hashes"] for r in rows]
    used = [parse_wire_frames(r["wire_frames"]) for r in rows]
    print("wire frames by round:", used)
    assert set(used[0]) == {"float32"}  # nothing measured before round 0
    # Agent 3 measured its slow link in round 1 at the latest: narrow from round 3 on (its
    # frames up, and the result every agent passes on), wider still on the fast links: float32,
    # or float16 where a loaded host slows an agent's own downlink below 163 MB/s (wire_choice).
    for frames in used[3:]:
        assert frames.get("int8", 0) >= 2, used
        assert frames.get("float32", 0) + frames.get("float16", 0) >= 2, used
    by_agent = [e for e in read_events(run_dir) if e["type"] == "telemetry" and e["round"] == ROUNDS - 1]
    formats = {e["node"]: set(e["wire_frames"]) for e in by_agent if e["node"] in (3, 4)}
    assert formats[3] == {"int8"} and formats[4] and formats[4] <= {"float32", "float16"}, formats
