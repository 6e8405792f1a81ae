"""Short training runs on the real MNIST, both backends, and the model commands end to end.

The full baseline (>= 98% test accuracy, batch 100, Adam) is a manual measurement with
`edgegrove train-local`; here one short run must already clearly learn.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from agent.model.backend import make_backend
from agent.model.data import BatchStream, Dataset, load_mnist

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mnist(mnist_cache_dir: Path) -> Dataset:
    return load_mnist(cache_dir=mnist_cache_dir)


@pytest.mark.parametrize("backend_name", ["numpy", "litert"])
def test_200_adam_steps_learn_mnist(mnist: Dataset, backend_name: str) -> None:
    backend = make_backend(backend_name, np.random.default_rng(0), "adam")
    stream = BatchStream(mnist.x_train, mnist.y_train, 100, np.random.default_rng(1))
    losses = []
    for _ in range(200):
        loss, grad = backend.gradients(*next(stream))
        backend.apply(grad)
        losses.append(loss)
    assert np.mean(losses[-20:]) < 0.5 * np.mean(losses[:20])
    test_loss, test_acc = backend.evaluate(mnist.x_test, mnist.y_test)
    assert test_acc > 0.90, f"{backend_name}: {test_acc:.4f} after 200 steps"
    assert test_loss < 0.4


def test_both_backends_follow_the_same_trajectory(mnist: Dataset) -> None:
    """Each backend on its own gradients. Adam amplifies float rounding in near-zero gradient
    coordinates (g / sqrt(g*g) is about +-1 whatever g's size), so parameters drift apart by a
    few learning rates; losses must stay together (one wrong op would separate them at once).
    """
    numpy_backend = make_backend("numpy", np.random.default_rng(0), "adam")
    litert_backend = make_backend("litert", np.random.default_rng(0), "adam")
    assert numpy_backend.model_hash() == litert_backend.model_hash()
    stream = BatchStream(mnist.x_train, mnist.y_train, 100, np.random.default_rng(1))
    for step in range(30):
        x, y = next(stream)
        numpy_loss, numpy_grad = numpy_backend.gradients(x, y)
        litert_loss, litert_grad = litert_backend.gradients(x, y)
        assert litert_loss == pytest.approx(numpy_loss, rel=1e-3), f"step {step}"
        numpy_backend.apply(numpy_grad)
        litert_backend.apply(litert_grad)
    numpy_eval = numpy_backend.evaluate(mnist.x_test, mnist.y_test)
    litert_eval = litert_backend.evaluate(mnist.x_test, mnist.y_test)
    assert litert_eval[0] == pytest.approx(numpy_eval[0], rel=1e-2)
    assert abs(litert_eval[1] - numpy_eval[1]) < 0.005


def _edgegrove(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgegrove.cli", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd, check=False)


def test_train_local_json_document(tmp_path: Path) -> None:
    done = _edgegrove("train-local", "--backend", "litert", "--epochs", "2", "--train-limit",
                      "3000", "--cache-dir", str(tmp_path), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["epochs_run"] == 2 and report["train_size"] == 3000
    assert report["history"][1]["train_loss"] < report["history"][0]["train_loss"]
    assert report["final_test_accuracy"] > 0.85
    assert "epoch 2:" in done.stderr


def test_train_local_missing_data_says_what_to_do(tmp_path: Path) -> None:
    done = _edgegrove("train-local", "--data", str(tmp_path / "missing.npz"), cwd=tmp_path)
    assert done.returncode == 2  # a bad argument: one line, before anything starts
    assert "does not exist" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr


def test_bench_model_reports_both_backends(tmp_path: Path) -> None:
    done = _edgegrove("bench", "model", "--steps", "3", "--warmup", "1", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    results = {r["backend"]: r for r in json.loads(done.stdout)["results"]}
    assert set(results) == {"numpy", "litert"}
    for r in results.values():
        assert r["step_ms_median"] > 0 and r["peak_rss_mb"] > r["rss_before_backend_mb"] > 0
