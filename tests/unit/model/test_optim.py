"""Optimizers: the formulas, and that the state vector carries the full training state."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from agent.model.optim import SGD, Adam, bias_corrections, exact_power, make_optimizer


def test_sgd_with_momentum_is_heavy_ball() -> None:
    opt = SGD(lr=0.1, momentum=0.5)
    p = np.array([1.0, 2.0], np.float32)
    g = np.array([1.0, -1.0], np.float32)
    p1 = opt.step(p, g)  # v = g
    np.testing.assert_allclose(p1, [0.9, 2.1], rtol=1e-6)
    p2 = opt.step(p1, g)  # v = 0.5 g + g
    np.testing.assert_allclose(p2, [0.75, 2.25], rtol=1e-6)
    assert opt.steps == 2


def test_adam_first_step_moves_each_coordinate_by_about_lr() -> None:
    opt = Adam(lr=1e-3)
    p = np.zeros(4, np.float32)
    g = np.array([3.0, -0.2, 1e-3, -50.0], np.float32)
    p1 = opt.step(p, g)
    np.testing.assert_allclose(p1, -1e-3 * np.sign(g), rtol=1e-3)
    assert p1.dtype == np.float32


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_state_vector_lets_a_copy_continue_byte_identical(name: str) -> None:
    rng = np.random.default_rng(0)
    a, b = make_optimizer(name, 0.01), make_optimizer(name, 0.01)
    a.init_slots(50)
    p = rng.normal(size=50).astype(np.float32)
    for _ in range(3):
        p = a.step(p, rng.normal(size=50).astype(np.float32))
    state = a.state_vector()
    assert state.dtype == np.float32 and state[0] == 3
    assert state.size == a.state_size(50)
    b.load_state_vector(state)
    g = rng.normal(size=50).astype(np.float32)
    assert a.step(p, g).tobytes() == b.step(p, g).tobytes()
    assert a.state_vector().tobytes() == b.state_vector().tobytes()


def test_state_vector_has_its_final_length_before_the_first_step() -> None:
    opt = Adam()
    opt.init_slots(10)
    assert opt.state_vector().shape == (21,)


def test_bad_state_and_unknown_names_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="Adam state"):
        Adam().load_state_vector(np.zeros(4, np.float32))  # 1 + 3 is not 1 + 2n
    with pytest.raises(ValueError, match="unknown optimizer 'rmsprop'"):
        make_optimizer("rmsprop")
    assert make_optimizer("sgd").lr == 0.01 and make_optimizer("adam").lr == 1e-3


def test_linear_schedule_runs_from_base_to_the_final_fraction() -> None:
    from agent.model.optim import scheduled_lr

    rates = [scheduled_lr(0.01, step, 11, "linear", 0.1) for step in range(11)]
    assert rates[0] == 0.01 and rates[-1] == pytest.approx(0.001)
    assert all(a > b for a, b in itertools.pairwise(rates))
    assert scheduled_lr(0.01, 50, 11, "linear", 0.1) == rates[-1]  # past the end: the floor
    assert scheduled_lr(0.01, 5, 11, "constant") == 0.01
    with pytest.raises(ValueError, match="lr schedule"):
        scheduled_lr(0.01, 5, 11, "cosine")


def test_exact_power_is_repeated_multiplication_and_close_to_pow() -> None:
    assert exact_power(0.9, 0) == 1.0 and exact_power(0.9, 1) == 0.9
    assert exact_power(0.5, 10) == 2.0**-10  # powers of two are exact
    for t in (2, 3, 7, 100, 12345):
        assert exact_power(0.999, t) == pytest.approx(0.999**t, rel=1e-13)
    with pytest.raises(ValueError):
        exact_power(0.9, -1)


def test_adam_bias_corrections_are_float32_of_float64_products() -> None:
    c1, c2 = bias_corrections(0.9, 0.999, 3)
    assert c1.dtype == np.float32 and c2.dtype == np.float32
    assert c1 == np.float32(1.0 - 0.9 * 0.9 * 0.9)
    assert c2 == np.float32(1.0 - exact_power(0.999, 3))
    # Adam uses them: one step from zero slots moves by lr * g / (|g| + eps) exactly as written.
    opt = Adam(lr=1e-3)
    g = np.array([0.5, -2.0], np.float32)
    p1 = opt.step(np.zeros(2, np.float32), g)
    c1, c2 = bias_corrections(0.9, 0.999, 1)
    m = np.float32(0.9) * np.float32(0) + np.float32(1 - 0.9) * g
    v = np.float32(0.999) * np.float32(0) + (g * g) * np.float32(1 - 0.999)
    expected = -((m / c1) * np.float32(1e-3)) / (np.sqrt(v / c2) + np.float32(1e-7))
    assert p1.tobytes() == expected.astype(np.float32).tobytes()
