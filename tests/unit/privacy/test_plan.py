"""The budget: dp-accounting's epsilon, the calibrated noise, the round cap at the budget."""

from __future__ import annotations

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant

from agent import privacy
from agent.config import AgentConfig, ConfigError
from agent.model.backend import make_backend
from agent.privacy import accountant
from agent.privacy.accountant import Accountant, AccountantMissing
from agent.privacy.plan import plan_privacy, with_privacy

RATE = 100 / 8571  # MNIST's 60,000 over 7 agents, batch 100


def config(**kw: object) -> AgentConfig:
    return AgentConfig(id=0, **kw)  # type: ignore[arg-type]


def test_epsilon_after_t_steps_is_the_librarys_own_composition() -> None:
    ours = Accountant(1.1, RATE, 1e-5)
    theirs = rdp_privacy_accountant.RdpAccountant()
    theirs.compose(dp_event.PoissonSampledDpEvent(RATE, dp_event.GaussianDpEvent(1.1)), 300)
    assert ours.epsilon(300) == pytest.approx(theirs.get_epsilon(1e-5), rel=1e-9)
    assert ours.epsilon(0) == 0.0 and ours.epsilon(10) < ours.epsilon(11)


def test_the_noise_is_calibrated_to_spend_the_budget_in_the_jobs_rounds() -> None:
    plan = plan_privacy(config(dp_clip=1.0, dp_epsilon=3.0, rounds=300), samples=8571)
    assert plan is not None and plan.accountant is not None
    assert 2.9 < plan.accountant.epsilon(300) <= 3.0
    assert plan.round_cap is not None and plan.round_cap >= 300


def test_a_given_noise_caps_the_rounds_where_the_budget_is_spent() -> None:
    plan = plan_privacy(config(dp_clip=1.0, dp_noise=1.0, dp_epsilon=3.0, rounds=10_000), samples=8571)
    assert plan is not None and plan.accountant is not None and plan.round_cap is not None
    assert plan.accountant.epsilon(plan.round_cap) <= 3.0 < plan.accountant.epsilon(plan.round_cap + 1)
    assert plan.round_cap > 1000
    assert plan.capped(config(rounds=10_000)).rounds == plan.round_cap
    assert plan.capped(config(rounds=5)).rounds == 5
    periodic = plan_privacy(config(dp_clip=1.0, dp_noise=1.0, dp_epsilon=3.0, sync_every=4), samples=8571)
    assert periodic is not None and periodic.round_cap == plan.round_cap // 4


def test_warn_at_the_budget_caps_nothing_and_tells_when_it_is_over() -> None:
    plan = plan_privacy(config(dp_clip=1.0, dp_noise=1.0, dp_epsilon=3.0, dp_at_budget="warn"), samples=8571)
    assert plan is not None and plan.round_cap is None
    assert not plan.over_budget(10) and plan.over_budget(10**5)


def test_without_the_accountant_a_given_noise_trains_and_a_budget_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> None:
        raise AccountantMissing("no privacy accountant on this device")

    monkeypatch.setattr(accountant, "_library", missing)
    plan = plan_privacy(config(dp_clip=1.0, dp_noise=1.0), samples=8571)
    assert plan is not None and plan.accountant is None and plan.epsilon_after(100) is None
    with pytest.raises(ConfigError, match="accountant"):
        plan_privacy(config(dp_clip=1.0, dp_epsilon=3.0, rounds=10), samples=8571)


def test_the_runtime_gets_a_noising_backend_and_the_capped_rounds() -> None:
    backend = make_backend("numpy", np.random.default_rng(0), "sgd", 0.1)
    capped, private, dp = with_privacy(config(dp_clip=1.0, dp_noise=1.0, dp_epsilon=3.0, rounds=10**6),
                                       backend, 8571, np.random.default_rng())
    assert dp is not None and private is dp.backend and capped.rounds == dp.plan.round_cap
    assert "per example" in dp.line() and dp.epsilon_spent(0) == dp.plan.epsilon_after(1)
    assert with_privacy(config(), backend, 8571, np.random.default_rng())[2] is None
    assert privacy.__doc__


@pytest.mark.parametrize(("options", "message"), [
    ({"dp_epsilon": 3.0}, "set dp_clip too"),
    ({"dp_clip": 1.0}, "needs dp_noise"),
    ({"dp_clip": 1.0, "dp_epsilon": 3.0}, "rounds > 0"),
    ({"dp_clip": 1.0, "dp_noise": 1.0, "sync_every": "auto"}, "not auto"),
])
def test_an_unrunnable_dp_configuration_is_refused_in_one_line(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config(**options)
