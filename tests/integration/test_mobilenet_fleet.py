"""MobileNetV2 (alpha 0.35, 32x32x3: depthwise convolutions, ReLU6, residual additions, batch
norm in training mode) exported from examples/mobilenet_v2/build.py with `--batch-norm train`
and trained from scratch by a 3-agent LiteRT fleet from an image folder through `edgegrove
simulate`: every round completes and the agents' models, running statistics included, are
identical at the end. (The 7-agent accuracy run against Keras on one machine is in
docs/MODELS.md; this is its size for CI.) Needs TensorFlow (the export extra): fails without."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.integration.simulate_helpers import FAST, run_simulate

# The export traces ~150 layers and their gradients: ~1 minute on a quiet host, several on a
# loaded one.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1800)]
ROOT = Path(__file__).resolve().parents[2]
NODES, ROUNDS = 3, 6
SCENARIO = f"""
name = "mobilenet"
description = "no faults: MobileNetV2 from scratch on an image folder"

[fleet]
nodes = {NODES}
rounds = {ROUNDS}

[agent]
eval_every = 3
lr = 0.002
batch = 8
"""


def _image_folder(root: Path, per_class: int = 6) -> None:
    """Ten classes of 32x32 RGB images: noise with a bright patch where the class says."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for label in range(10):
        (root / str(label)).mkdir(parents=True)
        for n in range(per_class):
            pixels = rng.integers(0, 80, (32, 32, 3))
            row, col = divmod(label, 5)
            pixels[4 + 12 * row:12 + 12 * row, 2 + 6 * col:8 + 6 * col] = 255
            Image.fromarray(pixels.astype(np.uint8), mode="RGB").save(root / str(label) / f"{n}.png")


def test_mobilenet_v2_from_scratch_on_a_three_agent_litert_fleet(tmp_path: Path) -> None:
    if importlib.util.find_spec("tensorflow") is None:
        pytest.fail("TensorFlow is not installed: `pip install 'edgegrove[export]'` "
                    "(scripts/setup.sh --dev installs it)", pytrace=False)
    model = tmp_path / "mobilenet_v2.tflite"
    exported = subprocess.run(
        [sys.executable, "-m", "edgegrove.cli", "model", "export",
         f"{ROOT / 'examples/mobilenet_v2/build.py'}:build_model", "-o", str(model),
         "--batch-norm", "train"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=900)
    assert exported.returncode == 0, exported.stderr[-2000:]
    assert "mobilenet-v2-0.35, 423,018 parameters (14,080 of them batch-norm running statistics)" \
        in exported.stdout, exported.stdout
    folder = tmp_path / "images"
    _image_folder(folder)
    scenario, run_dir = tmp_path / "mobilenet.toml", tmp_path / "run"
    scenario.write_text(SCENARIO)
    done = run_simulate("--scenario", str(scenario), "--broker", "mosquitto", "--out", str(run_dir),
                        "--model", str(model), "--backend", "litert", "--dataset", str(folder),
                        "--json", *FAST, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["halted"] is False and summary["error"] is None and summary["rounds"] == ROUNDS
    assert summary["models_identical_at_end"] is True
    assert summary["model"]["name"] == "mobilenet-v2-0.35"
    assert summary["final_loss"] is not None and np.isfinite(summary["final_loss"])
