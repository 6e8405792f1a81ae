from __future__ import annotations

import numpy as np

from agent.model import mlp
from agent.privacy.clipping import clip_to_norm, mlp_clipped_sum


def test_the_ghost_norms_clip_each_example_as_one_at_a_time_would() -> None:
    rng = np.random.default_rng(1)
    params = mlp.init_params(rng)
    x = rng.random((6, 784), dtype=np.float32)
    y = rng.integers(0, 10, 6)
    clip = 0.5
    expected = np.zeros(mlp.PARAM_COUNT)
    norms: list[float] = []
    for i in range(6):
        _, g = mlp.loss_and_grad(params.astype(np.float64), x[i:i + 1], y[i:i + 1])
        norm = float(np.linalg.norm(g))
        norms.append(norm)
        expected += g * min(1.0, clip / norm)
    loss, total = mlp_clipped_sum(params, x, y, clip)
    assert max(norms) > clip  # some examples are clipped
    np.testing.assert_allclose(total, expected, atol=1e-5)
    assert abs(loss - mlp.loss_and_grad(params, x, y)[0]) < 1e-5


def test_a_large_clip_gives_the_plain_gradient_times_the_batch() -> None:
    rng = np.random.default_rng(2)
    params = mlp.init_params(rng)
    x = rng.random((5, 784), dtype=np.float32)
    y = rng.integers(0, 10, 5)
    _, total = mlp_clipped_sum(params, x, y, 1e9)
    np.testing.assert_allclose(total / 5, mlp.loss_and_grad(params, x, y)[1], atol=1e-6)


def test_clip_to_norm_shortens_only_what_is_longer() -> None:
    v = np.array([3.0, 4.0], np.float32)
    np.testing.assert_allclose(clip_to_norm(v, 1.0), [0.6, 0.8], rtol=1e-6)
    np.testing.assert_array_equal(clip_to_norm(v, 10.0), v)
