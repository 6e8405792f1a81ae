"""Issue 15: the systemd unit and its environment file (deploy/) stay usable as the agent's
options change: every variable of the example is an option (or the data cache), and together
they make a valid configuration."""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest

from agent.config import ENV_PREFIX, AgentConfig, load_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NOT_OPTIONS = {"EDGEGROVE_CACHE_DIR"}  # read by agent.model.data, not an AgentConfig field


def _env_file() -> dict[str, str]:
    pairs = {}
    for line in (DEPLOY / "agent.env.example").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            pairs[key.strip()] = value.strip()
    return pairs


def _unit() -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(DEPLOY / "edgegrove-agent.service")
    return unit


def test_every_variable_of_the_environment_file_is_an_agent_option() -> None:
    env = _env_file()
    options = {ENV_PREFIX + name.upper() for name in AgentConfig.model_fields}
    assert set(env) - NOT_OPTIONS <= options, set(env) - NOT_OPTIONS - options
    config = load_config({}, None, environ=env)
    assert (config.id, config.fleet_size, config.backend) == (3, 7, "litert")
    assert config.password == "change-me" and config.checkpoint_dir is not None


def test_the_unit_restarts_always_and_takes_its_options_from_the_environment_file() -> None:
    service = _unit()["Service"]
    assert service["Restart"] == "always"
    assert service["EnvironmentFile"] == "/etc/edgegrove/agent.env"
    assert service["ExecStart"].split()[1:] == ["agent"]  # no options in the unit itself
    assert service["KillSignal"] == "SIGTERM"  # the agent's clean exit
    assert _unit()["Unit"]["StartLimitIntervalSec"] == "0"
    env = _env_file()
    assert env["EDGEGROVE_CHECKPOINT_DIR"].startswith(f"/var/lib/{service['StateDirectory']}/")
    assert env["EDGEGROVE_CACHE_DIR"] == f"/var/cache/{service['CacheDirectory']}"


def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze (Debian's systemd package) is needed to check the unit")
    text = (DEPLOY / "edgegrove-agent.service").read_text()
    # verify wants the executable and environment file to exist, and a known user.
    text = (text.replace("/opt/edgegrove/bin/edgegrove", shutil.which("true") or "/bin/true")
            .replace("/etc/edgegrove/agent.env", str(DEPLOY / "agent.env.example"))
            .replace("User=edgegrove", "User=root").replace("Group=edgegrove", "Group=root"))
    unit = tmp_path / "edgegrove-agent.service"
    unit.write_text(text)
    done = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0 and "edgegrove-agent.service" not in done.stderr, done.stderr
