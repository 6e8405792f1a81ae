"""A job asks for differential privacy through its agent options; the device builds it."""

from __future__ import annotations

import pytest

from agent.config import AgentConfig
from agent.jobs import document as d


def job(**options: object) -> d.JobSpec:
    return d.JobSpec.model_validate({"name": "j", "data": "mnist", "assignments": {"a": 0, "b": 1},
                                     "submitted_at": 100.0, "stop": {"rounds": 50}, "agent_options": options})


def test_a_jobs_dp_options_reach_the_devices_agent_config() -> None:
    spec = job(dp_clip=1.0, dp_epsilon=3.0, dp_delta=1e-6, dp_at_budget="warn")
    config = AgentConfig(**d.training_options(spec), id=0)  # type: ignore[arg-type]
    assert (config.dp_clip, config.dp_epsilon, config.dp_delta, config.dp_at_budget, config.rounds) == (
        1.0, 3.0, 1e-6, "warn", 50)


def test_a_job_whose_dp_cannot_be_calibrated_makes_no_agent_config() -> None:
    spec = job(dp_clip=1.0)  # neither a noise multiplier nor a budget
    with pytest.raises(ValueError, match="dp_clip needs dp_noise"):
        AgentConfig(**d.training_options(spec), id=0)  # type: ignore[arg-type]
