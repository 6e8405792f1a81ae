"""End to end on real mosquitto: `--sync-every auto`. The fleet starts at one local step per
round; the coordinator measures, picks the period and publishes it in the view; every member
takes it from the same round, and after every sync all members hold the same model."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from agent.protocol.sync_period import AUTO_START, MAX_SYNC_EVERY
from tests.integration.simulate_helpers import FAST, read_events, run_simulate

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NODES, ROUNDS = 5, 30
QUIET = f"""name = "sync-auto"
description = "No faults: periodic averaging whose period the coordinator picks."
[fleet]
nodes = {NODES}
rounds = {ROUNDS}
[agent]
eval_every = 10
"""


def test_sync_every_auto_changes_the_period_at_one_round_and_the_members_agree(tmp_path: Path) -> None:
    scenario = tmp_path / "sync-auto.toml"
    scenario.write_text(QUIET)
    run_dir = tmp_path / "run"
    done = run_simulate("--scenario", str(scenario), "--sync-every", "auto", "--comm-share", "0.2",
                        "--broker", "mosquitto", "--out", str(run_dir), "--json", *FAST, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["halted"] is False and summary["models_identical_at_end"] is True
    telemetry = [e for e in read_events(run_dir) if e["type"] == "telemetry"]
    steps: dict[int, set[int]] = defaultdict(set)
    hashes: dict[int, dict[int, str]] = defaultdict(dict)
    for e in telemetry:
        steps[e["round"]].add(e["local_steps"])
        hashes[e["round"]][e["node"]] = e["model_hash"]
    per_round = {r: s for r, s in sorted(steps.items())}
    assert all(len(s) == 1 for s in per_round.values()), per_round  # one period per round, fleet-wide
    period = [s.pop() for s in per_round.values()]
    assert period[0] == AUTO_START, period
    changed = [i for i in range(1, len(period)) if period[i] != period[i - 1]]
    assert changed, f"the period never left its start: {period}"
    assert AUTO_START < period[-1] <= MAX_SYNC_EVERY
    for rnd, by_node in hashes.items():  # the model each member holds after the round's sync
        assert len(by_node) == NODES and len(set(by_node.values())) == 1, (rnd, by_node)
    notes = [ev for e in telemetry for ev in e["events"] if ev["kind"] == "sync_period"]
    assert notes and all("local steps" in n["detail"] for n in notes)
    print(f"sync-every auto, {NODES} agents on loopback: local steps per round {period}; {notes[0]['detail']}")
