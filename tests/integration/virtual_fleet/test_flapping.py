"""A flapping connection (drops of 80 ms at points spread over a round), with the agents'
defaults and the real model's length: it costs no wait. In memory, on the agent core."""

from __future__ import annotations

import pytest

from simulate.virtual_fleet import FaultSpec, Phase
from tests.integration.virtual_fleet.silent_runs import (
    ROLES,
    agent_defaults_run,
    survivors_time,
)

# Whole in-memory fleets, tens of rounds each: the suite starts this file early.
pytestmark = pytest.mark.slow

FLAP_AFTER = (0.0, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06)  # into the round's phase


@pytest.mark.parametrize("jitter", [0.0, 0.04])
@pytest.mark.parametrize("phase", ["reduce", "broadcast"])
@pytest.mark.parametrize("role", list(ROLES))
def test_with_the_agents_defaults_a_flapping_connection_costs_no_wait(
    role: str, phase: Phase, jitter: float, agent_defaults_median: float,
    agent_defaults_median_jittered: float
) -> None:

    """Eight drops, each back after 80 ms (paho's reconnects on the real fleet took 20-140
    ms), at points spread over the round. A drop long enough for the fleet to start the next
    round around the node left it waiting a whole wait in the round the fleet had ended
    (its children had gone on), and the fleet's next round waiting for it: 2.5 s rounds.
    With each agent's gradient up to 40 ms late (``jitter``: on the real fleet they start a
    round each at its own moment), some children had gone around the node and some had not,
    and it waited for the first kind: 0.5 s rounds."""
    node = ROLES[role]
    faults = tuple(FaultSpec("flap", 4 + 3 * i, node, phase=phase, after=after, value=1)
                   for i, after in enumerate(FLAP_AFTER))
    rounds = 4 + 3 * len(FLAP_AFTER) + 4
    records = agent_defaults_run(faults, rounds, reconnect_delay=0.08, compute_jitter=jitter)
    assert [r.round for r in records] == list(range(rounds)), "the fleet halted"
    # Against the same fleet without faults, gradients as late: a round ends with its last
    # gradient, so the jitter alone lengthens every round (with the fan-out's 38 ms rounds,
    # rounds 70-80 ms long only by the jitter counted as slow against the unjittered median).
    median = agent_defaults_median if jitter == 0 else agent_defaults_median_jittered
    limit = 1.5 * median + 0.01  # 10 ms: event grain
    away = 0.0
    if role == "root":
        # Nobody else can average the round: the fleet waits out the root's 80 ms away
        # (ROOT_WILL_GRACE) instead of skipping the round, so no round is degraded and no
        # member drifts (a skipped round's chunks differed between members: state transfers).
        away = 0.08
        limit += away
        assert [r.round for r in records if r.degraded] == []
        assert [r.round for r in records if len(set(r.start_hashes.values())) > 1] == []
    slow = [(r.round, round(survivors_time(r, node), 3)) for r in records if survivors_time(r, node) > limit]
    # A drop still costs its own round something (units in flight lost and asked for again,
    # the result fetched twice): up to half the drops here give a round over 1.5x (at most
    # 2x), more than the "at most 2". What may never come back is a wait for the
    # node: no round near a timeout.
    assert len(slow) <= len(FLAP_AFTER) // 2, slow
    worst = max(survivors_time(r, node) for r in records)
    assert worst <= 3 * median + away + 0.01, slow
    last = records[-1]
    assert node in last.members and node in last.results
    assert len(set(last.start_hashes.values())) == 1, last.start_hashes
