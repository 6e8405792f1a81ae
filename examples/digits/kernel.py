"""An RBF-kernel classifier for scikit-learn's 8x8 digits, trained by gradients, in numpy.

scikit-learn's published result on this split is an RBF support vector machine
(``SVC(gamma=0.001)``, accuracy 0.97). A kernel machine is not a flat parameter vector, but its
random-features approximation is (Rahimi and Recht, "Random Features for Large-Scale Kernel
Machines", NIPS 2007): ``z(x) = sqrt(2/D) cos(W x + b)`` with ``W ~ N(0, 2 gamma)`` and
``b ~ U(0, 2 pi)`` gives ``z(x) . z(x') ~ exp(-gamma |x - x'|^2)``. The features are fixed (drawn
once from a constant seed: every agent has the same ones); the trained parameters are a linear
softmax layer over them (kernel logistic regression). Another example of the Python model path
(docs/MODELS.md).

    edgegrove model check examples/digits/kernel.py:factory --dataset digits
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from agent.model.contract import TensorSpec

F32 = npt.NDArray[np.float32]
N_IN, N_FEATURES, N_OUT = 64, 3000, 10
GAMMA = 0.001  # scikit-learn's example, on pixel values 0..16
FEATURE_SEED = 12345  # part of the model, not of the run: every agent draws the same features
PIXEL_MAX = 16.0  # the agent's digits are scaled to [0, 1]; the kernel's gamma is for 0..16


class DigitsKernel:
    name = "digits-rbf-features"
    input_shape = (N_IN,)
    num_classes = N_OUT
    tensors = (TensorSpec("softmax/kernel", (N_FEATURES, N_OUT)), TensorSpec("softmax/bias", (N_OUT,)))

    def __init__(self) -> None:
        rng = np.random.default_rng(FEATURE_SEED)
        self.projection = (rng.normal(0.0, np.sqrt(2 * GAMMA), (N_IN, N_FEATURES)) * PIXEL_MAX).astype(np.float32)
        self.phase = rng.uniform(0.0, 2 * np.pi, N_FEATURES).astype(np.float32)
        self.scale = np.float32(np.sqrt(2.0 / N_FEATURES))

    @property
    def param_count(self) -> int:
        return N_FEATURES * N_OUT + N_OUT

    def initial_params(self, seed: int) -> F32:
        """Zeros: the loss is convex in the softmax layer, so no random start is needed."""
        return np.zeros(self.param_count, dtype=np.float32)

    def features(self, x: F32) -> F32:
        z = np.cos(x.reshape(len(x), N_IN).astype(np.float32) @ self.projection + self.phase)
        return (z * self.scale).astype(np.float32)

    def predict(self, params: F32, x: F32) -> F32:
        kernel, bias = params[:-N_OUT].reshape(N_FEATURES, N_OUT), params[-N_OUT:]
        return self.features(x).astype(params.dtype) @ kernel + bias

    def loss_and_grad(self, params: F32, x: F32, y: npt.NDArray[np.int64]) -> tuple[float, F32]:
        """Mean softmax cross-entropy and its gradient (kernel, then bias)."""
        z = self.features(x).astype(params.dtype)
        logits = z @ params[:-N_OUT].reshape(N_FEATURES, N_OUT) + params[-N_OUT:]
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        rows = np.arange(len(y))
        d_logits = np.exp(log_probs)
        d_logits[rows, y] -= 1
        d_logits /= len(y)
        grad = np.concatenate([(z.T @ d_logits).ravel(), d_logits.sum(axis=0)])
        return float(-log_probs[rows, y].mean()), grad.astype(params.dtype)


def factory() -> DigitsKernel:
    return DigitsKernel()
