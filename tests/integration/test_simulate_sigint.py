"""End to end: Ctrl-C (SIGINT) during a run stops every process it started; the report is written."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.simulate_helpers import (
    FAST,
    pid_alive,
    read_events,
    run_simulate,
    simulate_command,
    started_pids,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _wait_for_telemetry(run_dir: Path, proc: subprocess.Popen[str], timeout: float = 240) -> None:
    """Poll the event log (the signal we wait for) until agents report rounds."""
    deadline = time.monotonic() + timeout
    events = run_dir / "events.jsonl"
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the simulator ended before it was interrupted"
        if events.exists() and sum('"type":"telemetry"' in line for line in events.read_text().splitlines()) >= 14:
            return
        time.sleep(0.5)
    pytest.fail("no telemetry from the fleet")


def test_sigint_stops_everything_and_writes_the_report(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(simulate_command("--scenario", "default", "--out", str(run_dir), "--json",
                                             "--dashboard-port", "0", *FAST[1:]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_telemetry(run_dir, proc)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr[-2000:]
    summary = json.loads(stdout)
    assert summary["interrupted"] is True
    assert (run_dir / "report.md").is_file() and (run_dir / "summary.json").is_file()
    assert summary["rounds"] >= 2
    events = read_events(run_dir)
    pids = started_pids(events)
    assert len(pids) >= 8  # 7 agents + the broker
    assert not [p for p in pids if pid_alive(p)], "processes left running after SIGINT"
    assert any(e["type"] == "dashboard" for e in events)


def test_a_run_that_outlasts_its_test_is_stopped_with_its_agents(tmp_path: Path) -> None:
    """The tests' own helper: a simulator past its timeout stops its fleet before the test
    fails (a SIGKILL to the simulator alone left seven agents training)."""
    run_dir, scenario = tmp_path / "run", tmp_path / "long.toml"
    scenario.write_text('name = "long"\n[fleet]\nnodes = 3\nrounds = 1000000\n')
    with pytest.raises(subprocess.TimeoutExpired):
        run_simulate("--scenario", str(scenario), "--out", str(run_dir), "--json", *FAST, timeout=20)
    pids = started_pids(read_events(run_dir))
    assert len(pids) >= 4  # 3 agents + the broker
    assert not [p for p in pids if pid_alive(p)], "processes left running after the timeout"
