"""Agent configuration: what is refused, with a message that says what to do."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agent.config import AgentConfig


def test_a_decaying_lr_schedule_needs_a_known_number_of_rounds() -> None:
    with pytest.raises(ValidationError, match="set rounds > 0"):
        AgentConfig(id=0, lr_schedule="linear")
    config = AgentConfig(id=0, lr_schedule="linear", rounds=100, lr_final=0.5)
    assert config.lr_schedule == "linear" and config.lr_final == 0.5


@pytest.mark.parametrize("bad", [{"lr_final": 0.0}, {"lr_final": 1.5}, {"lr_schedule": "cosine"}])
def test_bad_schedule_options_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        AgentConfig(id=0, rounds=10, **bad)  # type: ignore[arg-type]


def test_wire_dtype_auto_maps_to_the_ft_trees_per_link_choice_and_is_for_ft_tree_only() -> None:
    from agent.protocol.wire import DType
    from agent.protocol.wire_choice import AUTO_WIRE_BUDGET
    from agent.runtime_config import allreduce_config

    auto = allreduce_config(AgentConfig(id=0, wire_dtype="auto", wire_budget=0.3))
    assert (auto.wire_auto, auto.wire_dtype, auto.wire_budget) == (True, DType.F32, 0.3)
    fixed = allreduce_config(AgentConfig(id=0, wire_dtype="int8"))
    assert (fixed.wire_auto, fixed.wire_dtype, fixed.wire_budget) == (False, DType.I8, AUTO_WIRE_BUDGET)
    assert AgentConfig(id=0).wire_dtype == "float32"  # not the default
    with pytest.raises(ValidationError, match="for the ft-tree algorithm"):
        AgentConfig(id=0, wire_dtype="auto", algorithm="rps")
    with pytest.raises(ValidationError):
        AgentConfig(id=0, wire_budget=0)


def test_the_agent_bounds_each_units_influence_by_default_and_0_turns_it_off() -> None:
    from agent.core import AgentCore
    from agent.protocol.influence import DEFAULT_INFLUENCE_FACTOR
    from agent.runtime_config import allreduce_config, core_config

    assert allreduce_config(AgentConfig(id=0)).influence_factor == DEFAULT_INFLUENCE_FACTOR == 3.0
    assert allreduce_config(AgentConfig(id=0, influence_bound=1.5)).influence_factor == 1.5
    assert allreduce_config(AgentConfig(id=0, influence_bound=0)).influence_factor == 0
    with pytest.raises(ValidationError):
        AgentConfig(id=0, influence_bound=-1)
    core = AgentCore(core_config(AgentConfig(id=0), 8), incarnation=1)
    assert core.parts.norms.factor == DEFAULT_INFLUENCE_FACTOR


def test_sync_every_takes_a_whole_number_of_local_steps_and_reaches_the_core() -> None:
    from agent.runtime_config import core_config

    assert AgentConfig(id=0).sync_every is None  # every-step gradient averaging
    assert core_config(AgentConfig(id=0), 10).sync_every is None
    for given in (8, "8", " 8"):
        config = AgentConfig(id=0, sync_every=given)  # type: ignore[arg-type]
        assert config.sync_every == 8 and core_config(config, 10).sync_every == 8
    assert AgentConfig(id=0, sync_every=1).outer_config.lr == 1.0
    assert AgentConfig(id=0, sync_every=4, outer_optimizer="nesterov").outer_config.lr == 0.7
    assert AgentConfig(id=0, sync_every=4, outer_lr=0.5).outer_config.lr == 0.5


def test_sync_every_auto_starts_the_core_at_one_step_with_the_coordinators_rule() -> None:
    from agent.protocol.sync_period import AUTO_START, DEFAULT_COMM_SHARE, PeriodRule
    from agent.runtime_config import core_config

    auto = core_config(AgentConfig(id=0, sync_every="auto"), 10)
    assert (auto.sync_every, auto.sync_auto) == (AUTO_START, PeriodRule(DEFAULT_COMM_SHARE))
    share = core_config(AgentConfig(id=0, sync_every="auto", comm_share=0.35), 10)
    assert share.sync_auto == PeriodRule(0.35)
    assert core_config(AgentConfig(id=0, sync_every=8), 10).sync_auto is None


def test_the_straggler_deadline_reaches_the_allreduce_and_is_checked() -> None:
    from agent.protocol.allreduce import AllreduceConfig
    from agent.runtime_config import allreduce_config

    assert allreduce_config(AgentConfig(id=0)).straggler_deadline == 0.0  # off
    assert allreduce_config(AgentConfig(id=0, straggler_deadline=1.5)).straggler_deadline == 1.5
    for bad in (-1, "soon", float("inf")):
        with pytest.raises(ValidationError):
            AgentConfig(id=0, straggler_deadline=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        AllreduceConfig(straggler_deadline=-0.5)


@pytest.mark.parametrize("bad", [{"sync_every": 0}, {"sync_every": -3}, {"sync_every": "2.5"}, {"sync_every": 2.5},
                                 {"sync_every": "often"}, {"sync_every": True},
                                 {"sync_every": 4, "outer_lr": 0}, {"sync_every": 4, "outer_lr": -1},
                                 {"sync_every": 4, "outer_optimizer": "adam"}, {"outer_lr": 0.5},
                                 {"outer_optimizer": "nesterov"}, {"comm_share": 0.2},
                                 {"sync_every": 8, "comm_share": 0.2}, {"sync_every": "auto", "comm_share": 0},
                                 {"sync_every": "auto", "comm_share": 1}, {"sync_every": "sometimes"}])
def test_bad_periodic_averaging_options_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        AgentConfig(id=0, **bad)  # type: ignore[arg-type]
