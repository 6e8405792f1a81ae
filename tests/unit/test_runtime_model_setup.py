"""`edgegrove agent` with a user's model and data: what is wrong is one line and exit 2, before
the agent connects anywhere (the broker URL below has nothing listening)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

DIGITS = "examples/digits/model.py:factory"
ROOT = Path(__file__).resolve().parents[2]


def agent(*flags: str) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "agent.commands.agent", "--id", "0",
                           "--broker", "mqtt://127.0.0.1:9", *flags],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    return done.returncode, done.stderr


@pytest.fixture
def raising_factory(tmp_path: Path) -> str:
    path = tmp_path / "raising.py"
    path.write_text(textwrap.dedent('''
        def factory():
            raise ValueError("weights.bin not found")
    '''))
    return f"{path}:factory"


def test_a_factory_that_raises(raising_factory: str) -> None:
    code, err = agent("--model", raising_factory)
    assert code == 2 and err.count("\n") == 1
    assert f"factory {raising_factory} raised ValueError: weights.bin not found" in err


@pytest.mark.parametrize(("labels", "shape", "expected"), [
    ([0, 1, 2, 11], (4, 64), "labels span 0..11 but model digits-mlp has 10 classes"),
    ([0, 1, 2, 3], (4, 10), "samples have shape (10,) (10 values) but model digits-mlp takes (64,)"),
])
def test_data_that_does_not_fit_the_model(tmp_path: Path, labels: list[int], shape: tuple[int, int],
                                          expected: str) -> None:
    np.savez(tmp_path / "mine.npz", x=np.zeros(shape, np.float32), y=np.array(labels))
    code, err = agent("--model", DIGITS, "--data", str(tmp_path / "mine.npz"))
    assert code == 2 and err.count("\n") == 1 and expected in err, err


@pytest.mark.parametrize(("flags", "expected"), [
    (["--model", DIGITS, "--backend", "litert"], "backend litert runs the thesis MLP or a .tflite model"),
    (["--model", "x.tflite"], "is a .tflite file: run it with backend litert"),
    (["--partition", "dirichlet:-1"], "unknown partition"),
    (["--dataset", "cifar"], "unknown dataset 'cifar'"),
    (["--dataset", "digits", "--non-iid", "--partition", "shards:2"], "both say how to split"),
])
def test_configuration_errors(flags: list[str], expected: str) -> None:
    code, err = agent(*flags)
    assert code == 2 and err.count("\n") == 1 and expected in err, err
