"""The Gaussian mechanism on the device: clipped, noised once, and the tree never adds more."""

from __future__ import annotations

from collections import Counter

import numpy as np
import numpy.typing as npt

from agent.model import mlp
from agent.model.backend import make_backend
from agent.privacy.mechanism import DpSettings, PrivateBackend
from agent.protocol.allreduce import AllreduceConfig
from simulate.virtual_fleet import FaultSpec, count_problems, run_fleet
from tests.unit.privacy.leaks import recover_image

F32 = npt.NDArray[np.float32]
LENGTH, CHUNK = 40, 8


class FixedGradient:
    """A stand-in backend (not the thesis MLP: clipped per batch) whose gradient is given."""

    name = "fixed"

    def __init__(self, gradient: F32) -> None:
        self.gradient = gradient

    def gradients(self, x: F32, y: npt.NDArray[np.integer]) -> tuple[float, F32]:
        return 0.0, self.gradient.copy()

    def params(self) -> F32:
        return np.zeros_like(self.gradient)


def test_the_thesis_mlp_is_clipped_per_example_with_noise_of_noise_times_clip_over_the_batch() -> None:
    backend = make_backend("numpy", np.random.default_rng(0), "sgd", 0.1)
    private = PrivateBackend(backend, DpSettings(clip=1.0, noise=2.0), np.random.default_rng(5))
    rng = np.random.default_rng(3)
    x, y = rng.random((50, 784), dtype=np.float32), rng.integers(0, 10, 50)
    first, second = private.gradients(x, y)[1], private.gradients(x, y)[1]
    assert private.per_example and private.noised == 2
    # The two draws differ by noise only: std sqrt(2) * 2.0 * 1.0 / 50 per coordinate.
    assert abs(float(np.std(first - second)) - np.sqrt(2) * 2.0 / 50) < 0.002


def test_another_backend_is_clipped_per_batch_with_twice_the_noise() -> None:
    inner = FixedGradient(np.full(10_000, 1.0, np.float32))  # norm 100
    private = PrivateBackend(inner, DpSettings(clip=0.5, noise=3.0), np.random.default_rng(6))  # type: ignore[arg-type]
    _, grad = private.gradients(np.zeros((1, 1), np.float32), np.zeros(1, np.int64))
    assert not private.per_example
    assert abs(float(np.std(grad)) - 2 * 3.0 * 0.5) < 0.05
    assert abs(float(np.mean(grad)) - 0.5 / 100) < 0.05  # the clipped gradient underneath


def test_the_noise_defeats_the_image_recovery_of_a_batch_of_one() -> None:
    backend = make_backend("numpy", np.random.default_rng(0), "sgd", 0.1)
    private = PrivateBackend(backend, DpSettings(clip=1.0, noise=1.0), np.random.default_rng(7))
    image = np.random.default_rng(8).random((1, 784), dtype=np.float32)
    _, clear = mlp.loss_and_grad(backend.params(), image, np.array([3]))
    assert np.max(np.abs(recover_image(clear) - image[0])) < 1e-4
    _, unit = private.gradients(image, np.array([3]))
    error = np.abs(recover_image(unit) - image[0])
    assert float(np.mean(error)) > 0.5  # pixels are in [0, 1]: nothing recovered


def test_a_unit_is_noised_once_however_the_tree_reroutes_and_retransmits_it() -> None:
    """Every node's gradient comes from a PrivateBackend; a cut link (reroute through the
    backup) and a lossy one (retransmits) in the rounds: each node noised once per round, and
    every applied mean is exactly the mean of the once-noised units its contributors sent."""
    calls: Counter[tuple[int, int]] = Counter()
    privates = {node: PrivateBackend(FixedGradient(np.full(LENGTH, node, np.float32)),  # type: ignore[arg-type]
                                     DpSettings(clip=10.0, noise=1.0), np.random.default_rng(node))
                for node in range(7)}

    def noised(node: int, round: int, params: F32) -> F32:
        calls[node, round] += 1
        return privates[node].gradients(params[None, :], np.zeros(1, np.int64))[1]

    faults = (FaultSpec("cut", 0, 1, 0), FaultSpec("loss", 1, 2, 0, value=0.3))
    config = AllreduceConfig(chunk_size=CHUNK, timeout_mode="fixed", fixed_timeout=0.05, round_deadline=2.0)
    records = run_fleet(7, 3, length=LENGTH, allreduce=config, gradient_fn=noised, keep_gradients=True,
                        faults=faults, seed=4)
    stats = [r.stats for rec in records for r in rec.results.values()]
    assert sum(s.reroutes for s in stats) > 0 and sum(s.retransmits + s.timeouts for s in stats) > 0
    assert set(calls.values()) == {1} and len(calls) == 7 * 3
    assert sum(p.noised for p in privates.values()) == 7 * 3
    for rec in records:
        assert count_problems(rec, CHUNK, atol=1e-5) == []
