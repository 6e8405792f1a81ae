"""Periodic averaging's model side: local steps from the synced anchor, the delta, the outer
optimizers, and the state a peer serves (the anchor and the outer momentum, never a working copy)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from agent.model.backend import make_backend
from agent.model.contract import ModelError
from agent.model.flat import params_hash
from agent.model.periodic import OuterConfig, OuterOptimizer, PeriodicTrainer


def _digits_batches(seed: int, count: int = 8) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [(rng.random((16, 784), dtype=np.float32), rng.integers(0, 10, 16)) for _ in range(count)]


def _trainer(optimizer: str = "sgd", outer: OuterConfig | None = None, lr: float = 0.05) -> PeriodicTrainer:
    return PeriodicTrainer(make_backend("numpy", np.random.default_rng(0), optimizer, lr, momentum=0.0),
                           outer or OuterConfig())


def test_the_delta_is_the_anchor_minus_the_parameters_after_the_local_steps() -> None:
    trainer = _trainer()
    start = trainer.params()
    reference = make_backend("numpy", np.random.default_rng(0), "sgd", 0.05, momentum=0.0)
    batches = _digits_batches(1, 3)
    for x, y in batches:
        reference.apply(reference.gradients(x, y)[1])
    loss, delta = trainer.local_round(iter(batches), 3)
    assert loss > 0
    np.testing.assert_allclose(delta, start - reference.params(), atol=1e-7)
    # Until the sync the trainer still shows the synced model: hash, params, state, evaluation.
    assert trainer.model_hash() == params_hash(start)
    np.testing.assert_array_equal(trainer.params(), start)
    np.testing.assert_array_equal(trainer.state(), start)


def test_plain_averaging_with_rate_1_gives_every_member_the_mean_of_their_parameters_bit_for_bit() -> None:
    members = [_trainer() for _ in range(3)]
    deltas, params = [], []
    for seed, member in enumerate(members):
        _, delta = member.local_round(iter(_digits_batches(seed, 4)), 4)
        deltas.append(delta)
        params.append(member.inner.params())
    mean = np.mean(deltas, axis=0, dtype=np.float32)
    for member in members:
        member.apply(mean)
    assert len({m.model_hash() for m in members}) == 1
    assert len({m.state().tobytes() for m in members}) == 1
    np.testing.assert_allclose(members[0].params(), np.mean(params, axis=0), atol=1e-6)
    # The next local steps start from the new anchor.
    np.testing.assert_array_equal(members[0].inner.params(), members[0].params())


def test_one_local_step_of_plain_sgd_averaged_is_every_step_gradient_averaging() -> None:
    periodic = [_trainer() for _ in range(4)]
    every_step = make_backend("numpy", np.random.default_rng(0), "sgd", 0.05, momentum=0.0)
    streams = [iter(_digits_batches(10 + i, 5)) for i in range(4)]
    twins = [iter(_digits_batches(10 + i, 5)) for i in range(4)]
    for _ in range(5):
        grads = [every_step.gradients(*next(t))[1] for t in twins]
        every_step.apply(np.mean(grads, axis=0, dtype=np.float32))
        deltas = [p.local_round(s, 1)[1] for p, s in zip(periodic, streams, strict=True)]
        mean = np.mean(deltas, axis=0, dtype=np.float32)
        for p in periodic:
            p.apply(mean)
    np.testing.assert_allclose(periodic[0].params(), every_step.params(), atol=1e-6)


def test_nesterov_follows_torchs_nesterov_sgd_and_its_momentum_is_part_of_the_state() -> None:
    outer = OuterOptimizer(OuterConfig("nesterov", 0.7, 0.9), 3)
    anchor = np.array([1.0, 2.0, 3.0], np.float32)
    g1, g2 = np.array([0.1, -0.2, 0.3], np.float32), np.array([0.05, 0.05, -0.1], np.float32)
    first = outer.step(anchor, g1)
    np.testing.assert_allclose(first, anchor - 0.7 * (g1 + 0.9 * g1), rtol=1e-6)
    second = outer.step(first, g2)
    m2 = 0.9 * g1 + g2
    np.testing.assert_allclose(second, first - 0.7 * (g2 + 0.9 * m2), rtol=1e-6)

    trainer = _trainer(outer=OuterConfig("nesterov", 0.7))
    size = trainer.params().size
    assert trainer.state().size == 2 * size  # anchor + momentum; the inner slots are not the fleet's
    _, delta = trainer.local_round(iter(_digits_batches(3, 2)), 2)
    trainer.apply(delta)
    joiner = _trainer(outer=OuterConfig("nesterov", 0.7))
    joiner.load_state(trainer.state())
    assert joiner.model_hash() == trainer.model_hash()
    _, delta = trainer.local_round(iter(_digits_batches(4, 2)), 2)
    for member in (trainer, joiner):
        member.apply(delta)
    assert joiner.state().tobytes() == trainer.state().tobytes()  # the momentum came along


def test_a_mean_delta_holding_nan_is_never_applied() -> None:
    trainer = _trainer()
    before = trainer.state()
    bad = np.zeros(before.size, np.float32)
    bad[7] = np.nan
    with pytest.raises(ModelError, match="NaN or inf"):
        trainer.apply(bad)
    np.testing.assert_array_equal(trainer.state(), before)


def test_the_local_round_uses_one_batch_per_step() -> None:
    trainer = _trainer()
    batches = itertools.cycle(_digits_batches(5, 2))
    counted = iter(b for b in itertools.islice(batches, 7))
    trainer.local_round(counted, 5)
    assert len(list(counted)) == 2


def test_what_runs_between_local_steps_may_read_the_synced_model_without_changing_the_delta() -> None:
    batches = _digits_batches(2, 4)
    _, plain = _trainer().local_round(iter(batches), 4)
    trainer, calls = _trainer(), []

    def between() -> None:
        # The driver hears its transport: a peer's pull reads the state, an evaluation the model.
        calls.append(params_hash(trainer.params()))
        trainer.state()
        trainer.accuracy(*batches[0])

    _, delta = trainer.local_round(iter(batches), 4, between=between)
    assert len(calls) == 3 and len(set(calls)) == 1  # after each step but the last; the anchor holds
    np.testing.assert_array_equal(delta, plain)
