"""The small interface the agent runtime trains through, and its numpy implementation.

A backend owns the parameters and the optimizer state. ``state()`` is params followed by the
optimizer's ``state_vector()`` (step count + slots) as one flat float32 vector: a rejoining
agent loads a peer's state and continues byte-identical with it.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np
import numpy.typing as npt

from agent.model import mlp
from agent.model.contract import Model, ModelError
from agent.model.flat import check_flat, params_hash
from agent.model.optim import SGD, Adam, make_optimizer

F32 = npt.NDArray[np.float32]
BACKENDS = ("numpy", "litert")


class Backend(Protocol):
    name: str

    def params(self) -> F32: ...

    def set_params(self, flat: F32) -> None: ...

    def gradients(self, x: F32, y: npt.NDArray[np.integer]) -> tuple[float, F32]:
        """(mean loss, flat gradient) on one batch; the parameters do not change."""
        ...

    def apply(self, grad: F32) -> None:
        """One optimizer step with the (averaged) gradient."""
        ...

    def set_learning_rate(self, lr: float) -> None:
        """The rate of the next ``apply`` calls (schedules change it between rounds)."""
        ...

    def evaluate(self, x: F32, y: npt.NDArray[np.integer]) -> tuple[float, float]:
        """(mean loss, accuracy)."""
        ...

    def accuracy(self, x: F32, y: npt.NDArray[np.integer]) -> float:
        """The fraction of ``x`` classified as ``y``: scores only, no loss or gradient (what
        the agent's periodic evaluation needs, at a third of ``evaluate``'s cost for a CNN)."""
        ...

    def state(self) -> F32: ...

    def load_state(self, state: F32) -> None: ...

    def model_hash(self) -> int: ...


__all__ = ["BACKENDS", "Backend", "ModelBackend", "NonFiniteError", "NumpyBackend", "check_flat",
           "make_backend", "params_hash"]


class NonFiniteError(ModelError):
    """The model produced a NaN or inf loss or gradient: it is stopped, never averaged in."""


class NumpyBackend:
    """The reference backend: ``agent.model.mlp`` + an optimizer from ``agent.model.optim``."""

    name = "numpy"

    def __init__(self, params: F32, optimizer: SGD | Adam) -> None:
        self._params = check_flat(params, mlp.PARAM_COUNT, "params").copy()
        self.optimizer = optimizer
        optimizer.init_slots(mlp.PARAM_COUNT)
        self.state_size = mlp.PARAM_COUNT + optimizer.state_size(mlp.PARAM_COUNT)
        # CRC of 1.6 MB costs ~1.5 ms and the runtime asks twice a round: computed once per
        # parameter change (every assignment of _params below resets it).
        self._hash: int | None = None

    def params(self) -> F32:
        return self._params.copy()

    def set_params(self, flat: F32) -> None:
        self._params = check_flat(flat, mlp.PARAM_COUNT, "params").copy()
        self._hash = None

    def gradients(self, x: F32, y: npt.NDArray[np.integer]) -> tuple[float, F32]:
        loss, grad = mlp.loss_and_grad(self._params, x, y)
        return loss, grad.astype(np.float32, copy=False)

    def apply(self, grad: F32) -> None:
        grad = check_flat(grad, mlp.PARAM_COUNT, "gradient")
        # In place: params() and state() hand out copies, nobody else holds _params.
        self.optimizer.step(self._params, grad, out=self._params)
        self._hash = None

    def set_learning_rate(self, lr: float) -> None:
        self.optimizer.lr = float(lr)

    def evaluate(self, x: F32, y: npt.NDArray[np.integer]) -> tuple[float, float]:
        logits = mlp.forward(self._params, x)
        return mlp.cross_entropy(logits, y), float(np.mean(np.argmax(logits, axis=1) == y))

    def accuracy(self, x: F32, y: npt.NDArray[np.integer]) -> float:
        return float(np.mean(np.argmax(mlp.forward(self._params, x), axis=1) == y))

    def state(self) -> F32:
        # One copy of the 4.9 MB (concatenate + astype of the optimizer's own concatenation
        # made four): a checkpoint or a pull served takes it while the fleet waits.
        state = np.empty(self.state_size, dtype=np.float32)
        state[: mlp.PARAM_COUNT] = self._params
        self.optimizer.write_state(state[mlp.PARAM_COUNT :])
        return state

    def load_state(self, state: F32) -> None:
        state = check_flat(state, self.state_size, "state")
        self._params = state[: mlp.PARAM_COUNT].copy()
        self._hash = None
        self.optimizer.load_state_vector(state[mlp.PARAM_COUNT :])

    def model_hash(self) -> int:
        if self._hash is None:
            self._hash = params_hash(self._params)
        return self._hash


def running_slices(model: Model) -> list[slice]:
    """Where the model's running tensors (``TensorSpec.running``) sit in its flat vector."""
    parts, start = [], 0
    for tensor in model.tensors:
        if getattr(tensor, "running", False):
            parts.append(slice(start, start + tensor.size))
        start += tensor.size
    return parts


class ModelBackend:
    """Any contract ``Model`` with an optimizer from ``agent.model.optim``: the model computes
    loss, gradients and predictions, the agent's numpy optimizer applies the fleet's average
    (so agents of one model hold bit-identical parameters whatever computes their gradients)."""

    name = "model"

    def __init__(self, model: Model, params: F32, optimizer: SGD | Adam) -> None:
        self.model = model
        self.size = int(model.param_count)
        self._params = check_flat(params, self.size, "params").copy()
        self.optimizer = optimizer
        optimizer.init_slots(self.size)
        self.state_size = self.size + optimizer.state_size(self.size)
        self._running = running_slices(model)
        self._hash: int | None = None

    def params(self) -> F32:
        return self._params.copy()

    def set_params(self, flat: F32) -> None:
        self._params = check_flat(flat, self.size, "params").copy()
        self._hash = None

    def gradients(self, x: F32, y: npt.NDArray[np.integer]) -> tuple[float, F32]:
        loss, grad = self.model.loss_and_grad(self._params, x, np.asarray(y, dtype=np.int64))
        grad = check_flat(grad, self.size, f"model {self.model.name}'s gradient")
        loss = float(loss)
        if not (math.isfinite(loss) and _all_finite(grad)):
            what = f"loss {loss}" if not math.isfinite(loss) else "a gradient holding NaN or inf"
            raise NonFiniteError(f"model {self.model.name} produced {what} on a batch: stopped before "
                                 "the fleet averages it (lower the learning rate, or check the model's "
                                 "loss for log(0) or overflow)")
        return loss, grad

    def apply(self, grad: F32) -> None:
        grad = check_flat(grad, self.size, "gradient")
        if not _all_finite(grad):
            raise NonFiniteError("the fleet's averaged gradient holds NaN or inf: not applied")
        steps = [(part, grad[part].copy()) for part in self._running]
        if steps:  # running statistics: added as they are; the optimizer sees zeros (no step)
            grad = grad.copy()
            for part, _ in steps:
                grad[part] = 0.0
        self.optimizer.step(self._params, grad, out=self._params)
        for part, step in steps:
            self._params[part] += step
        self._hash = None

    def set_learning_rate(self, lr: float) -> None:
        self.optimizer.lr = float(lr)

    def evaluate(self, x: F32, y: npt.NDArray[np.integer]) -> tuple[float, float]:
        """(mean loss, accuracy): the loss is the model's own (its ``loss_and_grad``)."""
        labels = np.asarray(y, dtype=np.int64)
        loss, _ = self.model.loss_and_grad(self._params, x, labels)
        scores = self.model.predict(self._params, x)
        return float(loss), float(np.mean(np.argmax(scores, axis=1) == labels))

    def accuracy(self, x: F32, y: npt.NDArray[np.integer]) -> float:
        scores = self.model.predict(self._params, x)
        return float(np.mean(np.argmax(scores, axis=1) == np.asarray(y, dtype=np.int64)))

    def state(self) -> F32:
        state = np.empty(self.state_size, dtype=np.float32)
        state[: self.size] = self._params
        self.optimizer.write_state(state[self.size :])
        return state

    def load_state(self, state: F32) -> None:
        state = check_flat(state, self.state_size, "state")
        self._params = state[: self.size].copy()
        self._hash = None
        self.optimizer.load_state_vector(state[self.size :])

    def model_hash(self) -> int:
        if self._hash is None:
            self._hash = params_hash(self._params)
        return self._hash


def _all_finite(values: F32) -> bool:
    # A float64 sum is NaN or inf exactly when a value is (float32 values cannot overflow it),
    # without a bool array the size of the model per step.
    return math.isfinite(float(np.sum(values, dtype=np.float64)))


def make_backend(
    name: str,
    rng: np.random.Generator,
    optimizer: str = "adam",
    lr: float | None = None,
    momentum: float = 0.9,
    model: str | Model = "mlp",
    seed: int | None = None,
) -> Backend:
    """A fresh backend. The thesis MLP ("mlp") draws its parameters from ``rng`` (same rng ->
    same weights); any other model (a spec for ``load_model`` or a loaded Model) starts from
    ``initial_params(seed)``, the seed drawn from ``rng`` when not given."""
    if model == "mlp" or _is_thesis_mlp(model):
        return _thesis_backend(name, rng, make_optimizer(optimizer, lr, momentum))
    from agent.model.loader import load_model

    loaded = load_model(model) if isinstance(model, str) else model
    is_tflite = type(loaded).__name__ == "TfliteModel"
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    if (name == "litert") != is_tflite:
        raise ModelError(f"backend {name} cannot run model {loaded.name}: a .tflite model runs on "
                         "backend litert, a Python model on backend numpy")
    start = int(rng.integers(0, 2**31 - 1)) if seed is None else seed
    return ModelBackend(loaded, loaded.initial_params(start), make_optimizer(optimizer, lr, momentum))


def _is_thesis_mlp(model: str | Model) -> bool:
    from agent.model.mlp_model import MlpModel

    return isinstance(model, MlpModel)


def _thesis_backend(name: str, rng: np.random.Generator, opt: SGD | Adam) -> Backend:
    params = mlp.init_params(rng)
    if name == "numpy":
        return NumpyBackend(params, opt)
    if name == "litert":
        from agent.model.litert_backend import LitertBackend  # lazy: optional dependency

        return LitertBackend(params, opt)
    raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
