"""A small CNN for MNIST in numpy: the Python-path twin of ``build.py``'s Keras model.

conv 3x3x32 (ReLU) -> max-pool 2 -> conv 3x3x64 (ReLU) -> max-pool 2 -> dense 128 (ReLU) ->
dense 10, on 28x28x1 images; 225,034 parameters. The flat vector holds the tensors in Keras's
order and layouts (kernels HWIO, dense kernels in x out, flatten in H, W, C order), and
``init_weights`` is the one initializer both twins use: ``factory().initial_params(0)`` equals
the exported ``.tflite``'s ``initial_weights`` bit for bit, so numpy and LiteRT agents of one
fleet announce the same fingerprint.

Convolutions are im2col + one matrix product; a max-pool's gradient goes to every element equal
to its window's maximum (the exported graph does the same).

    edgegrove agent --model examples/mnist_cnn/model.py:factory ...
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

from agent.model.contract import F32, TensorSpec

INPUT_SHAPE = (28, 28, 1)
NUM_CLASSES = 10
KERNEL = 3
POOL = 2
TENSORS = (
    TensorSpec("conv1/kernel", (KERNEL, KERNEL, 1, 32)),
    TensorSpec("conv1/bias", (32,)),
    TensorSpec("conv2/kernel", (KERNEL, KERNEL, 32, 64)),
    TensorSpec("conv2/bias", (64,)),
    TensorSpec("dense1/kernel", (5 * 5 * 64, 128)),
    TensorSpec("dense1/bias", (128,)),
    TensorSpec("dense2/kernel", (128, NUM_CLASSES)),
    TensorSpec("dense2/bias", (NUM_CLASSES,)),
)
PREDICT_CHUNK = 100  # rows per forward pass in predict: ~45 MB of activations (1000 rows: ~450)


def init_weights(seed: int) -> list[F32]:
    """The tensors of ``TENSORS`` for ``seed``: kernels He-uniform (limit sqrt(6 / fan_in)),
    biases zero, all float32."""
    rng = np.random.default_rng(seed)
    weights: list[F32] = []
    for spec in TENSORS:
        if len(spec.shape) == 1:
            weights.append(np.zeros(spec.shape, dtype=np.float32))
            continue
        fan_in = int(np.prod(spec.shape[:-1]))
        limit = np.sqrt(6.0 / fan_in)
        weights.append(rng.uniform(-limit, limit, size=spec.shape).astype(np.float32))
    return weights


def _unflatten(params: F32) -> list[F32]:
    out, start = [], 0
    for spec in TENSORS:
        size = int(np.prod(spec.shape))
        out.append(params[start:start + size].reshape(spec.shape))
        start += size
    return out


def _patches(x: F32) -> F32:
    """[B, H, W, C] -> [B, H-2, W-2, 3*3*C], in the kernel's (row, column, channel) order."""
    windows = sliding_window_view(x, (KERNEL, KERNEL), axis=(1, 2))  # [B, Ho, Wo, C, k, k]
    return np.ascontiguousarray(windows.transpose(0, 1, 2, 4, 5, 3)).reshape(
        *windows.shape[:3], -1)


def _conv(x: F32, kernel: F32, bias: F32) -> tuple[F32, F32]:
    cols = _patches(x)
    out = cols @ kernel.reshape(-1, kernel.shape[-1]) + bias
    return out, cols


def _conv_back(dy: F32, cols: F32, kernel: F32, x_shape: tuple[int, ...],
               need_dx: bool) -> tuple[F32 | None, F32, F32]:
    f = kernel.shape[-1]
    dy2 = dy.reshape(-1, f)
    dkernel = (cols.reshape(-1, cols.shape[-1]).T @ dy2).reshape(kernel.shape)
    dbias = dy2.sum(axis=0)
    if not need_dx:
        return None, dkernel, dbias
    dcols = (dy2 @ kernel.reshape(-1, f).T).reshape(*dy.shape[:3], KERNEL, KERNEL, x_shape[-1])
    dx = np.zeros(x_shape, dtype=np.float32)
    ho, wo = dy.shape[1:3]
    for i in range(KERNEL):
        for j in range(KERNEL):
            dx[:, i:i + ho, j:j + wo, :] += dcols[:, :, :, i, j, :]
    return dx, dkernel, dbias


def _pool(x: F32) -> tuple[F32, F32]:
    """2x2 max-pool, stride 2, the odd last row/column dropped (Keras's 'valid')."""
    b, h, w, c = x.shape
    ho, wo = h // POOL, w // POOL
    windows = x[:, :ho * POOL, :wo * POOL, :].reshape(b, ho, POOL, wo, POOL, c)
    return windows.max(axis=(2, 4)), windows


def _pool_back(dy: F32, windows: F32, y: F32, x_shape: tuple[int, ...]) -> F32:
    mask = windows == y[:, :, None, :, None, :]
    grads = (mask * dy[:, :, None, :, None, :]).astype(np.float32)
    b, ho, _, wo, _, c = windows.shape
    dx = np.zeros(x_shape, dtype=np.float32)
    dx[:, :ho * POOL, :wo * POOL, :] = grads.reshape(b, ho * POOL, wo * POOL, c)
    return dx


def _forward(params: F32, x: F32) -> tuple[F32, dict[str, F32]]:
    k1, b1, k2, b2, k3, b3, k4, b4 = _unflatten(params)
    z1, cols1 = _conv(x, k1, b1)
    a1 = np.maximum(z1, 0)
    p1, win1 = _pool(a1)
    z2, cols2 = _conv(p1, k2, b2)
    a2 = np.maximum(z2, 0)
    p2, win2 = _pool(a2)
    flat = p2.reshape(len(x), -1)
    a3 = np.maximum(flat @ k3 + b3, 0)
    logits = a3 @ k4 + b4
    saved = {"cols1": cols1, "a1": a1, "p1": p1, "win1": win1, "cols2": cols2, "a2": a2,
             "p2": p2, "win2": win2, "flat": flat, "a3": a3}
    return logits.astype(np.float32, copy=False), saved


@dataclass
class MnistCnn:
    """The numpy CNN as a ``Model`` (agent/model/contract.py)."""

    name: str = "mnist-cnn"
    input_shape: tuple[int, ...] = INPUT_SHAPE
    num_classes: int = NUM_CLASSES
    tensors: tuple[TensorSpec, ...] = TENSORS

    @property
    def param_count(self) -> int:
        return sum(t.size for t in self.tensors)

    def initial_params(self, seed: int) -> F32:
        return np.concatenate([w.ravel() for w in init_weights(seed)])

    def loss_and_grad(self, params: F32, x: F32, y: npt.NDArray[np.int64]) -> tuple[float, F32]:
        x = np.asarray(x, dtype=np.float32).reshape(-1, *INPUT_SHAPE)
        n = len(x)
        k1, _, k2, _, k3, _, k4, _ = _unflatten(params)
        logits, s = _forward(params, x)
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        loss = -float(log_probs[np.arange(n), y].mean())
        dlogits = np.exp(log_probs)
        dlogits[np.arange(n), y] -= 1.0
        dlogits /= n
        dk4, db4 = s["a3"].T @ dlogits, dlogits.sum(axis=0)
        da3 = (dlogits @ k4.T) * (s["a3"] > 0)
        dk3, db3 = s["flat"].T @ da3, da3.sum(axis=0)
        dp2 = (da3 @ k3.T).reshape(s["p2"].shape)
        dz2 = _pool_back(dp2, s["win2"], s["p2"], s["a2"].shape) * (s["a2"] > 0)
        dp1, dk2, db2 = _conv_back(dz2, s["cols2"], k2, s["p1"].shape, need_dx=True)
        assert dp1 is not None
        dz1 = _pool_back(dp1, s["win1"], s["p1"], s["a1"].shape) * (s["a1"] > 0)
        _, dk1, db1 = _conv_back(dz1, s["cols1"], k1, x.shape, need_dx=False)
        grads = (dk1, db1, dk2, db2, dk3, db3, dk4, db4)
        return loss, np.concatenate([g.ravel() for g in grads]).astype(np.float32)

    def predict(self, params: F32, x: F32) -> F32:
        x = np.asarray(x, dtype=np.float32).reshape(-1, *INPUT_SHAPE)
        chunks = [_forward(params, x[i:i + PREDICT_CHUNK])[0] for i in range(0, len(x), PREDICT_CHUNK)]
        return np.concatenate(chunks) if chunks else np.zeros((0, NUM_CLASSES), np.float32)


def factory() -> MnistCnn:
    return MnistCnn()
