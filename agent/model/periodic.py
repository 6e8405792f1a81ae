"""Periodic averaging (local SGD, FedAvg, DiLoCo): H local steps, then one averaged delta.

``PeriodicTrainer`` wraps a backend. Between syncs it takes local optimizer steps on a working
copy of the parameters; what the fleet averages is the pseudo-gradient ``anchor - params``
(the parameters at the last sync minus the parameters now). The outer optimizer applies the
fleet's mean to the anchor, and every member, starting from the same anchor with the same
mean and the same float32 arithmetic, holds the same bits afterwards.

The trainer presents the synced model as *the* model: ``params``, ``model_hash``, ``state``
and evaluation see the anchor, never a working copy half way through its local steps, so the
state a peer serves and the hash a round carries are the fleet's. The fleet's state is the
anchor plus the outer optimizer's momentum; the inner optimizer's slots are each member's
own (as DiLoCo keeps one inner AdamW per worker: they follow that member's data) and are not
part of it, so a rejoiner continues with its own inner slots (zero when it starts afresh).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import numpy.typing as npt

from agent.model.contract import ModelError
from agent.model.flat import check_flat, params_hash

if TYPE_CHECKING:
    from agent.model.backend import Backend

F32 = npt.NDArray[np.float32]
OuterName = Literal["avg", "nesterov"]
OUTER_OPTIMIZERS: tuple[OuterName, ...] = ("avg", "nesterov")
# DiLoCo's outer optimizer: Nesterov momentum 0.9 at learning rate 0.7.
NESTEROV_MOMENTUM = 0.9
DEFAULT_OUTER_LR: dict[OuterName, float] = {"avg": 1.0, "nesterov": 0.7}


@dataclass(frozen=True)
class OuterConfig:
    name: OuterName = "avg"
    lr: float = 1.0
    momentum: float = NESTEROV_MOMENTUM


class NonFiniteError(ModelError):
    """The fleet's mean delta holds NaN or inf: the model is stopped, never stepped with it."""


class OuterOptimizer:
    """``avg``: anchor -= lr * mean (lr 1: the members' mean parameters, FedAvg / local SGD).
    ``nesterov``: m = mu*m + g; anchor -= lr * (g + mu*m) (torch's SGD(nesterov=True))."""

    def __init__(self, config: OuterConfig, size: int) -> None:
        self.config = config
        self.momentum = np.zeros(size, np.float32) if config.name == "nesterov" else None

    @property
    def state_size(self) -> int:
        return 0 if self.momentum is None else self.momentum.size

    def step(self, anchor: F32, mean_delta: F32) -> F32:
        f32 = np.float32
        update = mean_delta
        if self.momentum is not None:
            self.momentum *= f32(self.config.momentum)
            self.momentum += mean_delta
            update = mean_delta + f32(self.config.momentum) * self.momentum
        return np.asarray(anchor - f32(self.config.lr) * update, dtype=np.float32)

    def state(self) -> F32:
        return np.zeros(0, np.float32) if self.momentum is None else self.momentum.copy()

    def load(self, state: F32) -> None:
        if self.momentum is not None:
            self.momentum = np.asarray(state, np.float32).copy()


class PeriodicTrainer:
    """A ``Backend`` whose round vector is the model delta of ``local_round``'s local steps and
    whose ``apply`` is the outer optimizer's step with the fleet's mean delta."""

    def __init__(self, inner: Backend, outer: OuterConfig) -> None:
        self.inner = inner
        self.name = inner.name
        self.anchor = inner.params()
        self.outer = OuterOptimizer(outer, self.anchor.size)
        self._hash: int | None = None

    # -- the local steps and the sync -------------------------------------------------------

    def local_round(self, batches: Iterator[tuple[np.ndarray, np.ndarray]], steps: int,
                    between: Callable[[], None] | None = None) -> tuple[float, F32]:
        """``steps`` inner optimizer steps from the anchor, one batch each: (mean loss, delta).
        ``between`` runs after each step but the last (the driver hears its transport); should
        it install another anchor meanwhile (the fleet's state), the delta is from that one."""
        self.inner.set_params(self.anchor)
        losses = []
        for step in range(steps):
            loss, grad = self.inner.gradients(*next(batches))
            self.inner.apply(grad)
            losses.append(float(loss))
            if between is not None and step < steps - 1:
                working = self.inner.params()
                between()
                self.inner.set_params(working)  # what ran meanwhile may have read the anchor
        delta = np.subtract(self.anchor, self.inner.params(), dtype=np.float32)
        return float(np.mean(losses)), delta

    def apply(self, grad: F32) -> None:
        """The sync: the outer step with the fleet's mean delta (own values where it had none)."""
        mean = check_flat(grad, self.anchor.size, "mean delta")
        if not math.isfinite(float(np.sum(mean, dtype=np.float64))):
            raise NonFiniteError("the fleet's mean model delta holds NaN or inf: not applied")
        self._set_anchor(self.outer.step(self.anchor, mean))

    def _set_anchor(self, anchor: F32) -> None:
        self.anchor = anchor
        self.inner.set_params(anchor)
        self._hash = None

    # -- the Backend the runtime sees: the synced model -------------------------------------

    def params(self) -> F32:
        return self.anchor.copy()

    def set_params(self, flat: F32) -> None:
        self._set_anchor(check_flat(flat, self.anchor.size, "params").copy())

    def gradients(self, x: F32, y: npt.NDArray[np.integer]) -> tuple[float, F32]:
        self.inner.set_params(self.anchor)
        return self.inner.gradients(x, y)

    def set_learning_rate(self, lr: float) -> None:
        self.inner.set_learning_rate(lr)  # the inner steps' rate; the outer one is fixed

    def evaluate(self, x: F32, y: npt.NDArray[np.integer]) -> tuple[float, float]:
        self.inner.set_params(self.anchor)
        return self.inner.evaluate(x, y)

    def accuracy(self, x: F32, y: npt.NDArray[np.integer]) -> float:
        self.inner.set_params(self.anchor)
        return self.inner.accuracy(x, y)

    def state(self) -> F32:
        return np.concatenate([self.anchor, self.outer.state()]).astype(np.float32, copy=False)

    def load_state(self, state: F32) -> None:
        size = self.anchor.size
        state = check_flat(state, size + self.outer.state_size, "state")
        self.outer.load(state[size:])
        self._set_anchor(state[:size].copy())

    def model_hash(self) -> int:
        if self._hash is None:
            self._hash = params_hash(self.anchor)
        return self._hash
