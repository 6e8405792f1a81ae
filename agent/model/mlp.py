"""The thesis MLP as flat numpy functions.

Parameters and gradients are ONE flat vector in the order [W1 (784x512), b1, W2 (512x10), b2];
W1 is row-major and used as ``x @ W1``. Every function works in the dtype of ``params``
(float32 normally, float64 for the finite-difference check). The operation order is mirrored
exactly by the LiteRT graph in ``tflite_builder`` so that both backends agree to float rounding.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

LAYER_SIZES = (784, 512, 10)
N_IN, N_HIDDEN, N_OUT = LAYER_SIZES
# (offset, shape) of each tensor inside the flat vector, in wire order.
SHAPES: tuple[tuple[int, ...], ...] = ((N_IN, N_HIDDEN), (N_HIDDEN,), (N_HIDDEN, N_OUT), (N_OUT,))
SIZES: tuple[int, ...] = tuple(int(np.prod(s)) for s in SHAPES)
OFFSETS: tuple[int, ...] = tuple(int(o) for o in np.cumsum((0, *SIZES[:-1])))
PARAM_COUNT = 407050
assert sum(SIZES) == PARAM_COUNT

FloatArray = npt.NDArray[np.floating]
Labels = npt.NDArray[np.integer]


def unpack(params: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Views (no copies) of W1, b1, W2, b2 inside the flat vector."""
    if params.shape != (PARAM_COUNT,):
        raise ValueError(f"expected a flat parameter vector of {PARAM_COUNT}, got {params.shape}")
    w1, b1, w2, b2 = (
        params[o : o + n].reshape(s) for o, n, s in zip(OFFSETS, SIZES, SHAPES, strict=True)
    )
    return w1, b1, w2, b2


def pack(w1: FloatArray, b1: FloatArray, w2: FloatArray, b2: FloatArray) -> FloatArray:
    """The flat vector [W1, b1, W2, b2] (dtype of ``w1``)."""
    return np.concatenate([np.ravel(a) for a in (w1, b1, w2, b2)]).astype(w1.dtype, copy=False)


def init_params(rng: np.random.Generator) -> npt.NDArray[np.float32]:
    """Glorot-uniform weights and zero biases (Keras' Dense default, as in the thesis)."""
    parts = []
    for shape in SHAPES:
        if len(shape) == 2:
            limit = np.sqrt(6.0 / (shape[0] + shape[1]))
            parts.append(rng.uniform(-limit, limit, size=shape).astype(np.float32))
        else:
            parts.append(np.zeros(shape, dtype=np.float32))
    return pack(*parts).astype(np.float32)


def _hidden(params: FloatArray, x: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Pre-activation and ReLU output of the hidden layer."""
    w1, b1, _, _ = unpack(params)
    pre = x.astype(params.dtype, copy=False) @ w1 + b1
    return pre, np.maximum(pre, 0)


def forward(params: FloatArray, x: FloatArray) -> FloatArray:
    """Logits, shape (batch, 10)."""
    _, _, w2, b2 = unpack(params)
    _, hidden = _hidden(params, x)
    return hidden @ w2 + b2


def predict(params: FloatArray, x: FloatArray) -> npt.NDArray[np.int64]:
    return np.argmax(forward(params, x), axis=1).astype(np.int64)


def accuracy(params: FloatArray, x: FloatArray, y: Labels) -> float:
    return float(np.mean(predict(params, x) == y))


def softmax_parts(logits: FloatArray) -> tuple[FloatArray, FloatArray]:
    """(probabilities, log-probabilities), numerically stable (max subtracted first)."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    exps = np.exp(shifted)
    sums = exps.sum(axis=1, keepdims=True)
    return exps / sums, shifted - np.log(sums)


def cross_entropy(logits: FloatArray, y: Labels) -> float:
    """Mean cross-entropy of integer labels ``y`` under ``logits``."""
    _, log_probs = softmax_parts(logits)
    return float(-np.mean(log_probs[np.arange(len(y)), y]))


def loss_and_grad(params: FloatArray, x: FloatArray, y: Labels) -> tuple[float, FloatArray]:
    """Mean cross-entropy over the batch and its flat gradient (dtype of ``params``)."""
    _, _, w2, _ = unpack(params)
    x = x.astype(params.dtype, copy=False)
    pre, hidden = _hidden(params, x)
    logits = hidden @ w2 + unpack(params)[3]
    probs, log_probs = softmax_parts(logits)
    rows = np.arange(len(y))
    loss = float(-np.mean(log_probs[rows, y]))
    one_hot = np.zeros_like(probs)
    one_hot[rows, y] = 1
    d_logits = (probs - one_hot) / params.dtype.type(len(y))
    d_hidden = (d_logits @ w2.T) * (pre > 0)
    # Each part computed straight into its place in the flat gradient (the same BLAS calls and
    # reductions as into new arrays, so the same bits): no 1.6 MB concatenation per step.
    grad = np.empty(PARAM_COUNT, dtype=params.dtype)
    g_w1, g_b1, g_w2, g_b2 = unpack(grad)
    np.matmul(x.T, d_hidden, out=g_w1)
    np.sum(d_hidden, axis=0, out=g_b1)
    np.matmul(hidden.T, d_logits, out=g_w2)
    np.sum(d_logits, axis=0, out=g_b2)
    return loss, grad
