"""ModelBackend over a user's Model; make_backend's routing; NaN/inf never reaches the average."""

from __future__ import annotations

import numpy as np
import pytest

from agent.model import mlp
from agent.model.backend import ModelBackend, NonFiniteError, NumpyBackend, make_backend
from agent.model.contract import ModelError
from agent.model.datasets import load_digits
from agent.model.loader import check_model
from agent.model.optim import Adam, make_optimizer
from examples.digits.kernel import DigitsKernel
from examples.digits.model import DigitsMLP


class NanAfter(DigitsMLP):
    """The digits model, whose loss goes NaN from its ``after``-th call on."""

    def __init__(self, after: int, gradient_only: bool = False) -> None:
        self.after, self.calls, self.gradient_only = after, 0, gradient_only

    def loss_and_grad(self, params, x, y):  # type: ignore[no-untyped-def]
        self.calls += 1
        loss, grad = super().loss_and_grad(params, x, y)
        if self.calls > self.after:
            if self.gradient_only:
                grad = grad.copy()
                grad[3] = np.inf
            else:
                loss = float("nan")
        return loss, grad


def test_mlp_spec_keeps_the_thesis_backend_bit_for_bit() -> None:
    old = NumpyBackend(mlp.init_params(np.random.default_rng(4)), make_optimizer("adam"))
    new = make_backend("numpy", np.random.default_rng(4), "adam", model="mlp")
    assert isinstance(new, NumpyBackend)
    assert np.array_equal(old.params(), new.params())


def test_user_model_starts_from_its_seeded_initial_params() -> None:
    backend = make_backend("numpy", np.random.default_rng(0), model=DigitsMLP(), seed=7)
    assert isinstance(backend, ModelBackend)
    assert np.array_equal(backend.params(), DigitsMLP().initial_params(7))


def test_python_model_on_litert_backend_is_refused() -> None:
    with pytest.raises(ModelError, match="a Python model on backend numpy"):
        make_backend("litert", np.random.default_rng(0), model=DigitsMLP(), seed=0)


def test_model_backend_trains_and_its_state_round_trips() -> None:
    data = load_digits()
    backend = ModelBackend(DigitsMLP(), DigitsMLP().initial_params(0), Adam(lr=3e-3))
    before, _ = backend.evaluate(data.x_test, data.y_test)
    for start in [*range(0, 864, 32)] * 3:
        _, grad = backend.gradients(data.x_train[start:start + 32], data.y_train[start:start + 32])
        backend.apply(grad)
    after, accuracy = backend.evaluate(data.x_test, data.y_test)
    assert after < before - 1.5 and accuracy > 0.85
    assert backend.accuracy(data.x_test, data.y_test) == accuracy
    twin = ModelBackend(DigitsMLP(), DigitsMLP().initial_params(9), Adam(lr=3e-3))
    twin.load_state(backend.state())
    assert twin.model_hash() == backend.model_hash()
    grad = backend.gradients(data.x_train[:32], data.y_train[:32])[1]
    backend.apply(grad)
    twin.apply(grad)
    assert np.array_equal(twin.params(), backend.params())


@pytest.mark.parametrize("model", [DigitsMLP(), DigitsKernel()], ids=["mlp", "kernel"])
def test_example_gradients_match_finite_differences(model: DigitsMLP | DigitsKernel) -> None:
    check_model(model, model.name)
    params = model.initial_params(1).astype(np.float64)
    params += np.random.default_rng(2).normal(0, 0.1, params.size)  # the kernel starts at zeros
    data = load_digits()
    x, y = data.x_train[:8].astype(np.float64), data.y_train[:8]
    _, grad = model.loss_and_grad(params, x, y)  # type: ignore[arg-type]
    for i in (0, 700, 8200, 9000, model.param_count - 5):
        step = np.zeros_like(params)
        step[i] = 1e-6
        plus, _ = model.loss_and_grad(params + step, x, y)  # type: ignore[arg-type]
        minus, _ = model.loss_and_grad(params - step, x, y)  # type: ignore[arg-type]
        assert abs((plus - minus) / 2e-6 - grad[i]) < 1e-4


@pytest.mark.parametrize("gradient_only", [False, True])
def test_non_finite_loss_or_gradient_stops_before_it_is_shared(gradient_only: bool) -> None:
    data = load_digits()
    model = NanAfter(2, gradient_only)
    backend = ModelBackend(model, model.initial_params(0), Adam())
    for _ in range(2):
        backend.gradients(data.x_train[:16], data.y_train[:16])
    with pytest.raises(NonFiniteError, match="stopped before the fleet averages it") as info:
        backend.gradients(data.x_train[:16], data.y_train[:16])
    assert isinstance(info.value, ModelError) and "\n" not in str(info.value)


def test_a_non_finite_average_is_not_applied() -> None:
    backend = ModelBackend(DigitsMLP(), DigitsMLP().initial_params(0), Adam())
    before = backend.params()
    poisoned = np.zeros(backend.size, dtype=np.float32)
    poisoned[10] = np.nan
    with pytest.raises(NonFiniteError):
        backend.apply(poisoned)
    assert np.array_equal(backend.params(), before)
