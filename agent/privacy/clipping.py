"""Clipping a gradient to a norm: per example for the thesis MLP, per batch for any model.

Per-example clipping needs each example's gradient norm. For the thesis MLP's two dense layers
it comes without materialising the per-example gradients (the "ghost norm"): example i's
gradient of a dense layer is the outer product of its input and its output's gradient, whose
norm is the product of theirs, so ||g_i||^2 = |x_i|^2 |dh_i|^2 + |dh_i|^2 + |h_i|^2 |dl_i|^2
+ |dl_i|^2. Scaling each example's output gradients by its clip factor then gives the sum of
the clipped per-example gradients with the same two matmuls as the plain gradient.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from agent.model import mlp

F32 = npt.NDArray[np.float32]
_TINY = 1e-12


def clip_to_norm(vector: F32, clip: float) -> F32:
    """``vector`` scaled down to L2 norm ``clip`` when it is longer (a copy)."""
    norm = float(np.linalg.norm(vector.astype(np.float64)))
    scale = min(1.0, clip / (norm + _TINY))
    return np.asarray(vector * np.float32(scale), dtype=np.float32)


def mlp_clipped_sum(params: F32, x: F32, y: npt.NDArray[np.integer], clip: float) -> tuple[float, F32]:
    """(mean loss, sum over the batch of each example's gradient clipped to norm ``clip``)."""
    w1, b1, w2, b2 = mlp.unpack(params)
    x = x.astype(np.float32, copy=False)
    pre = x @ w1 + b1
    hidden = np.maximum(pre, 0)
    probs, log_probs = mlp.softmax_parts(hidden @ w2 + b2)
    rows = np.arange(len(y))
    loss = float(-np.mean(log_probs[rows, y]))
    d_logits = probs.copy()
    d_logits[rows, y] -= 1  # each example's own gradient: not divided by the batch
    d_hidden = (d_logits @ w2.T) * (pre > 0)
    norms = np.sqrt(_squared_rows(x) * _squared_rows(d_hidden) + _squared_rows(d_hidden)
                    + _squared_rows(hidden) * _squared_rows(d_logits) + _squared_rows(d_logits))
    factor = np.minimum(1.0, clip / (norms + _TINY)).astype(np.float32)[:, None]
    d_hidden *= factor
    d_logits *= factor
    # Straight into the flat vector, as mlp.loss_and_grad does: no concatenation per step.
    grad = np.empty(mlp.PARAM_COUNT, dtype=np.float32)
    g_w1, g_b1, g_w2, g_b2 = mlp.unpack(grad)
    np.matmul(x.T, d_hidden, out=g_w1)
    np.sum(d_hidden, axis=0, out=g_b1)
    np.matmul(hidden.T, d_logits, out=g_w2)
    np.sum(d_logits, axis=0, out=g_b2)
    return loss, grad


def _squared_rows(a: npt.NDArray[np.floating]) -> npt.NDArray[np.float64]:
    return np.einsum("ij,ij->i", a, a).astype(np.float64)
