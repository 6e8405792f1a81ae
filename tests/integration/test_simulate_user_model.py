"""End to end: `edgegrove simulate` with the user's model and data. Five agents train the
digits example (examples/digits/model.py, the Python path) on scikit-learn's digits, split
Dirichlet(0.5): every agent reports its shard's labels (the report's table and labels.png),
the report names the fleet's model, and the models stay identical."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from tests.integration.simulate_helpers import FAST, read_events, run_simulate

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
NODES, ROUNDS = 5, 30
SCENARIO = f"""
name = "user-model"
description = "no faults: the digits example on a Dirichlet split"

[fleet]
nodes = {NODES}
rounds = {ROUNDS}

[agent]
eval_every = 10
lr = 0.01
"""


def test_the_digits_example_on_a_dirichlet_split_reports_every_agents_labels(tmp_path: Path) -> None:
    scenario, run_dir = tmp_path / "user-model.toml", tmp_path / "run"
    scenario.write_text(SCENARIO)
    done = run_simulate("--scenario", str(scenario), "--broker", "mosquitto", "--out", str(run_dir),
                        "--model", str(ROOT / "examples/digits/model.py:factory"), "--dataset", "digits",
                        "--partition", "dirichlet:0.5", "--json", *FAST, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["halted"] is False and summary["error"] is None and summary["rounds"] == ROUNDS
    assert summary["models_identical_at_end"] is True
    assert summary["model"]["name"] == "digits-mlp" and len(summary["model"]["fingerprint"]) == 16
    assert summary["refused_members"] == []
    assert summary["setup"]["partition"] == "dirichlet:0.5" and summary["setup"]["dataset"] == "digits"
    histograms = summary["label_histograms"]
    assert sorted(histograms, key=int) == [str(n) for n in range(NODES)]
    assert all(len(h) == 10 for h in histograms.values())
    # Dirichlet(0.5): the agents' shards differ in size and in which labels they hold.
    assert len({sum(h) for h in histograms.values()}) > 1
    assert len({h.index(max(h)) for h in histograms.values()}) > 1
    assert (run_dir / "labels.png").stat().st_size > 10_000
    md = (run_dir / "report.md").read_text()
    assert "| node | samples | 0 | 1 |" in md and "![labels.png](labels.png)" in md
    assert summary["final_test_accuracy"] is not None and summary["final_test_accuracy"] > 0.5, summary
    # One job told every device the same model, data and partition (and no baseline was attempted).
    spawns = [e for e in read_events(run_dir) if e["type"] == "process" and e.get("event") == "spawn"]
    assert len(spawns) == NODES
    job = tomllib.loads((run_dir / "job.toml").read_text())
    assert (job["partition"], job["data"]) == ("dirichlet:0.5", "digits")
    assert job["model"] == f"{ROOT / 'examples/digits/model.py'}:factory"
    assert all(states[-1] == "succeeded" for states in summary["via_devices"]["devices"].values())
