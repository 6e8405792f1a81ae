"""End to end: `edgegrove simulate` runs the thesis's 2-serial-faults scenario with 7 agents on
real mosquitto (link cuts by dynamic security), and on the embedded broker (agent-side cuts)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from simulate import report
from tests.integration.simulate_helpers import (
    FAST,
    env_without_mosquitto,
    pid_alive,
    read_events,
    run_simulate,
    started_pids,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _check_run(run_dir: Path, stdout: str, broker_kind: str, mechanism: str) -> dict:
    summary = json.loads(stdout)  # --json: exactly one JSON document on stdout
    assert summary == json.loads((run_dir / "summary.json").read_text())
    events = read_events(run_dir)
    assert any(e["type"] == "broker" and e["kind"] == broker_kind for e in events)
    # Reaches the end without a halt: every round is reported, every agent reaches the last one.
    # (An agent that fell two rounds behind fetches the fleet's state and skips the rounds in
    # between, so a round in the fault window may have fewer reporters.)
    assert summary["halted"] is False and summary["error"] is None
    assert summary["rounds"] == 15
    with open(run_dir / "rounds.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 15 and all(int(r["reporters"]) >= 4 for r in rows), rows
    assert int(rows[-1]["reporters"]) == 7 and int(rows[4]["reporters"]) == 7
    # The two serial link faults were injected the planned way, and both were detected.
    faults = summary["faults"]
    assert [f["mechanism"] for f in faults] == [mechanism, mechanism]
    assert summary["faults_injected"] == 2
    assert summary["faults_detected"] == summary["faults_injected"], faults
    # The report's numbers are the event log's numbers.
    recomputed = report.summarize(events, json.loads((run_dir / "config.json").read_text()))
    for key in ("rounds", "faults_injected", "faults_detected", "degraded_rounds", "final_test_accuracy",
                "round_time_median_s", "models_identical_at_end"):
        assert recomputed[key] == summary[key], key
    assert summary["final_test_accuracy"] is not None and summary["final_test_accuracy"] > 0.5
    assert summary["models_identical_at_end"] is True
    for png in ("round_time.png", "loss_accuracy.png", "bytes.png"):
        data = (run_dir / png).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 15_000, png
    assert "2 injected, 2 detected" in (run_dir / "report.md").read_text()
    assert not [p for p in started_pids(events) if pid_alive(p)]
    print(f"{broker_kind}: {json.dumps({k: v for k, v in summary.items() if k != 'faults'})}")
    return summary


def test_thesis_two_serial_faults_on_mosquitto(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = run_simulate("--scenario", "thesis-2-serial", "--nodes", "7", "--broker", "mosquitto",
                        "--out", str(run_dir), "--json", *FAST)
    assert done.returncode == 0, done.stderr[-3000:]
    _check_run(run_dir, done.stdout, "mosquitto", "broker-dynsec")


def test_thesis_two_serial_faults_on_the_embedded_broker(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = run_simulate("--scenario", "thesis-2-serial", "--broker", "auto", "--out", str(run_dir),
                        "--json", *FAST, env=env_without_mosquitto(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    _check_run(run_dir, done.stdout, "embedded", "agent-drop")
