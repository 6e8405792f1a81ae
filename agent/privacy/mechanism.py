"""The Gaussian mechanism on the device: a backend whose gradients are clipped and noised.

``PrivateBackend`` wraps the backend the runtime trains with, below periodic averaging: every
gradient the device computes (one per round, or one per local step) is clipped and noised
exactly once, here, before anything else sees it. What leaves the device (the gradient, or
the model delta of H noised steps) is post-processing of noised gradients; the tree's
retransmits, reroutes and restarts on a new view resend the vector the core holds and never
call this again, and a state transfer moves the fleet's model, never a member's unit.

Per example (the thesis MLP on the numpy backend): each example's gradient is clipped to
``clip``, the clipped gradients summed, noise N(0, (noise * clip)^2) added per coordinate and
the sum divided by the batch size: adding or removing one example moves the sum by at most
``clip``. Per batch (any other model or backend): the batch's mean gradient is clipped to
``clip``; one example can then move it by up to 2 * clip, so the noise is N(0, (2 * noise *
clip)^2). Same (epsilon, delta) for the same noise multiplier, much more noise on the mean.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from agent.model.backend import Backend, NumpyBackend
from agent.privacy.clipping import clip_to_norm, mlp_clipped_sum

F32 = npt.NDArray[np.float32]


@dataclass(frozen=True)
class DpSettings:
    clip: float  # L2 norm bound of one example's (or one batch's) gradient
    noise: float  # noise multiplier: the noise's standard deviation over the sensitivity


def per_example_clipping(backend: Backend) -> bool:
    """Whether ``backend`` gets per-example clipping (the thesis MLP on numpy) or per-batch."""
    return isinstance(backend, NumpyBackend)


class PrivateBackend:
    """A ``Backend`` whose ``gradients`` are clipped and noised; the rest is the inner one's.
    ``rng`` must not be derived from the job's seed (the fleet shares it: the noise would be
    known to every member): the runtime gives a generator seeded from the OS."""

    def __init__(self, inner: Backend, settings: DpSettings, rng: np.random.Generator) -> None:
        self.inner = inner
        self.name: str = getattr(inner, "name", "")  # a test's stand-in may have none
        self.settings = settings
        self.rng = rng
        self.per_example = per_example_clipping(inner)
        self.noised = 0  # gradients noised so far (the accountant's steps)

    def gradients(self, x: F32, y: npt.NDArray[np.integer]) -> tuple[float, F32]:
        clip, noise = self.settings.clip, self.settings.noise
        if self.per_example:
            loss, total = mlp_clipped_sum(self.inner.params(), x, y, clip)
            total += self._noise(noise * clip, total.size)
            grad = total / np.float32(len(y))
        else:
            loss, mean = self.inner.gradients(x, y)
            grad = clip_to_norm(mean, clip) + self._noise(2 * noise * clip, mean.size)
        self.noised += 1
        return loss, np.asarray(grad, dtype=np.float32)

    def _noise(self, std: float, size: int) -> F32:
        noise = self.rng.standard_normal(size, dtype=np.float32)  # half the time of float64 draws
        noise *= np.float32(std)
        return noise

    def params(self) -> F32:
        return self.inner.params()

    def set_params(self, flat: F32) -> None:
        self.inner.set_params(flat)

    def apply(self, grad: F32) -> None:
        self.inner.apply(grad)

    def set_learning_rate(self, lr: float) -> None:
        self.inner.set_learning_rate(lr)

    def evaluate(self, x: F32, y: npt.NDArray[np.integer]) -> tuple[float, float]:
        return self.inner.evaluate(x, y)

    def accuracy(self, x: F32, y: npt.NDArray[np.integer]) -> float:
        return self.inner.accuracy(x, y)

    def state(self) -> F32:
        return self.inner.state()

    def load_state(self, state: F32) -> None:
        self.inner.load_state(state)

    def model_hash(self) -> int:
        return self.inner.model_hash()
