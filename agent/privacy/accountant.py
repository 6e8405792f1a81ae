"""The privacy budget over rounds: dp-accounting's RDP accountant (the optional ``privacy`` extra).

One DP-SGD step is a Poisson-subsampled Gaussian mechanism: sampling rate q = batch / the
device's training samples, noise multiplier sigma. (The device draws its batches by shuffling
each epoch, not by Poisson sampling: the usual approximation of DP-SGD's analyses, stated in
docs/PRIVACY.md.) Steps compose: a round of periodic averaging is H steps, every-step
averaging one. RDP composes by adding, so the one step's RDP curve is computed once (~50 ms)
and epsilon after T steps is a conversion of T times it (well under 1 ms): cheap every round.

dp-accounting pulls scipy, dm-tree and absl: a device that does not install the extra trains
with a noise multiplier it is given (``dp_noise``, computed on the submitting side) and tells
no epsilon; ``AccountantMissing`` says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

EXTRA_HINT = "install the privacy extra (pip install 'edgegrove[privacy]')"
MAX_STEPS = 10**7


class AccountantMissing(RuntimeError):
    """dp-accounting is not installed here."""


def _library() -> tuple[ModuleType, ModuleType]:
    try:
        from dp_accounting import dp_event
        from dp_accounting.rdp import rdp_privacy_accountant
    except ImportError:
        raise AccountantMissing(f"no privacy accountant on this device: {EXTRA_HINT}, "
                                "or give dp_noise (and no dp_epsilon)") from None
    return dp_event, rdp_privacy_accountant


class Accountant:
    """Epsilon after a number of DP-SGD steps of one device, at ``delta``."""

    def __init__(self, noise: float, sampling_rate: float, delta: float) -> None:
        dp_event, rdp = _library()
        self.delta = delta
        step = rdp.RdpAccountant()
        step.compose(dp_event.PoissonSampledDpEvent(sampling_rate, dp_event.GaussianDpEvent(noise)), 1)
        # The accountant's own RDP curve of one step (its attributes: no public getter).
        self._orders: Sequence[float] = list(step._orders)
        self._step_rdp: Sequence[float] = [float(v) for v in step._rdp]
        self._convert = rdp.compute_epsilon

    def epsilon(self, steps: int) -> float:
        if steps <= 0:
            return 0.0
        epsilon, _order = self._convert(self._orders, [steps * v for v in self._step_rdp], self.delta)
        return float(epsilon)

    def max_steps(self, budget: float) -> int:
        """The most steps whose epsilon stays within ``budget`` (0: not even one)."""
        low, high = 0, 1
        while high < MAX_STEPS and self.epsilon(high) <= budget:
            low, high = high, high * 2
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if self.epsilon(middle) <= budget else (low, middle)
        return low


def calibrate_noise(epsilon: float, delta: float, sampling_rate: float, steps: int) -> float:
    """The smallest noise multiplier whose ``steps`` steps spend at most ``epsilon``."""
    dp_event, rdp = _library()
    from dp_accounting import calibrate_dp_mechanism

    def event(noise: float) -> object:
        step = dp_event.PoissonSampledDpEvent(sampling_rate, dp_event.GaussianDpEvent(noise))
        return dp_event.SelfComposedDpEvent(step, steps)

    return float(calibrate_dp_mechanism(rdp.RdpAccountant, event, epsilon, delta))
