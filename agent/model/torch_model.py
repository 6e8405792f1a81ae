"""A PyTorch ``torch.nn.Module`` behind the model contract (the Python path; docs/MODELS.md,
"PyTorch").

The module's trainable parameters (``requires_grad``) in ``named_parameters()`` order are the
flat vector; frozen parameters and buffers stay inside the module as constants (a pretrained
base under a trained head). ``torch.func`` gives the loss's gradient with respect to the
flat vector itself (``functional_call`` over views of it), so no parameter is written in
place and the agent keeps the optimizer. The module runs in evaluation mode (dropout off,
batch norm on its buffers): every agent computes the same function of the parameters.
Imported only when a user's factory builds a ``TorchModel``: torch is an optional extra.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from agent.model.contract import F32, Labels, ModelError, TensorSpec


class TorchModel:
    """``Model`` over a module that ``build()`` returns (called under ``torch.manual_seed(seed)``
    for each seed's initial weights); scores are the module's output, the loss its mean
    cross-entropy (the output taken as logits)."""

    def __init__(self, build: Callable[[], Any], input_shape: tuple[int, ...], num_classes: int,
                 name: str = "torch-model", threads: int = 1) -> None:
        import torch

        torch.set_num_threads(threads)  # as the agent's BLAS: one core per agent
        self._torch, self._build = torch, build
        self.name, self.input_shape, self.num_classes = name, tuple(input_shape), int(num_classes)
        self.module = self._built(0)
        trained = [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]
        if not trained:
            raise ModelError(f"model {name}: the module has no trainable parameters")
        self._names = [n for n, _ in trained]
        self.tensors = tuple(TensorSpec(n, tuple(int(d) for d in p.shape)) for n, p in trained)
        self._sizes = [t.size for t in self.tensors]
        self._initial: dict[int, F32] = {}
        self._gradient = torch.func.grad_and_value(self._loss)

    @property
    def param_count(self) -> int:
        return sum(self._sizes)

    def _built(self, seed: int) -> Any:
        self._torch.manual_seed(seed)
        module = self._build()
        if not isinstance(module, self._torch.nn.Module):
            raise ModelError(f"model {self.name}: the builder gave a {type(module).__name__}, "
                             "not a torch.nn.Module")
        return module.float().eval()

    def initial_params(self, seed: int) -> F32:
        if seed not in self._initial:
            module = self.module if seed == 0 else self._built(seed)
            trained = dict(module.named_parameters())
            self._initial[seed] = np.concatenate(
                [trained[n].detach().numpy().ravel() for n in self._names]).astype(np.float32)
        return self._initial[seed].copy()

    def _weights(self, flat: Any) -> dict[str, Any]:
        parts = self._torch.split(flat, self._sizes)
        return {n: p.view(t.shape) for n, p, t in zip(self._names, parts, self.tensors, strict=True)}

    def _scores(self, flat: Any, x: Any) -> Any:
        return self._torch.func.functional_call(self.module, self._weights(flat), (x,))

    def _loss(self, flat: Any, x: Any, y: Any) -> Any:
        return self._torch.nn.functional.cross_entropy(self._scores(flat, x), y)

    def loss_and_grad(self, params: F32, x: F32, y: Labels) -> tuple[float, F32]:
        torch = self._torch
        grad, loss = self._gradient(torch.from_numpy(np.ascontiguousarray(params, np.float32)),
                                    self._batch(x), torch.from_numpy(np.asarray(y, np.int64)))
        return float(loss), grad.numpy().astype(np.float32, copy=False)

    def predict(self, params: F32, x: F32) -> F32:
        with self._torch.no_grad():
            scores = self._scores(self._torch.from_numpy(np.ascontiguousarray(params, np.float32)),
                                  self._batch(x))
        return np.asarray(scores.numpy(), dtype=np.float32)

    def _batch(self, x: F32) -> Any:
        return self._torch.from_numpy(
            np.ascontiguousarray(x, dtype=np.float32).reshape(-1, *self.input_shape))
