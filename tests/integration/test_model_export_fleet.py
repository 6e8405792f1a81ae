"""The export path end to end: Keras (examples/mnist_cnn/build.py) -> `edgegrove model export`
-> `.tflite` -> a 3-agent fleet on a real mosquitto, two agents on LiteRT running the fresh file
and one on numpy running the same CNN through the Python path; all three hold bit-identical
models. Plus export's answers to bad sources. Needs TensorFlow (the export extra, installed by
scripts/setup.sh --dev): without it these tests FAIL, they never skip."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from simulate.brokers import MosquittoBroker, mosquitto_available, start_mosquitto
from simulate.fleet import AgentSpec, Fleet
from tests.integration.fleet_harness import FAST_AGENT, FleetListener, agent_logs, wait_exited

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "mnist_cnn"
JOB = "export"
ROUNDS = 12


def _require_tensorflow() -> None:
    if importlib.util.find_spec("tensorflow") is None:
        pytest.fail("TensorFlow is not installed, so the export path cannot be tested: "
                    "`pip install 'edgegrove[export]'` (scripts/setup.sh --dev installs it)",
                    pytrace=False)


def _export(source: str, output: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "edgegrove.cli", "model", "export", source, "-o", str(output)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[MosquittoBroker]:
    if not mosquitto_available():
        pytest.fail("mosquitto is not installed: run scripts/setup.sh --dev")
    with start_mosquitto(tmp_path / "broker", job=JOB, nodes=3) as b:
        yield b


def test_keras_to_tflite_to_a_mixed_three_agent_fleet(broker: MosquittoBroker, tmp_path: Path) -> None:
    _require_tensorflow()
    exported = tmp_path / "mnist_cnn.tflite"
    done = _export(f"{EXAMPLE / 'build.py'}:build_model", exported)
    assert done.returncode == 0, done.stderr
    assert "225,034 parameters" in done.stdout, done.stdout
    assert exported.read_bytes() == (EXAMPLE / "mnist_cnn.tflite").read_bytes(), (
        "the committed examples/mnist_cnn/mnist_cnn.tflite is not what export writes now: "
        "`edgegrove model export examples/mnist_cnn/build.py:build_model "
        "-o examples/mnist_cnn/mnist_cnn.tflite` and commit it")

    models = {0: ("litert", str(exported)), 1: ("litert", str(exported)),
              2: ("numpy", f"{EXAMPLE / 'model.py'}:factory")}
    specs = []
    for node, (backend, model) in models.items():
        options = {"job": JOB, "fleet_size": 3, **FAST_AGENT, "round_deadline": 30.0,
                   "rounds": ROUNDS, "backend": backend, "model": model,
                   "credentials": str(broker.credentials_path)}
        specs.append(AgentSpec(node=node, broker_url=broker.url, options=options,
                               checkpoint_dir=tmp_path / f"ckpt-{node}",
                               log_path=tmp_path / f"agent-{node}.log"))
    creds = broker.dashboard_credentials
    listener = FleetListener(broker.url, JOB, creds.username, creds.password)
    fleet = Fleet(specs)
    fleet.start_all()
    try:
        listener.wait_for(lambda: listener.reached([0, 1, 2], ROUNDS - 1), 600,
                          f"{ROUNDS} rounds on all three agents")
        hashes = listener.hashes_at(ROUNDS - 1)
        assert len(hashes) == 3 and len(set(hashes.values())) == 1, (
            f"LiteRT and numpy agents differ after round {ROUNDS - 1}: {hashes}")
        losses = [t.loss for t in listener.telemetry[0]]
        assert np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.3, losses
        wait_exited(fleet, 60)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{agent_logs(tmp_path)}") from None
    finally:
        fleet.stop_all(grace=10)
        listener.close()


def test_a_keras_file_exports_to_the_same_model(tmp_path: Path) -> None:
    _require_tensorflow()
    saved = tmp_path / "cnn.keras"
    script = (f"import sys; sys.path.insert(0, {str(EXAMPLE)!r}); from build import build_model; "
              f"build_model().save({str(saved)!r})")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300,
                   env={**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"})
    done = _export(str(saved), tmp_path / "from-keras.tflite")
    assert done.returncode == 0, done.stderr
    from agent.model.tflite_model import TfliteModel

    from_file = TfliteModel(tmp_path / "from-keras.tflite")
    committed = TfliteModel(EXAMPLE / "mnist_cnn.tflite")
    assert from_file.initial_params(0).tobytes() == committed.initial_params(0).tobytes()
    rng = np.random.default_rng(0)
    x, y = rng.random((8, 28, 28, 1), dtype=np.float32), rng.integers(0, 10, 8)
    params = committed.initial_params(0)
    np.testing.assert_allclose(from_file.loss_and_grad(params, x, y)[1],
                               committed.loss_and_grad(params, x, y)[1], rtol=1e-6, atol=1e-9)


def test_bad_sources_are_one_line_and_exit_2(tmp_path: Path) -> None:
    _require_tensorflow()
    unsupported = tmp_path / "transposed.py"
    unsupported.write_text(
        "import keras\n"
        "def build():\n"
        "    return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3),\n"
        "                             keras.layers.Conv2DTranspose(2, 3),\n"
        "                             keras.layers.Flatten(), keras.layers.Dense(2)])\n")
    raises = tmp_path / "raises.py"
    raises.write_text("def build():\n    raise ValueError('no GPU here')\n")
    cases = {
        f"{unsupported}:build": "have no LiteRT builtin kernel: Conv2DBackpropFilter",
        f"{raises}:build": "raised ValueError: no GPU here",
        f"{EXAMPLE / 'model.py'}:factory": "gave a MnistCnn, not a Keras model",
    }
    for source, said in cases.items():
        output = tmp_path / "out.tflite"
        done = _export(source, output)
        assert done.returncode == 2, (source, done.stdout, done.stderr)
        assert done.stderr.count("\n") == 1 and said in done.stderr, (source, done.stderr)
        assert done.stderr.startswith("model export: ") and not output.exists()
