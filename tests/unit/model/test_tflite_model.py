"""TfliteModel on the committed examples/mnist_cnn/mnist_cnn.tflite, against the numpy twin
(examples/mnist_cnn/model.py): same initial weights bit for bit, same fingerprint, gradients
and scores equal to float32 rounding. Runs on ai-edge-litert alone (no TensorFlow)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agent.model.contract import Model, ModelError, fingerprint
from agent.model.loader import load_model
from agent.model.tflite_model import PREDICT_CHUNK, TfliteModel

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "mnist_cnn"
TFLITE = EXAMPLE / "mnist_cnn.tflite"


@pytest.fixture(scope="module")
def lite() -> TfliteModel:
    return TfliteModel(TFLITE)


@pytest.fixture(scope="module")
def twin() -> Model:
    return load_model(f"{EXAMPLE / 'model.py'}:factory")


def _batch(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    # Digit-like inputs: mostly zeros, some strokes in [0, 1).
    x = rng.random((n, 28, 28, 1), dtype=np.float32) * (rng.random((n, 28, 28, 1)) < 0.2)
    return x.astype(np.float32), rng.integers(0, 10, n).astype(np.int64)


def _trained_like(twin: Model, seed: int) -> np.ndarray:
    """Initial weights moved off their start (non-zero biases, so every path carries gradient)."""
    rng = np.random.default_rng(seed)
    params = twin.initial_params(0)
    return (params + rng.normal(0, 0.02, params.shape)).astype(np.float32)


def test_metadata_describes_the_cnn(lite: TfliteModel, twin: Model) -> None:
    assert lite.name == "mnist-cnn"
    assert lite.input_shape == (28, 28, 1) and lite.num_classes == 10
    assert [t.shape for t in lite.tensors] == [t.shape for t in twin.tensors]
    assert lite.param_count == twin.param_count == 225_034
    assert {"gradients", "infer", "initial_weights", "metadata"} <= set(lite.signatures)


def test_initial_weights_are_the_numpy_twins_bit_for_bit(lite: TfliteModel, twin: Model) -> None:
    initial = lite.initial_params(0)
    assert initial.dtype == np.float32
    assert initial.tobytes() == twin.initial_params(0).tobytes()
    assert fingerprint(lite, 0) == fingerprint(twin, 0)
    # Another seed draws other numpy weights: that fleet would be refused, not mixed.
    assert fingerprint(twin, 1) != fingerprint(lite, 1)


def test_gradient_equals_the_numpy_twins(lite: TfliteModel, twin: Model) -> None:
    params = _trained_like(twin, 1)
    x, y = _batch(64, 2)
    loss, grad = lite.loss_and_grad(params, x, y)
    loss_np, grad_np = twin.loss_and_grad(params, x, y)
    assert grad.shape == (lite.param_count,) and grad.dtype == np.float32
    assert loss == pytest.approx(loss_np, rel=1e-5)
    assert np.linalg.norm(grad - grad_np) <= 1e-4 * np.linalg.norm(grad_np)
    start = 0
    for tensor in lite.tensors:  # every tensor, not only the large dense ones
        part, part_np = grad[start:start + tensor.size], grad_np[start:start + tensor.size]
        assert np.linalg.norm(part_np) > 0, tensor.name
        assert np.linalg.norm(part - part_np) <= 1e-4 * np.linalg.norm(part_np), tensor.name
        start += tensor.size


def test_any_batch_size_and_flat_inputs(lite: TfliteModel, twin: Model) -> None:
    params = _trained_like(twin, 3)
    for n in (1, 7, 100):
        x, y = _batch(n, n)
        loss, grad = lite.loss_and_grad(params, x.reshape(n, 784), y)
        assert np.isfinite(loss) and np.all(np.isfinite(grad))
        assert loss == pytest.approx(twin.loss_and_grad(params, x, y)[0], rel=1e-5)


def test_predictions_agree_across_chunks(lite: TfliteModel, twin: Model) -> None:
    params = _trained_like(twin, 4)
    x, _ = _batch(PREDICT_CHUNK + 44, 5)
    scores, scores_np = lite.predict(params, x), twin.predict(params, x)
    assert scores.shape == (PREDICT_CHUNK + 44, 10)
    np.testing.assert_allclose(scores, scores_np, rtol=1e-4, atol=1e-4)
    assert np.array_equal(scores.argmax(axis=1), scores_np.argmax(axis=1))


def test_a_file_without_gradients_is_one_line(tmp_path: Path) -> None:
    # Same file, its signature key renamed (same length: the flatbuffer stays valid).
    renamed = tmp_path / "no-gradients.tflite"
    renamed.write_bytes(TFLITE.read_bytes().replace(b"gradients", b"gradientz"))
    with pytest.raises(ModelError) as caught:
        TfliteModel(renamed)
    message = str(caught.value)
    assert "\n" not in message
    assert "has no gradients signature" in message and "edgegrove model export" in message
    with pytest.raises(ModelError, match="has no gradients signature"):
        load_model(str(renamed))


def test_a_file_that_is_not_tflite_is_one_line(tmp_path: Path) -> None:
    junk = tmp_path / "junk.tflite"
    junk.write_bytes(b"not a model" * 100)
    with pytest.raises(ModelError) as caught:
        TfliteModel(junk)
    assert "\n" not in str(caught.value) and "not a loadable .tflite" in str(caught.value)


def test_the_thesis_mlp_file_is_not_a_user_model(tmp_path: Path) -> None:
    """The thesis MLP's trainable .tflite (state inside) has gradients but no metadata."""
    from agent.model import mlp
    from agent.model.tflite_builder import OptimizerSpec, build_model

    path = tmp_path / "mlp.tflite"
    path.write_bytes(build_model(mlp.init_params(np.random.default_rng(0)), OptimizerSpec("sgd", 0.01)))
    with pytest.raises(ModelError, match="has no initial_weights, metadata signatures"):
        TfliteModel(path)


def test_loading_and_running_the_file_imports_no_tensorflow() -> None:
    """The device install has ai-edge-litert, never TensorFlow or Keras."""
    import subprocess
    import sys

    script = (
        "import sys, numpy as np\n"
        "from agent.model.loader import load_model\n"
        f"m = load_model({str(TFLITE)!r})\n"
        "m.loss_and_grad(m.initial_params(0), np.zeros((2, 784), np.float32), np.array([1, 2]))\n"
        "print(sorted(n for n in sys.modules if n.split('.')[0] in ('tensorflow', 'keras')))\n"
    )
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=root, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_batchs_gradient_is_its_chunks_means_weighted_by_rows_in_float64(lite: TfliteModel,
                                                                            twin: Model) -> None:
    from agent.model.tflite_model import GRADIENT_CHUNK

    params = _trained_like(twin, 6)
    x, y = _batch(2 * GRADIENT_CHUNK + 3, 8)
    expected = np.zeros(lite.param_count, dtype=np.float64)
    runner = lite._run["gradients"]
    for start in range(0, len(x), GRADIENT_CHUNK):
        rows = slice(start, start + GRADIENT_CHUNK)
        out = runner(params=params, x=x[rows], y=y[rows].astype(np.int32))
        expected += np.asarray(out["grad"], dtype=np.float64) * (len(y[rows]) / len(y))
    assert lite.loss_and_grad(params, x, y)[1].tobytes() == expected.astype(np.float32).tobytes()
