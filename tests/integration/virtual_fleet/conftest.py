"""Fault-free baselines the silent-node and flapping files compare against: the in-memory
fleet is seeded and deterministic, so each is run once per worker, not once per file or test."""

from __future__ import annotations

import pytest

from tests.integration.virtual_fleet.silent_runs import fault_free_median


@pytest.fixture(scope="session")
def agent_defaults_median() -> float:
    """7 agents, the agents' defaults, no jitter."""
    return fault_free_median()


@pytest.fixture(scope="session")
def agent_defaults_median_jittered() -> float:
    """The same with each gradient up to 40 ms late (``compute_jitter``)."""
    return fault_free_median(jitter=0.04)
