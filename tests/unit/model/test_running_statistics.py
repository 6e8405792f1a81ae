"""A model's running tensors (batch-norm statistics exported with ``--batch-norm train``): the
backend adds their share of the fleet's averaged vector as it is and the optimizer never moves
them, whatever the optimizer; the other tensors take the optimizer's step as before."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from agent.model.backend import ModelBackend, running_slices
from agent.model.contract import F32, Labels, TensorSpec
from agent.model.optim import SGD, Adam


class WithStatistics:
    name = "with-statistics"
    input_shape = (2,)
    num_classes = 2
    tensors = (TensorSpec("w", (2, 2)), TensorSpec("bn/moving_mean", (2,), running=True),
               TensorSpec("b", (2,)), TensorSpec("bn/moving_variance", (2,), running=True))
    param_count = 10

    def initial_params(self, seed: int) -> F32:
        return np.arange(10, dtype=np.float32)

    def loss_and_grad(self, params: F32, x: F32, y: Labels) -> tuple[float, F32]:
        return 0.0, np.ones(10, np.float32)

    def predict(self, params: F32, x: F32) -> F32:
        return np.zeros((len(x), 2), np.float32)


def test_running_slices_are_where_the_tensors_sit() -> None:
    assert running_slices(WithStatistics()) == [slice(4, 6), slice(8, 10)]


@pytest.mark.parametrize("make", [lambda: Adam(lr=0.5), lambda: SGD(lr=0.5, momentum=0.9)])
def test_statistics_take_their_step_as_it_is_and_weights_the_optimizers(
        make: Callable[[], Adam | SGD]) -> None:
    model = WithStatistics()
    backend = ModelBackend(model, model.initial_params(0), make())
    reference = make()
    expected = model.initial_params(0)
    step = np.array([-1, -1, -1, -1, 0.25, -0.5, -1, -1, 2.0, 0.125], np.float32)
    for _ in range(3):
        backend.apply(step)
        expected = reference.step(expected, np.where(np.isin(np.arange(10), [4, 5, 8, 9]), 0, step)
                                  .astype(np.float32))
        expected[[4, 5, 8, 9]] += step[[4, 5, 8, 9]]
    np.testing.assert_array_equal(backend.params(), expected)
    np.testing.assert_array_equal(backend.params()[[4, 5, 8, 9]],
                                  np.array([4, 5, 8, 9], np.float32) + 3 * step[[4, 5, 8, 9]])
    assert not np.array_equal(backend.params()[:4], np.arange(4, dtype=np.float32))
