"""End to end: `edgegrove simulate --via-devices` — one device process per node, the scenario
submitted as a job through `job submit`'s path, a link cut and a crash-and-reboot of a device
mid-job, the trained model fetched into the run directory, scored by `edgegrove model evaluate`
as the fleet scored it, and its `.tflite` run on ai-edge-litert alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from simulate import brokers
from tests.integration.simulate_helpers import (
    FAST,
    env_without_mosquitto,
    pid_alive,
    read_events,
    run_simulate,
    started_pids,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCENARIO = """
name = "devices-faults"
[fleet]
nodes = 4
rounds = 20
[agent]
eval_every = 5
checkpoint_every = 2
[[faults]]
kind = "link"
nodes = [0, 1]
at_round = 4
heal_round = 8
[[faults]]
kind = "crash"
node = 2
at_round = 6
restart_round = 10
"""


def _evaluate(model: Path, *extra: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "edgegrove.cli", "model", "evaluate", str(model),
                           "--dataset", "mnist", "--json", *extra],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _run(tmp_path: Path, broker: str, env: dict[str, str] | None = None) -> tuple[Path, dict[str, Any]]:
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(SCENARIO)
    run_dir = tmp_path / "run"
    done = run_simulate("--via-devices", "--scenario", str(scenario), "--broker", broker,
                        "--out", str(run_dir), "--json", *FAST, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary == json.loads((run_dir / "summary.json").read_text())
    return run_dir, summary


def _check_devices_and_model(run_dir: Path, summary: dict[str, Any]) -> None:
    assert summary["halted"] is False and summary["error"] is None and summary["rounds"] == 20
    assert summary["faults_injected"] == 2 and summary["faults_detected"] == 2, summary["faults"]
    devices = summary["via_devices"]["devices"]
    assert sorted(devices) == ["node-0", "node-1", "node-2", "node-3"]
    assert all(states[-1] == "succeeded" for states in devices.values()), devices
    # The crashed device was started again and took up the same job as the same node.
    assert devices["node-2"].count("training") == 2, devices["node-2"]
    events = read_events(run_dir)
    spawns = [e for e in events if e["type"] == "process" and e.get("event") == "spawn"]
    assert sorted(e["node"] for e in spawns) == [0, 1, 2, 2, 3]
    submit = [e for e in events if e["type"] == "job" and e["action"] == "submit"]
    assert submit and submit[0]["assignments"] == {f"node-{i}": i for i in range(4)}
    # The trained model is in the run directory and scores what the fleet last reported.
    model = summary["via_devices"]["model"]
    folder = Path(model["dir"])
    assert folder == run_dir / "model"
    assert {"model.npz", "model.tflite"} <= set(model["files"])
    assert model["round"] == 20
    assert model["accuracy"] == pytest.approx(summary["final_test_accuracy"], abs=1e-9)
    scored = _evaluate(folder / "model.npz", "--limit", "1000")
    assert scored["accuracy"] == pytest.approx(model["accuracy"], abs=1e-9)
    tflite = _evaluate(folder / "model.tflite", "--limit", "1000")
    assert tflite["accuracy"] == pytest.approx(scored["accuracy"], abs=2e-3)
    report = (run_dir / "report.md").read_text()
    assert "## Devices and the trained model" in report and "model.tflite" in report
    assert "node-2 | queued → accepted → training → queued" in report
    assert not [p for p in started_pids(events) if pid_alive(p)]


def test_devices_on_mosquitto_take_a_link_cut_and_a_reboot_and_return_the_model(tmp_path: Path) -> None:
    if not brokers.mosquitto_available():
        pytest.fail("mosquitto is not installed: run scripts/setup.sh")
    run_dir, summary = _run(tmp_path, "mosquitto")
    assert [f["mechanism"] for f in summary["faults"]] == ["broker-dynsec", "sigkill"]
    _check_devices_and_model(run_dir, summary)
    # Each device ran with its own user, none with an agent's or the admin's.
    for name in ("node-0", "node-3"):
        config = (run_dir / "devices" / name / "device.toml").read_text()
        assert f'username = "device-{name}"' in config


def test_devices_on_the_embedded_broker(tmp_path: Path) -> None:
    run_dir, summary = _run(tmp_path, "auto", env_without_mosquitto(tmp_path))
    assert [f["mechanism"] for f in summary["faults"]] == ["agent-drop", "sigkill"]
    _check_devices_and_model(run_dir, summary)


def test_the_fetched_tflite_runs_on_litert_alone(tmp_path: Path) -> None:
    """The report's snippet, as a user would paste it, in a fresh interpreter."""
    scenario = tmp_path / "s.toml"
    scenario.write_text('name = "tiny"\n[fleet]\nnodes = 2\nrounds = 4\n[agent]\neval_every = 2\n')
    run_dir = tmp_path / "run"
    done = run_simulate("--via-devices", "--scenario", str(scenario), "--out", str(run_dir), "--json", *FAST)
    assert done.returncode == 0, done.stderr[-3000:]
    report = (run_dir / "report.md").read_text()
    snippet = report.split("```python\n", 1)[1].split("```", 1)[0]
    ran = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=120,
                         check=False, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-2000:]
    prediction = ran.stdout.strip().splitlines()[-1]
    assert prediction.startswith("[") and 0 <= int(np.array(json.loads(prediction.replace(" ", ","))).item()) <= 9
