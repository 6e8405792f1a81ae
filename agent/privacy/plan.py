"""A device's differential privacy for one run: noise, sampling rate, budget and round cap.

Resolved once, where the runtime is built (the shard size is known there): the noise
multiplier as given (``dp_noise``) or calibrated so that the run's steps spend ``dp_epsilon``;
with a budget and a given noise, ``stop`` caps the run's rounds where the budget is spent (the
same cap on every member with the same shard size and batch: the fleet's stop rule, never a
member leaving on its own), ``warn`` lets it run and each round past the budget is logged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agent.config import AgentConfig, ConfigError
from agent.model.backend import Backend
from agent.privacy.accountant import Accountant, AccountantMissing, calibrate_noise
from agent.privacy.mechanism import DpSettings, PrivateBackend


@dataclass(frozen=True)
class DpPlan:
    settings: DpSettings
    sampling_rate: float  # batch / the device's training samples
    steps_per_round: int  # local steps per round (periodic averaging), else 1
    delta: float
    budget: float | None
    accountant: Accountant | None  # None: the privacy extra is not installed here
    round_cap: int | None  # stop at the budget: the rounds it allows

    def epsilon_after(self, steps: int) -> float | None:
        return None if self.accountant is None else self.accountant.epsilon(steps)

    def over_budget(self, steps: int) -> bool:
        epsilon = self.epsilon_after(steps)
        return self.budget is not None and epsilon is not None and epsilon > self.budget

    def capped(self, config: AgentConfig) -> AgentConfig:
        """``config`` with its rounds cut to what the budget allows (stop at the budget)."""
        if self.round_cap is None or (config.rounds and config.rounds <= self.round_cap):
            return config
        return config.model_copy(update={"rounds": self.round_cap})


def plan_privacy(config: AgentConfig, samples: int) -> DpPlan | None:
    """The plan of ``config`` for a device training on ``samples`` examples (None: no DP);
    ConfigError (one line) when it cannot be run."""
    if not config.dp_clip:
        return None
    steps = config.sync_every if isinstance(config.sync_every, int) else 1
    rate = min(1.0, config.batch / max(1, samples))
    try:
        noise = config.dp_noise or calibrate_noise(config.dp_epsilon or 0.0, config.dp_delta, rate,
                                                   config.rounds * steps)  # the config checked both
        accountant = Accountant(noise, rate, config.dp_delta)
    except AccountantMissing as exc:
        if config.dp_noise is None or config.dp_epsilon is not None:
            raise ConfigError(str(exc)) from None
        noise, accountant = config.dp_noise, None  # a given noise and no budget: trains, tells no epsilon
    cap = None
    if accountant is not None and config.dp_epsilon is not None and config.dp_at_budget == "stop":
        cap = accountant.max_steps(config.dp_epsilon) // steps
        if cap < 1:
            raise ConfigError(f"dp_epsilon {config.dp_epsilon} is spent before the first round at noise "
                              f"{noise:.3g}: raise dp_noise or dp_epsilon")
    return DpPlan(DpSettings(config.dp_clip, noise), rate, steps, config.dp_delta, config.dp_epsilon,
                  accountant, cap)


@dataclass(frozen=True)
class DeviceDp:
    """The runtime's handle on its differential privacy: the plan and the noising backend."""

    plan: DpPlan
    backend: PrivateBackend

    def epsilon_spent(self, round: int) -> float | None:
        """After ``round``: counted as if this device took part in every round from 0 (an upper
        bound that a restart, a rejoin or a round left out of never lowers)."""
        return self.plan.epsilon_after(self._steps(round))

    def over_budget(self, round: int) -> bool:
        return self.plan.over_budget(self._steps(round))

    def _steps(self, round: int) -> int:
        return (round + 1) * self.plan.steps_per_round

    def line(self) -> str:
        plan, settings = self.plan, self.plan.settings
        budget = "no budget" if plan.budget is None else f"budget epsilon {plan.budget:g} at delta {plan.delta:g}"
        cap = "" if plan.round_cap is None else f", at most {plan.round_cap} rounds"
        clipping = "per example" if self.backend.per_example else "per batch"
        return (f"differential privacy: clip {settings.clip:g} {clipping}, noise multiplier {settings.noise:.4g}, "
                f"sampling rate {plan.sampling_rate:.4g}, {budget}{cap}"
                + ("" if plan.accountant else " (no accountant here: epsilon not told)"))


def with_privacy(config: AgentConfig, backend: Backend, samples: int,
                 rng: np.random.Generator) -> tuple[AgentConfig, Backend, DeviceDp | None]:
    """The config (rounds capped at the budget) and backend (noising) a device trains with."""
    plan = plan_privacy(config, samples)
    if plan is None:
        return config, backend, None
    private = PrivateBackend(backend, plan.settings, rng)
    return plan.capped(config), private, DeviceDp(plan, private)
