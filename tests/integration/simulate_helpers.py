"""Run `edgegrove simulate` as a real process and read its run directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

# Short runs for CI: small evaluations, quick deadlines, no baseline, no dashboard.
FAST = ["--no-dashboard", "--baseline", "none", "--agent-option", "eval_samples=1000",
        "--agent-option", "join_grace=60", "--stall-timeout", "60"]


def simulate_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "edgegrove.cli", "simulate", *args]


# After a timeout: how long the simulator gets to stop its agents and brokers (SIGTERM).
STOP_GRACE_S = 60.0


def run_simulate(*args: str, env: dict[str, str] | None = None, timeout: float = 420) -> subprocess.CompletedProcess[str]:
    """The simulator's run; on ``timeout`` it is stopped with SIGTERM, which stops its agents
    and brokers too (a SIGKILL, as subprocess.run sends, left them running), then the
    timeout is raised."""
    command = simulate_command(*args)
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                out, err = proc.communicate(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            raise subprocess.TimeoutExpired(command, timeout, out, err) from None
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line]


def started_pids(events: list[dict[str, Any]]) -> list[int]:
    """Every process the simulator says it started: agents (each incarnation) and the broker."""
    pids = [e["pid"] for e in events if e["type"] == "process" and e.get("event") == "spawn"]
    pids += [e["pid"] for e in events if e["type"] == "broker" and e.get("pid")]
    return pids


def pid_alive(pid: int) -> bool:
    """True for a live process (a zombie waiting for its parent counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def env_without_mosquitto(tmp: Path) -> dict[str, str]:
    """PATH with no directory that holds a mosquitto binary (and no fallback to /usr/sbin)."""
    keep = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not (Path(d) / "mosquitto").exists()]
    return {**os.environ, "PATH": os.pathsep.join(keep), "EDGEGROVE_MOSQUITTO": "none"}
