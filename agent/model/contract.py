"""The model contract: what a user's model gives the agent (docs/MODELS.md explains it).

A model is a flat float32 parameter vector plus a few functions over it. The agent keeps the
optimizer, so the fleet's arithmetic stays the agent's: every agent applies the same averaged
gradient with the same numpy optimizer and holds bit-identical parameters.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from agent.model.flat import params_hash

F32 = npt.NDArray[np.float32]
Labels = npt.NDArray[np.int64]


@dataclass(frozen=True)
class TensorSpec:
    """One parameter tensor inside the flat vector, in order. A ``running`` tensor holds
    statistics, not weights (batch norm's moving mean and variance, exported with
    ``--batch-norm train``): its share of a gradient is the step to add to it, which the fleet
    averages like any gradient and the agent adds as it is, outside the optimizer."""

    name: str
    shape: tuple[int, ...]
    running: bool = False

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


@runtime_checkable
class Model(Protocol):
    """A user's model: a flat float32 parameter vector plus these functions. The agent owns
    the optimizer, so the fleet's arithmetic stays the agent's (bit-identical across agents)."""

    name: str  # e.g. "mnist-cnn"
    input_shape: tuple[int, ...]  # ONE sample's shape, e.g. (28, 28, 1) or (784,)
    num_classes: int  # labels are ints in [0, num_classes)
    tensors: tuple[TensorSpec, ...]  # layout of the flat vector; param_count = sum of sizes

    @property
    def param_count(self) -> int: ...

    def initial_params(self, seed: int) -> F32:
        """(param_count,) float32; the same seed gives the same vector on every machine."""
        ...

    def loss_and_grad(self, params: F32, x: F32, y: Labels) -> tuple[float, F32]:
        """Mean loss over the batch and its flat gradient (param_count,)."""
        ...

    def predict(self, params: F32, x: F32) -> F32:
        """(n, num_classes) scores (logits or probabilities: argmax is the prediction)."""
        ...


class ModelError(Exception):
    """What a user's model did wrong, one line, said to the user."""


def fingerprint(model: Model, seed: int) -> str:
    """16 hex chars identifying the model a fleet trains: the tensors' shapes in order, the
    parameter count, input shape, number of classes and the hash of the initial weights for
    ``seed``. The name is left out: two builds of one architecture under different names are
    the same model. Different models (or different initial weights) differ."""
    shapes = ";".join(",".join(str(d) for d in t.shape) for t in model.tensors)
    facts = (
        f"tensors={shapes}|params={int(model.param_count)}"
        f"|input={','.join(str(d) for d in model.input_shape)}|classes={int(model.num_classes)}"
        f"|init={params_hash(np.asarray(model.initial_params(seed), dtype=np.float32)):08x}"
    )
    return hashlib.sha256(facts.encode()).hexdigest()[:16]
