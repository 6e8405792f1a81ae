"""The device's systemd unit and example config (deploy/) stay usable as the options change."""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest

from agent.device.config import DeviceConfig, read_toml
from agent.jobs import signing

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"


def test_the_example_config_is_a_valid_device_config(tmp_path: Path) -> None:
    table = read_toml(DEPLOY / "device.toml.example")
    table["operator_keys"] = [signing.public_key_text(signing.generate_key())]
    config = DeviceConfig.model_validate(table)
    assert config.id == "pi-3" and config.username == "device-pi-3"
    assert set(config.data) == {"mnist", "cameras"} and config.labels["site"] == "barn"


def test_the_unit_runs_the_device_with_its_config_and_restarts_always() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(DEPLOY / "edgegrove-device.service")
    service = unit["Service"]
    assert service["ExecStart"].split()[1:] == ["device", "--config", "/etc/edgegrove/device.toml"]
    assert service["Restart"] == "always" and service["KillSignal"] == "SIGTERM"
    assert read_toml(DEPLOY / "device.toml.example")["state_dir"] == f"/var/lib/{service['StateDirectory']}"


def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze (Debian's systemd package) is needed to check the unit")
    text = ((DEPLOY / "edgegrove-device.service").read_text()
            .replace("/opt/edgegrove/bin/edgegrove", shutil.which("true") or "/bin/true")
            .replace("User=edgegrove", "User=root").replace("Group=edgegrove", "Group=root"))
    unit = tmp_path / "edgegrove-device.service"
    unit.write_text(text)
    done = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0 and "edgegrove-device.service" not in done.stderr, done.stderr
