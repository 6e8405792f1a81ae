"""The fetched .tflite predicts what the numpy model predicts with the same weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agent.model.contract import TensorSpec
from agent.model.loader import load_model
from agent.model.tflite_model import TfliteModel
from agent.operator.tflite_writer import (
    TfliteWriteError,
    dense_chain,
    dense_tflite,
    mlp_tflite,
    run_infer,
    trained_copy,
)

REPO = Path(__file__).resolve().parents[3]
CNN = REPO / "examples" / "mnist_cnn" / "mnist_cnn.tflite"


def trained(params: np.ndarray, seed: int = 1) -> np.ndarray:
    """Weights unlike the initial ones (as training leaves them)."""
    return (params + np.random.default_rng(seed).normal(0, 0.05, params.size)).astype(np.float32)


def test_the_thesis_mlp_infers_its_numpy_scores() -> None:
    model = load_model("mlp")
    params = trained(model.initial_params(0))
    x = np.random.default_rng(2).random((12, 784), dtype=np.float32)
    got = run_infer(mlp_tflite(params), x)
    np.testing.assert_allclose(got, model.predict(params, x), rtol=1e-5, atol=1e-5)
    assert np.array_equal(got.argmax(1), model.predict(params, x).argmax(1))


def test_a_trained_copy_of_a_stateless_tflite_infers_with_the_trained_weights() -> None:
    model = TfliteModel(CNN)
    params = trained(model.initial_params(0))
    x = np.random.default_rng(3).random((10, 28, 28, 1), dtype=np.float32)
    copy = trained_copy(CNN.read_bytes(), params)
    got = run_infer(copy, x)
    np.testing.assert_allclose(got, model.predict(params, x), rtol=1e-5, atol=1e-5)
    # and not the file's initial weights
    assert not np.allclose(got, model.predict(model.initial_params(0), x), atol=1e-3)
    from ai_edge_litert.interpreter import Interpreter

    signatures = Interpreter(model_content=copy).get_signature_list()
    assert signatures["infer"]["inputs"] == ["x"]
    assert set(signatures) == {"infer", "metadata"}


def test_a_trained_copy_refuses_parameters_of_another_size() -> None:
    with pytest.raises(TfliteWriteError, match="parameters"):
        trained_copy(CNN.read_bytes(), np.zeros(10, np.float32))


def test_a_dense_python_model_is_written_and_checked_against_its_predict() -> None:
    model = load_model(f"{REPO / 'examples' / 'digits' / 'model.py'}:factory")
    params = trained(model.initial_params(0))
    x = np.random.default_rng(4).random((9, 64), dtype=np.float32)
    got = run_infer(dense_tflite(model, params, x), x)
    np.testing.assert_allclose(got, model.predict(params, x), rtol=1e-5, atol=1e-5)


class Tanh:
    """Dense layers, but tanh between them: not what the writer builds."""

    name, input_shape, num_classes = "tanh", (4,), 3
    tensors = (TensorSpec("w1", (4, 5)), TensorSpec("b1", (5,)), TensorSpec("w2", (5, 3)), TensorSpec("b2", (3,)))

    def predict(self, params: np.ndarray, x: np.ndarray) -> np.ndarray:
        w1, b1 = params[:20].reshape(4, 5), params[20:25]
        w2, b2 = params[25:40].reshape(5, 3), params[40:43]
        return np.tanh(x @ w1 + b1) @ w2 + b2


def test_a_chain_with_another_activation_is_not_written() -> None:
    params = np.random.default_rng(5).normal(0, 1, 43).astype(np.float32)
    with pytest.raises(TfliteWriteError, match="another activation"):
        dense_tflite(Tanh(), params, np.random.default_rng(6).normal(0, 1, (8, 4)).astype(np.float32))  # type: ignore[arg-type]


def test_only_kernel_bias_chains_count_as_dense() -> None:
    assert dense_chain((TensorSpec("k", (3, 4)), TensorSpec("b", (4,)))) == [(3, 4)]
    assert dense_chain((TensorSpec("k", (3, 3, 1, 8)), TensorSpec("b", (8,)))) is None
    assert dense_chain((TensorSpec("k", (3, 4)), TensorSpec("b", (4,)), TensorSpec("k2", (5, 2)),
                        TensorSpec("b2", (2,)))) is None
