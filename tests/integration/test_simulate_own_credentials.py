"""What each process of `edgegrove simulate` is handed (issue 54): its own credentials only.

The simulator's own dynamic-security mosquitto, both fleet paths (agents, and devices with a
job). Each process's command line is read back from its log, and the file it names (an agent's
credentials file, a device's device.toml) is read as the process would: it holds that process's
password and none of the job's other secrets (the admin's, the operator's, the dashboard's,
other agents' or devices'). The dashboard logs in as a dashboard user, never as the admin (the
broker's log names the user of each connection)."""

from __future__ import annotations

import json
import re
import shlex
import stat
from pathlib import Path
from typing import Any

import pytest

from simulate import brokers
from tests.integration.simulate_helpers import run_simulate

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCENARIO = '''
name = "own-credentials"
[fleet]
nodes = 3
rounds = 3
'''
QUICK = ["--baseline", "none", "--agent-option", "eval_samples=500", "--agent-option", "join_grace=60",
         "--stall-timeout", "90", "--dashboard-port", "0"]


def _secrets(table: dict[str, Any]) -> dict[str, str]:
    found = {f"agent-{n}": e["password"] for n, e in table["agents"].items()}
    found |= {f"device-{d}": e["password"] for d, e in table.get("devices", {}).items()}
    found |= {role: table[role]["password"] for role in ("admin", "dashboard", "dashboard_control", "operator")
              if role in table}
    return found


def _commands(run_dir: Path) -> dict[int, list[str]]:
    """node -> the command its first incarnation ran, from its log's first line."""
    commands = {}
    for log in sorted((run_dir / "agents").glob("agent-*.log")):
        first = log.read_text().splitlines()[0]
        commands[int(log.stem.split("-")[1])] = shlex.split(first.split(": ", 1)[1])
    return commands


def _given(command: list[str], flag: str) -> Path:
    return Path(command[command.index(flag) + 1])


def _run(tmp_path: Path, *path_flag: str) -> tuple[Path, dict[str, str]]:
    if not brokers.mosquitto_available():
        pytest.fail("mosquitto is not installed: run scripts/setup.sh --dev")
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(SCENARIO)
    out = tmp_path / "run"
    done = run_simulate("--scenario", str(scenario), "--out", str(out), "--broker", "mosquitto",
                        *QUICK, *path_flag, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    table = json.loads((out / "broker" / "credentials.json").read_text())
    return out, _secrets(table)


def _assert_holds_only(text: str, own: str, secrets: dict[str, str], who: str) -> None:
    assert secrets[own] in text, f"{who} was not given its own password"
    leaked = sorted(name for name, secret in secrets.items() if name != own and secret in text)
    assert leaked == [], f"{who} was handed the secrets of {leaked}"


def _assert_dashboard_not_admin(run_dir: Path) -> None:
    log = (run_dir / "broker" / "mosquitto.log").read_text()
    users = set(re.findall(r"as edgegrove-dashboard-\w+ \(.*?u'([^']+)'\)", log))
    assert users == {"dashboard-control"}, users  # with fault controls: never the admin


def test_each_agent_is_handed_its_own_credentials(tmp_path: Path) -> None:
    run_dir, secrets = _run(tmp_path, "--via-agents")
    commands = _commands(run_dir)
    assert sorted(commands) == [0, 1, 2]
    for node, command in commands.items():
        given = _given(command, "--credentials")
        assert given.parent == run_dir / "agents" / "credentials"
        assert stat.S_IMODE(given.stat().st_mode) == 0o600
        _assert_holds_only(given.read_text(), f"agent-{node}", secrets, f"agent {node}")
        leaked = [name for name, secret in secrets.items() if secret in " ".join(command)]
        assert leaked == [], f"agent {node}'s command line holds the secrets of {leaked}"
    _assert_dashboard_not_admin(run_dir)


def test_each_device_is_handed_its_own_credentials(tmp_path: Path) -> None:
    run_dir, secrets = _run(tmp_path)  # the default: devices and a job
    commands = _commands(run_dir)
    assert sorted(commands) == [0, 1, 2]
    for command in commands.values():
        config = _given(command, "--config")
        assert stat.S_IMODE(config.stat().st_mode) == 0o600
        name = config.parent.name
        _assert_holds_only(config.read_text(), f"device-{name}", secrets, f"device {name}")
        assert "--credentials" not in command
    _assert_dashboard_not_admin(run_dir)
