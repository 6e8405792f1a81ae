"""The thesis MLP (784 -> 512 ReLU -> 10, ``agent.model.mlp``) as a contract ``Model``."""

from __future__ import annotations

import numpy as np

from agent.model import mlp
from agent.model.contract import F32, Labels, TensorSpec


class MlpModel:
    """``initial_params(seed)`` are the weights ``make_backend`` draws from
    ``default_rng(seed)``, so the spec "mlp" trains exactly what the thesis trains."""

    name = "mlp"
    input_shape: tuple[int, ...] = (mlp.N_IN,)
    num_classes = mlp.N_OUT
    tensors = tuple(TensorSpec(n, s) for n, s in zip(("w1", "b1", "w2", "b2"), mlp.SHAPES, strict=True))

    @property
    def param_count(self) -> int:
        return mlp.PARAM_COUNT

    def initial_params(self, seed: int) -> F32:
        return mlp.init_params(np.random.default_rng(seed))

    def loss_and_grad(self, params: F32, x: F32, y: Labels) -> tuple[float, F32]:
        loss, grad = mlp.loss_and_grad(params, x.reshape(len(x), mlp.N_IN), y)
        return loss, grad.astype(np.float32, copy=False)

    def predict(self, params: F32, x: F32) -> F32:
        return mlp.forward(params, x.reshape(len(x), mlp.N_IN)).astype(np.float32, copy=False)
