"""Silent nodes with the agents' own defaults and the real model's length (silent_runs.py):
the round a node freezes in costs under a second, the next ones run at speed, at 7 and 15
agents. In memory, on the agent core."""

from __future__ import annotations

import pytest

from simulate.virtual_fleet import FaultSpec, Phase
from tests.integration.virtual_fleet.silent_runs import (
    ROLES,
    agent_defaults_run,
    fault_free_median,
    forwarded_to,
    silent_from,
    survivors_time,
)

# Whole in-memory fleets, tens of rounds each: the suite starts this file early.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def median_15() -> float:
    """15 agents without faults (deterministic: run once, not per role)."""
    return fault_free_median(nodes=15)


@pytest.mark.parametrize("phase", ["reduce", "broadcast"])
@pytest.mark.parametrize("role", list(ROLES))
def test_with_the_agents_defaults_the_round_a_node_freezes_in_costs_under_a_second(
    role: str, phase: Phase, agent_defaults_median: float
) -> None:

    """Frozen mid-reduce, or once its contribution is sent (the broadcast: its parent's
    machine of that round, lingering for its ACKs, reports it silent again while the next
    round waits for it; that report must not restart the first one's grace)."""
    node = ROLES[role]
    faults = (FaultSpec("hang", 8, node, phase=phase, after=0.01), FaultSpec("resume", 8, node, after=3.0))
    records = agent_defaults_run(faults, 16)
    assert [r.round for r in records] == list(range(16)), "the fleet halted"
    # Frozen in the broadcast, it is silent from the next round's start: that round counts
    # as the one it goes silent in (as in `bench silent`). So is a node frozen 10 ms into a
    # fan-out round: it had the result by then (relayed, the result took ~25 ms here).
    silent = silent_from(records, node, 8)
    assert silent in ((8, 9) if phase == "reduce" else (9,)), silent
    first_routed = silent + 1
    for rec in records[8:first_routed]:
        assert survivors_time(rec, node) <= agent_defaults_median + 1.0, (rec.round, survivors_time(rec, node))
    for rec in records[first_routed:first_routed + 4]:  # still frozen: routed around, then out of the view
        assert survivors_time(rec, node) <= 1.5 * agent_defaults_median + 0.01, rec.round
        assert not any(res.degraded for n, res in rec.results.items() if n != node), rec.round
    assert node not in records[first_routed + 1].members


@pytest.mark.parametrize("role", ["root", "inner", "leaf"])
def test_at_15_agents_a_frozen_node_costs_one_short_round_and_the_next_ones_run_at_speed(
        role: str, median_15: float) -> None:
    """15 agents, the agents' defaults, a node frozen 10 ms into round 8. A frozen leaf's
    parent used to flood the broadcast to it when its relay failed: every member forwarded
    it a whole vector (21 MB) while the verdict on the leaf came, which made that round and
    the next one slow (0.79 s, then 0.25 s against a 0.14 s median)."""
    node = {"root": 0, "inner": 1, "leaf": 14}[role]
    median = median_15
    faults = (FaultSpec("hang", 8, node, after=0.01), FaultSpec("resume", 8, node, after=3.0))
    records = agent_defaults_run(faults, 13, nodes=15)
    assert [r.round for r in records] == list(range(13)), "the fleet halted"
    silent = silent_from(records, node, 8)  # 9: it had round 8's result (see above)
    assert silent in (8, 9), silent
    assert survivors_time(records[silent], node) <= median + 1.0
    for rec in records[silent + 1 : silent + 4]:
        assert survivors_time(rec, node) <= 1.5 * median + 0.01, (rec.round, survivors_time(rec, node), median)
        assert not any(res.degraded for n, res in rec.results.items() if n != node), rec.round
    assert node not in records[silent + 2].members
    if role == "leaf":
        assert forwarded_to(records[silent], node) <= {13}, "flooded"  # its sibling's relay only
