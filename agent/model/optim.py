"""Optimizers as small state objects over the flat parameter vector.

``state_vector()`` is [step count, slot vectors...] as ONE flat float32 array, so that a
rejoining agent can copy the full training state from a peer and continue byte-identical.
The arithmetic (float32, operation order) is mirrored by the LiteRT ``apply`` signature.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt

from agent.protocol.schedule import LR_SCHEDULES as LR_SCHEDULES
from agent.protocol.schedule import scheduled_lr as scheduled_lr

F32 = npt.NDArray[np.float32]
OPTIMIZERS = ("sgd", "adam")


class Optimizer(Protocol):
    name: str
    lr: float

    def step(self, params: F32, grad: F32, out: F32 | None = None) -> F32:
        """The new parameters after one step with gradient ``grad`` (written into ``out``,
        which may be ``params`` itself, when given; a new array otherwise)."""
        ...

    def init_slots(self, param_count: int) -> None:
        """Allocate zeroed slots now, so that ``state_vector()`` has its final length."""
        ...

    def state_vector(self) -> F32: ...

    def write_state(self, out: F32) -> None:
        """``state_vector()`` written into ``out`` (a slice of the backend's state): one copy."""
        ...

    def load_state_vector(self, state: F32) -> None: ...

    def state_size(self, param_count: int) -> int:
        """Length of ``state_vector()`` for a model of ``param_count`` parameters."""
        ...


def _as_state(state: F32, name: str, slots: int) -> tuple[int, list[F32]]:
    """Split [step, slot_1..., slot_k...] into the step count and ``slots`` equal vectors."""
    state = np.asarray(state, dtype=np.float32)
    if state.ndim != 1 or state.size < 1 or (state.size - 1) % slots:
        raise ValueError(
            f"{name} state must be a flat float32 vector [step, {slots} equal slot vectors]"
        )
    n = (state.size - 1) // slots
    return int(state[0]), [state[1 + i * n : 1 + (i + 1) * n].copy() for i in range(slots)]


def _scratch(work: dict[str, F32], name: str, size: int) -> F32:
    """The float32 work vector ``name`` of ``size``, kept in ``work`` between steps (its
    contents are garbage: every step overwrites it before reading it)."""
    buf = work.get(name)
    if buf is None or buf.size != size:
        buf = work[name] = np.empty(size, dtype=np.float32)
    return buf


class SGD:
    """SGD with (heavy-ball) momentum: v = momentum*v + g; p = p - lr*v."""

    name = "sgd"

    def __init__(self, lr: float = 0.01, momentum: float = 0.0) -> None:
        self.lr = float(lr)
        self.momentum = float(momentum)
        self.steps = 0
        self.velocity: F32 | None = None
        self._work: dict[str, F32] = {}

    def init_slots(self, param_count: int) -> None:
        self.velocity = np.zeros(param_count, dtype=np.float32)

    def step(self, params: F32, grad: F32, out: F32 | None = None) -> F32:
        if self.velocity is None:
            self.init_slots(params.size)
        assert self.velocity is not None
        self.velocity *= np.float32(self.momentum)
        self.velocity += grad
        self.steps += 1
        # params - lr * velocity, with one scratch vector instead of two new ones per step.
        scaled = _scratch(self._work, "scaled", params.size)
        np.multiply(self.velocity, np.float32(self.lr), out=scaled)
        return np.subtract(params, scaled, out=out)

    def state_size(self, param_count: int) -> int:
        return 1 + param_count

    def state_vector(self) -> F32:
        size = 1 + (self.velocity.size if self.velocity is not None else 0)
        out = np.empty(size, dtype=np.float32)
        self.write_state(out)
        return out

    def write_state(self, out: F32) -> None:
        out[:1] = np.array([self.steps], dtype=np.float32)
        out[1:] = self.velocity if self.velocity is not None else 0

    def load_state_vector(self, state: F32) -> None:
        self.steps, (velocity,) = _as_state(state, "SGD", 1)
        self.velocity = velocity if velocity.size else None


def exact_power(base: float, exponent: int) -> float:
    """``base ** exponent`` by squaring, in float64 multiplications only.

    Not libm's ``pow``: its last bit differs between libm builds (x86_64 and aarch64, FMA or
    not), and agents on different CPUs must compute the same bias correction to the bit. IEEE
    multiplication is correctly rounded everywhere, so this is the same number on every machine.
    """
    if exponent < 0:
        raise ValueError("exponent must be >= 0")
    result, square = 1.0, float(base)
    while exponent:
        if exponent & 1:
            result *= square
        square *= square
        exponent >>= 1
    return result


def bias_corrections(b1: float, b2: float, step: int) -> tuple[np.float32, np.float32]:
    """Adam's (1 - b1**t, 1 - b2**t) for step ``t`` (1-based) as float32, bit-identical on
    every machine; the LiteRT graph takes them as an input instead of computing POW."""
    return (np.float32(1.0 - exact_power(b1, step)), np.float32(1.0 - exact_power(b2, step)))


class Adam:
    """Adam (Kingma & Ba) with bias correction, float32 throughout (the corrections come from
    ``bias_corrections``: float64 products, rounded once to float32)."""

    name = "adam"

    def __init__(
        self, lr: float = 1e-3, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-7
    ) -> None:
        self.lr, self.b1, self.b2, self.eps = float(lr), float(b1), float(b2), float(eps)
        self.steps = 0
        self.m: F32 | None = None
        self.v: F32 | None = None
        self._work: dict[str, F32] = {}

    def init_slots(self, param_count: int) -> None:
        self.m = np.zeros(param_count, dtype=np.float32)
        self.v = np.zeros(param_count, dtype=np.float32)

    def step(self, params: F32, grad: F32, out: F32 | None = None) -> F32:
        if self.m is None or self.v is None:
            self.init_slots(params.size)
        assert self.m is not None and self.v is not None
        self.steps += 1
        correction1, correction2 = bias_corrections(self.b1, self.b2, self.steps)
        f32 = np.float32
        # The formula of Kingma & Ba, evaluated in place (same operations in the same order,
        # so the same float32 bits as the LiteRT graph; a * b is b * a in IEEE arithmetic)
        # in two scratch vectors kept across steps: no 1.6 MB temporary per step (each new one
        # costs page faults once glibc returned the last one to the system).
        m, v = self.m, self.v
        a = _scratch(self._work, "a", params.size)
        b = _scratch(self._work, "b", params.size)
        m *= f32(self.b1)
        m += np.multiply(grad, f32(1.0 - self.b1), out=a)
        g2 = np.multiply(grad, grad, out=b)
        g2 *= f32(1.0 - self.b2)
        v *= f32(self.b2)
        v += g2
        m_hat = np.divide(m, correction1, out=a)
        v_hat = np.divide(v, correction2, out=b)
        m_hat *= f32(self.lr)
        np.sqrt(v_hat, out=v_hat)
        v_hat += f32(self.eps)
        m_hat /= v_hat
        return np.subtract(params, m_hat, out=out)

    def state_size(self, param_count: int) -> int:
        return 1 + 2 * param_count

    def state_vector(self) -> F32:
        size = 1 + sum(s.size for s in (self.m, self.v) if s is not None)
        out = np.empty(size, dtype=np.float32)
        self.write_state(out)
        return out

    def write_state(self, out: F32) -> None:
        out[:1] = np.array([self.steps], dtype=np.float32)
        at = 1
        for slot in (self.m, self.v):
            if slot is not None:
                out[at : at + slot.size] = slot
                at += slot.size
        out[at:] = 0  # slots not allocated yet: nothing to copy

    def load_state_vector(self, state: F32) -> None:
        self.steps, (m, v) = _as_state(state, "Adam", 2)
        self.m, self.v = (m, v) if m.size else (None, None)


DEFAULT_LR = {"sgd": 0.01, "adam": 1e-3}


def make_optimizer(name: str, lr: float | None = None, momentum: float = 0.9) -> SGD | Adam:
    """``sgd`` (default lr 0.01, momentum 0.9) or ``adam`` (default lr 1e-3)."""
    if name == "sgd":
        return SGD(lr=DEFAULT_LR["sgd"] if lr is None else lr, momentum=momentum)
    if name == "adam":
        return Adam(lr=DEFAULT_LR["adam"] if lr is None else lr)
    raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")
