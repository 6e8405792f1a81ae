"""A small numpy network for scikit-learn's 8x8 digits: 64 -> 128 (ReLU) -> 10.

An example of the Python model path (docs/MODELS.md): ``factory()`` returns an object with
the contract's attributes and three functions over ONE flat float32 parameter vector. The
agent keeps the optimizer; this file only says how to get a loss, a gradient and scores.

    edgegrove model check examples/digits/model.py:factory --dataset digits
    edgegrove agent --model examples/digits/model.py:factory --dataset digits ...
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from agent.model.contract import TensorSpec

F32 = npt.NDArray[np.float32]
N_IN, N_HIDDEN, N_OUT = 64, 128, 10


class DigitsMLP:
    name = "digits-mlp"
    input_shape = (N_IN,)
    num_classes = N_OUT
    tensors = (
        TensorSpec("dense/kernel", (N_IN, N_HIDDEN)),
        TensorSpec("dense/bias", (N_HIDDEN,)),
        TensorSpec("logits/kernel", (N_HIDDEN, N_OUT)),
        TensorSpec("logits/bias", (N_OUT,)),
    )

    @property
    def param_count(self) -> int:
        return sum(int(np.prod(t.shape)) for t in self.tensors)

    def _unpack(self, params: F32) -> list[F32]:
        out, at = [], 0
        for tensor in self.tensors:
            size = int(np.prod(tensor.shape))
            out.append(params[at : at + size].reshape(tensor.shape))
            at += size
        return out

    def initial_params(self, seed: int) -> F32:
        """He-uniform kernels, zero biases; the same seed gives the same vector everywhere."""
        rng = np.random.default_rng(seed)
        parts = []
        for tensor in self.tensors:
            if len(tensor.shape) == 2:
                limit = np.sqrt(6.0 / tensor.shape[0])
                parts.append(rng.uniform(-limit, limit, tensor.shape).astype(np.float32).ravel())
            else:
                parts.append(np.zeros(tensor.shape, dtype=np.float32))
        return np.concatenate(parts)

    def _forward(self, params: F32, x: F32) -> tuple[F32, F32, F32]:
        w1, b1, w2, b2 = self._unpack(params)
        pre = x.reshape(len(x), N_IN) @ w1 + b1
        hidden = np.maximum(pre, 0)
        return pre, hidden, hidden @ w2 + b2

    def predict(self, params: F32, x: F32) -> F32:
        return self._forward(params, x)[2]

    def loss_and_grad(self, params: F32, x: F32, y: npt.NDArray[np.int64]) -> tuple[float, F32]:
        """Mean softmax cross-entropy and its gradient, in the order of ``tensors``."""
        x = x.reshape(len(x), N_IN)
        w2 = self._unpack(params)[2]
        pre, hidden, logits = self._forward(params, x)
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        rows = np.arange(len(y))
        loss = float(-log_probs[rows, y].mean())
        d_logits = np.exp(log_probs)
        d_logits[rows, y] -= 1
        d_logits /= np.float32(len(y))
        d_hidden = (d_logits @ w2.T) * (pre > 0)
        grads = (x.T @ d_hidden, d_hidden.sum(axis=0), hidden.T @ d_logits, d_logits.sum(axis=0))
        return loss, np.concatenate([g.ravel() for g in grads]).astype(np.float32)


def factory() -> DigitsMLP:
    return DigitsMLP()
