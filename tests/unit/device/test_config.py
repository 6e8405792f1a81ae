from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.commands import device as command
from agent.config import ConfigError
from agent.device.config import load_device_config
from agent.jobs import signing

# Fixed (not generated): it appears in the test ids, which every xdist worker must collect alike.
KEY = signing.public_key_text(Ed25519PrivateKey.from_private_bytes(bytes(range(32))))


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "device.toml"
    path.write_text(f'state_dir = "{tmp_path / "state"}"\n' + body)
    return path


def test_a_full_config_loads_with_credentials_from_their_file(tmp_path: Path) -> None:
    creds = tmp_path / "creds.json"
    creds.write_text(json.dumps({"username": "device-pi-3", "password": "pw"}))
    (tmp_path / "data.npz").write_bytes(b"")
    config, keys = load_device_config(write(tmp_path, f'''id = "pi-3"
broker = "mqtt://broker:1883"
credentials = "{creds}"
operator_keys = ["{KEY}"]
labels = {{site = "barn"}}
[data.mnist]
format = "mnist"
[data.own]
format = "npz"
path = "{tmp_path / 'data.npz'}"
'''))
    assert (config.username, config.password, config.labels) == ("device-pi-3", "pw", {"site": "barn"})
    assert set(config.data) == {"mnist", "own"} and keys == [base64.b64decode(KEY)]
    assert config.mqtt_client_id == "edgegrove-device-pi-3"


@pytest.mark.parametrize(("body", "says"), [
    (f'id = "Pi 3"\noperator_keys = ["{KEY}"]\n', "device name"),
    ('id = "pi"\noperator_keys = ["not a key"]\n', "operator_keys"),
    ('id = "pi"\n', "operator_keys"),
    (f'id = "pi"\noperator_keys = ["{KEY}"]\nsurprise = 1\n', "surprise"),
    (f'id = "pi"\noperator_keys = ["{KEY}"]\n[data.x]\nformat = "csv"\n', "needs a path"),
    (f'id = "pi"\noperator_keys = ["{KEY}"]\n[data.x]\nformat = "npz"\npath = "/nonexistent.npz"\n', "data.x"),
    (f'id = "pi"\noperator_keys = ["{KEY}"]\nbroker = "http://x"\n', "broker"),
    (f'id = "pi"\noperator_keys = ["{KEY}"]\ncredentials = "/nonexistent.json"\n', "credentials"),
    ('id = "pi"\noperator_keys = [', "not valid TOML"),
])
def test_every_mistake_is_one_line(tmp_path: Path, body: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_device_config(write(tmp_path, body))
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_the_command_exits_2_on_a_bad_config_before_connecting(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, 'id = "pi"\n')
    assert command.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("edgegrove device: ") and len(err.splitlines()) == 1
