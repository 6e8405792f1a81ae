"""The thesis MLP: shapes, determinism, and the gradient against finite differences."""

from __future__ import annotations

import numpy as np
import pytest

from agent.model import mlp


def test_param_count_and_layout_match_the_thesis_model() -> None:
    assert mlp.LAYER_SIZES == (784, 512, 10)
    assert mlp.PARAM_COUNT == 784 * 512 + 512 + 512 * 10 + 10 == 407050
    params = mlp.init_params(np.random.default_rng(0))
    assert params.dtype == np.float32 and params.shape == (mlp.PARAM_COUNT,)
    w1, b1, w2, b2 = mlp.unpack(params)
    assert (w1.shape, b1.shape, w2.shape, b2.shape) == ((784, 512), (512,), (512, 10), (10,))
    assert not b1.any() and not b2.any()
    assert np.shares_memory(w1, params)  # views, not copies
    np.testing.assert_array_equal(mlp.pack(w1, b1, w2, b2), params)


def test_init_is_deterministic_in_the_generator() -> None:
    a = mlp.init_params(np.random.default_rng(7))
    b = mlp.init_params(np.random.default_rng(7))
    c = mlp.init_params(np.random.default_rng(8))
    assert a.tobytes() == b.tobytes()
    assert a.tobytes() != c.tobytes()
    limit = np.sqrt(6 / (784 + 512))
    assert np.abs(mlp.unpack(a)[0]).max() <= limit


def test_forward_is_x_at_w1_then_relu_then_w2() -> None:
    rng = np.random.default_rng(1)
    params = mlp.init_params(rng)
    params[mlp.OFFSETS[1] : mlp.OFFSETS[2]] = rng.normal(size=512)  # non-zero biases
    x = rng.random((5, 784), dtype=np.float32)
    w1, b1, w2, b2 = mlp.unpack(params)
    expected = np.maximum(x @ w1 + b1, 0) @ w2 + b2
    np.testing.assert_allclose(mlp.forward(params, x), expected, rtol=1e-6)
    assert mlp.predict(params, x).shape == (5,)


def test_loss_is_mean_cross_entropy() -> None:
    rng = np.random.default_rng(2)
    params = mlp.init_params(rng)
    x, y = rng.random((8, 784), dtype=np.float32), rng.integers(0, 10, 8)
    logits = mlp.forward(params, x).astype(np.float64)
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    expected = -np.mean(np.log(probs[np.arange(8), y]))
    loss, grad = mlp.loss_and_grad(params, x, y)
    assert loss == pytest.approx(expected, rel=1e-5)
    assert grad.dtype == np.float32 and grad.shape == (mlp.PARAM_COUNT,)


def test_gradient_matches_finite_differences_in_float64() -> None:
    rng = np.random.default_rng(3)
    params = mlp.init_params(rng).astype(np.float64)
    params[mlp.OFFSETS[1] : mlp.OFFSETS[2]] = rng.normal(scale=0.1, size=512)
    x, y = rng.random((6, 784)), rng.integers(0, 10, 6)
    _, grad = mlp.loss_and_grad(params, x, y)
    assert grad.dtype == np.float64
    # Coordinates from every tensor (W1, b1, W2, b2), plus the largest-gradient ones.
    picks = [int(rng.integers(o, o + n)) for o, n in zip(mlp.OFFSETS, mlp.SIZES, strict=True)
             for _ in range(8)]
    picks += list(np.argsort(-np.abs(grad))[:10])
    eps = 1e-6
    for i in picks:
        plus, minus = params.copy(), params.copy()
        plus[i] += eps
        minus[i] -= eps
        numeric = (mlp.loss_and_grad(plus, x, y)[0] - mlp.loss_and_grad(minus, x, y)[0]) / (2 * eps)
        assert grad[i] == pytest.approx(numeric, rel=1e-5, abs=1e-8), f"coordinate {i}"


def test_gradient_descent_on_a_fixed_batch_reduces_the_loss() -> None:
    rng = np.random.default_rng(4)
    params = mlp.init_params(rng)
    x, y = rng.random((20, 784), dtype=np.float32), rng.integers(0, 10, 20)
    first, _ = mlp.loss_and_grad(params, x, y)
    for _ in range(30):
        _, grad = mlp.loss_and_grad(params, x, y)
        params = params - np.float32(0.1) * grad
    last, _ = mlp.loss_and_grad(params, x, y)
    assert last < first * 0.5
    assert mlp.accuracy(params, x, y) == 1.0


def test_wrong_parameter_length_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="407050"):
        mlp.forward(np.zeros(10, np.float32), np.zeros((1, 784), np.float32))
