"""The learning-rate schedule every agent computes for itself, so it must be bit-identical
across devices: pure arithmetic, no libm."""

from __future__ import annotations

LR_SCHEDULES = ("constant", "linear")


def scheduled_lr(base: float, step: int, total: int, schedule: str = "constant",
                 final_fraction: float = 0.1) -> float:
    """The learning rate of step ``step`` (0-based) of ``total``.

    ``linear`` decays from ``base`` to ``base * final_fraction`` at the last step. Linear, not
    cosine: agents on different CPUs must compute bit-identical rates (IEEE +, *, / are
    correctly rounded everywhere; libm's cos is not), or their models drift apart.
    """
    if schedule == "constant" or total <= 1:
        return base
    if schedule != "linear":
        raise ValueError(f"unknown lr schedule {schedule!r}; choose one of {', '.join(LR_SCHEDULES)}")
    done = min(max(step, 0), total - 1) / (total - 1)
    return base * (1.0 - (1.0 - final_fraction) * done)
