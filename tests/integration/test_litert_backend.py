"""The LiteRT backend, executed by ai-edge-litert, against the numpy reference.

Same weights and batch: logits, loss and gradient agree to 1e-5 relative; one optimizer step
(SGD with momentum, Adam) agrees to 1e-6; state moves between the two backends.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agent.model import mlp
from agent.model.backend import NumpyBackend
from agent.model.data import Dataset, load_mnist
from agent.model.litert_backend import LitertBackend
from agent.model.optim import make_optimizer


def assert_close(actual: np.ndarray, expected: np.ndarray, rel: float) -> None:
    """Relative to the largest magnitude of ``expected`` (gradients have exact zeros)."""
    scale = float(np.max(np.abs(expected)))
    np.testing.assert_allclose(actual, expected, rtol=rel, atol=rel * scale)


@pytest.fixture(scope="module")
def mnist(mnist_cache_dir: Path) -> Dataset:
    return load_mnist(cache_dir=mnist_cache_dir)


@pytest.fixture(scope="module")
def params() -> np.ndarray:
    rng = np.random.default_rng(0)
    p = mlp.init_params(rng)
    p[mlp.OFFSETS[1] : mlp.OFFSETS[2]] = rng.normal(scale=0.05, size=512)  # non-zero biases
    p[mlp.OFFSETS[3] :] = rng.normal(scale=0.05, size=10)
    return p


def _pair(params: np.ndarray, optimizer: str, lr: float | None = None
          ) -> tuple[NumpyBackend, LitertBackend]:
    return (NumpyBackend(params, make_optimizer(optimizer, lr)),
            LitertBackend(params, make_optimizer(optimizer, lr)))


@pytest.mark.parametrize("batch", [1, 100])
def test_logits_loss_and_gradient_agree_on_real_mnist(mnist: Dataset, params: np.ndarray,
                                                      batch: int) -> None:
    reference, litert = _pair(params, "adam")
    x, y = mnist.x_train[:batch], mnist.y_train[:batch]
    assert_close(litert.logits(x), mlp.forward(params, x), 1e-5)
    loss, grad = litert.gradients(x, y)
    ref_loss, ref_grad = reference.gradients(x, y)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert grad.shape == (mlp.PARAM_COUNT,) and grad.dtype == np.float32
    for offset, size in zip(mlp.OFFSETS, mlp.SIZES, strict=True):  # each tensor on its own scale
        assert_close(grad[offset : offset + size], ref_grad[offset : offset + size], 1e-5)


@pytest.mark.parametrize(("optimizer", "lr"), [("sgd", 0.05), ("adam", 1e-3)])
def test_optimizer_steps_agree_to_1e_6(mnist: Dataset, params: np.ndarray, optimizer: str,
                                       lr: float) -> None:
    reference, litert = _pair(params, optimizer, lr)
    for step in range(3):
        x, y = mnist.x_train[step * 100 : (step + 1) * 100], mnist.y_train[step * 100 : (step + 1) * 100]
        grad = reference.gradients(x, y)[1]  # the same (averaged) gradient goes to both
        reference.apply(grad)
        litert.apply(grad)
        np.testing.assert_allclose(litert.params(), reference.params(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(litert.state(), reference.state(), rtol=0, atol=1e-6)
    assert litert.state()[mlp.PARAM_COUNT] == 3.0  # the step count


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_learning_rate_changed_between_steps_agrees_to_1e_6(
    mnist: Dataset, params: np.ndarray, optimizer: str
) -> None:
    reference, litert = _pair(params, optimizer, 0.01)
    grad = reference.gradients(mnist.x_train[:100], mnist.y_train[:100])[1]
    for lr in (0.01, 0.002):
        for backend in (reference, litert):
            backend.set_learning_rate(lr)
            backend.apply(grad)
        np.testing.assert_allclose(litert.params(), reference.params(), rtol=0, atol=1e-6)
    moved = litert.params()
    litert.set_learning_rate(0.0)
    litert.apply(grad)  # the rate is the graph's input, not the constant it was built with
    np.testing.assert_array_equal(litert.params(), moved)


def test_evaluate_agrees_on_the_test_set(mnist: Dataset, params: np.ndarray) -> None:
    reference, litert = _pair(params, "sgd")
    loss, acc = litert.evaluate(mnist.x_test, mnist.y_test)
    ref_loss, ref_acc = reference.evaluate(mnist.x_test, mnist.y_test)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert abs(acc - ref_acc) <= 2 / len(mnist.y_test)  # at most a near-tie flips


def test_state_moves_between_backends(mnist: Dataset, params: np.ndarray) -> None:
    reference, litert = _pair(params, "adam")
    x, y = mnist.x_train[:100], mnist.y_train[:100]
    for _ in range(2):
        reference.apply(reference.gradients(x, y)[1])
    litert.load_state(reference.state())
    assert litert.state().tobytes() == reference.state().tobytes()
    assert litert.model_hash() == reference.model_hash()
    grad = reference.gradients(x, y)[1]
    reference.apply(grad)
    litert.apply(grad)  # continues from step 2: Adam's bias correction uses t = 3
    np.testing.assert_allclose(litert.params(), reference.params(), rtol=0, atol=1e-6)
    back = NumpyBackend(params, make_optimizer("adam"))
    back.load_state(litert.state())
    assert back.state().tobytes() == litert.state().tobytes()


def test_set_params_keeps_the_optimizer_state(params: np.ndarray) -> None:
    litert = LitertBackend(params, make_optimizer("sgd", 0.1))
    litert.apply(np.ones(mlp.PARAM_COUNT, np.float32))
    litert.set_params(params)
    assert litert.params().tobytes() == params.tobytes()
    assert litert.state()[mlp.PARAM_COUNT] == 1.0


def test_bad_inputs_are_clear_errors(params: np.ndarray) -> None:
    litert = LitertBackend(params, make_optimizer("sgd"))
    with pytest.raises(ValueError, match=r"labels must be in 0\.\.9"):
        litert.gradients(np.zeros((2, 784), np.float32), np.array([3, 10]))
    with pytest.raises(ValueError, match="407050"):
        litert.apply(np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="state must be"):
        litert.load_state(np.zeros(3, np.float32))
