"""`edgegrove enroll NAME`: a device's device.toml from its credentials, made once."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import stat
from pathlib import Path

import pytest

from agent.cli import COMMANDS, dispatch
from agent.device.config import load_device_config
from agent.jobs import signing
from agent.operator.keys import device_public_key, pinned_member_keys
from agent.protocol.keys import key_text, public_of

REPO = Path(__file__).resolve().parents[3]


def credentials(tmp_path: Path) -> Path:
    loader = importlib.machinery.SourceFileLoader("make_credentials_enroll", str(REPO / "broker-config" / "make-credentials"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    module.make_credentials(tmp_path / "broker", [], devices=["pi-1"])
    return tmp_path / "broker" / "credentials.json"


@pytest.fixture(autouse=True)
def device_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where enroll keeps the devices' public keys: the test's, not the operator's home."""
    folder = tmp_path / "device-keys"
    monkeypatch.setenv("EDGEGROVE_DEVICE_KEYS", str(folder))
    return folder


def enroll(*argv: str) -> int:
    return dispatch("edgegrove", "", COMMANDS, ["enroll", *argv])


def test_enroll_writes_a_device_toml_the_device_loads(tmp_path: Path, device_keys: Path) -> None:
    key = signing.generate_key()
    (tmp_path / "operator.pub").write_text(signing.public_key_text(key) + "\n")
    (tmp_path / "cam").mkdir()
    assert enroll("pi-1", "--from-credentials", str(credentials(tmp_path)), "--operator-key",
                  str(tmp_path / "operator.pub"), "--broker", "mqtt://broker.local:1883", "--label", "site=barn",
                  "--data", "mnist=mnist", "--data", f"cam=images:{tmp_path / 'cam'}",
                  "--state-dir", str(tmp_path / "state"), "-o", str(tmp_path / "pi-1")) == 0
    path = tmp_path / "pi-1" / "device.toml"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    config, keys = load_device_config(path)
    assert (config.id, config.username, config.broker) == ("pi-1", "device-pi-1", "mqtt://broker.local:1883")
    assert config.labels == {"site": "barn"} and set(config.data) == {"mnist", "cam"} and len(keys) == 1
    # Its device key: private in device.toml, the public half where `job submit` pins it from.
    private = config.private_device_key
    assert private is not None and config.device_public_key == key_text(public_of(private))
    assert device_public_key(device_keys, "pi-1") == config.device_public_key
    assert pinned_member_keys(device_keys, {"pi-1": 0}) == {"0": config.device_public_key}


@pytest.mark.parametrize(("extra", "says"), [
    (["pi-2"], "no devices.pi-2 entry"),
    (["pi-1", "--data", "x=parquet"], "format 'parquet'"),
    (["pi-1", "--label", "nolabel"], "KEY=VALUE"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          extra: list[str], says: str) -> None:
    key = signing.public_key_text(signing.generate_key())
    code = enroll(*extra, "--from-credentials", str(credentials(tmp_path)), "--operator-key", key,
                  "-o", str(tmp_path / "out"))
    err = capsys.readouterr().err.strip()
    assert code == 2 and says in err and len(err.splitlines()) == 1
