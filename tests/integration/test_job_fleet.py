"""The operator's whole path with real devices: three device processes on a mosquitto with
dynamic security (device users made once, the operator's user), two jobs in a row through
`edgegrove job submit` with no restart and no new credential, each fetched and evaluated.

Job 1, the thesis MLP: every device goes accepted -> training -> succeeded; the fetched
model.npz scores exactly the fleet's last reported accuracy on the same test split, and the
fetched model.tflite scores the same running on ai-edge-litert alone (agent not importable).
Job 2, the digits model: the device without a digits data source rejects it, the job runs on
the other two.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.cli import COMMANDS, dispatch
from agent.jobs.states import ExecState
from simulate.brokers import MosquittoBroker
from tests.integration.device_fleet import Device, Watcher, mnist_slice, write_config

REPO = Path(__file__).resolve().parents[2]
DEVICES = ("pi-a", "pi-b", "pi-c")
LITERT_ALONE = """
import sys
sys.modules["agent"] = None  # the fetched model runs without edgegrove
import numpy as np
from ai_edge_litert.interpreter import Interpreter
model, data = sys.argv[1], np.load(sys.argv[2])
infer = Interpreter(model_path=model).get_signature_runner("infer")
x, y = data["x_test"].astype(np.float32), data["y_test"]
scores = np.concatenate([infer(x=x[i:i + 100])["logits"] for i in range(0, len(x), 100)])
print(float(np.mean(scores.argmax(1) == y)))
"""


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = dispatch("edgegrove", "test", COMMANDS, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def broker(mosquitto_factory: Callable[..., MosquittoBroker]) -> MosquittoBroker:
    return mosquitto_factory(dynsec=True, nodes=0, devices=list(DEVICES))


@pytest.fixture
def fleet(tmp_path: Path, broker: MosquittoBroker, mnist_cache_dir: Path,
          capsys: pytest.CaptureFixture[str]) -> Iterator[list[Device]]:
    assert cli(capsys, "job", "keygen", "-o", str(tmp_path / "keys"))[0] == 0
    public = (tmp_path / "keys" / "operator.pub").read_text().strip()
    mnist = mnist_slice(mnist_cache_dir, tmp_path / "mnist-slice.npz")
    devices = []
    for name in DEVICES:
        data = {"mnist": {"format": "npz", "path": str(mnist)}}
        if name != "pi-c":
            data["digits"] = {"format": "digits"}
        creds = broker.device_credentials(name)
        devices.append(write_config(tmp_path / "devices", name, broker.url, public, data,
                                    credentials=(creds.username, creds.password)))
    for device in devices:
        device.start()
    yield devices
    for device in devices:
        device.stop()


def job_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "job.toml"
    path.write_text(text)
    return str(path)


def test_two_jobs_in_a_row_come_back_as_models_that_score_what_the_fleet_reported(
        tmp_path: Path, broker: MosquittoBroker, fleet: list[Device], capsys: pytest.CaptureFixture[str]) -> None:
    login = ["--broker", broker.url, "--credentials", str(broker.credentials_path)]
    key = ["--key", str(tmp_path / "keys" / "operator.key")]
    operator = broker.operator_credentials
    watcher = Watcher.connect(broker.url, (operator.username, operator.password))
    try:
        watcher.wait(lambda: set(watcher.records) == set(DEVICES), 120, "three device records")
        code, out, err = cli(capsys, "job", "submit", job_file(tmp_path, """
name = "mlp-one"
data = "mnist"
batch = 50
min_devices = 3
[stop]
rounds = 15
[options]
eval_every = 5
"""), *key, "--grants", "dynsec", *login)
        assert code == 0, err
        watcher.wait(lambda: "mlp-one" in watcher.results, 300, "the MLP job's result")
        for device in DEVICES:
            watcher.wait(_done(watcher, "mlp-one", device), 60, f"{device} done")
            states = watcher.states("mlp-one", device)
            assert ExecState.TRAINING in states and states[-1] is ExecState.SUCCEEDED, states
        fleet_accuracy = watcher.results["mlp-one"].accuracy
        assert fleet_accuracy is not None

        fetched = tmp_path / "mlp-one"
        code, out, err = cli(capsys, "job", "fetch", "mlp-one", "-o", str(fetched), *login)
        assert code == 0, err
        slice_path = str(tmp_path / "mnist-slice.npz")
        code, out, err = cli(capsys, "model", "evaluate", str(fetched / "model.npz"), "--data", slice_path, "--json")
        assert code == 0, err
        assert json.loads(out)["accuracy"] == fleet_accuracy  # the same weights, the same test split
        alone = subprocess.run([sys.executable, "-c", LITERT_ALONE, str(fetched / "model.tflite"), slice_path],
                               capture_output=True, text=True, timeout=120, check=True)
        assert abs(float(alone.stdout.strip().splitlines()[-1]) - fleet_accuracy) <= 1 / 500

        digits = REPO / "examples" / "digits" / "model.py"
        code, out, err = cli(capsys, "job", "submit", job_file(tmp_path, f"""
name = "digits-two"
model = "{digits}:factory"
data = "digits"
batch = 16
lr = 0.003
min_devices = 2
[stop]
rounds = 20
"""), *key, *login)
        assert code == 0, err
        assert "skipped pi-c: no data source digits" in err
        watcher.wait(lambda: "digits-two" in watcher.results, 300, "the digits job's result")
        assert watcher.state("digits-two", "pi-c") is ExecState.REJECTED
        assert watcher.execs[("digits-two", "pi-c")].reason == "no_data_source"
        code, out, err = cli(capsys, "job", "status", "digits-two", "--json", *login)
        assert code == 0 and json.loads(out)["states"].startswith("rejected 1")
        code, out, err = cli(capsys, "job", "fetch", "digits-two", "-o", str(tmp_path / "digits"), *login)
        assert code == 0, err
        code, out, err = cli(capsys, "model", "evaluate", str(tmp_path / "digits" / "model.tflite"),
                             "--dataset", "digits", "--json")
        assert code == 0, err
        assert abs(json.loads(out)["accuracy"] - (watcher.results["digits-two"].accuracy or 0)) <= 1 / 899
    finally:
        watcher.close()


def _done(watcher: Watcher, job: str, device: str) -> Callable[[], bool]:
    return lambda: watcher.state(job, device) is ExecState.SUCCEEDED
