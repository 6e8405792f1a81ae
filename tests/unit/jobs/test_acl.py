from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from agent.jobs.acl import create_commands, device_rules, device_user

REPO = Path(__file__).resolve().parents[3]


def make_credentials() -> ModuleType:
    path = REPO / "broker-config" / "make-credentials"
    loader = importlib.machinery.SourceFileLoader("make_credentials_for_devices", str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_a_devices_rules_are_the_templates_device_block() -> None:
    users = make_credentials().parse_acl_template((REPO / "broker-config" / "acl.template").read_text(),
                                                  "edgegrove/x", [], ["pi-3"])
    assert users["device-pi-3"] == device_rules("pi-3")
    writes = [t for access, t in device_rules("pi-3") if access == "write"]
    assert writes == ["edgegrove/devices/pi-3", "edgegrove/devices/pi-3/log", "edgegrove/jobs/+/exec/pi-3"]


def test_make_credentials_gives_each_device_its_user_once(tmp_path: Path) -> None:
    doc = make_credentials().make_credentials(tmp_path, [], devices=["pi-1", "pi-2"])
    assert doc["devices"]["pi-1"]["username"] == "device-pi-1" and "operator" in doc
    acl = (tmp_path / "acl").read_text()
    assert "user device-pi-2\ntopic write edgegrove/devices/pi-2\n" in acl
    assert acl.count("user device-pi-1\n") == 1
    with pytest.raises(ValueError):
        make_credentials().make_credentials(tmp_path, [], devices=["Pi_1"])


def test_creating_a_device_on_a_dynsec_broker_makes_its_role_and_client() -> None:
    commands = create_commands("pi-1", "pw")
    assert [c["command"] for c in commands] == ["createRole", "createClient"]
    assert commands[1]["username"] == device_user("pi-1") == "device-pi-1"
    sends = [a["topic"] for a in commands[0]["acls"] if a["acltype"] == "publishClientSend"]
    assert sends == ["edgegrove/devices/pi-1", "edgegrove/devices/pi-1/log", "edgegrove/jobs/+/exec/pi-1"]
