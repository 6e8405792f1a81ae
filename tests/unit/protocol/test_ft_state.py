"""The round's states and their transition table."""

from __future__ import annotations

import pytest

from agent.protocol.ft_state import (
    GATHER_TRANSITIONS,
    OUTCOME_TRANSITIONS,
    Gather,
    Outcome,
    RoundState,
    Trigger,
)


def test_a_round_waits_passes_on_and_delivers() -> None:
    state = RoundState()
    assert state.waiting and not state.finished and not state.over
    state.fire(Trigger.WAIT_OVER)
    assert state.gather is Gather.PASSING_ON and not state.waiting
    state.fire(Trigger.UP_DELIVERED)
    state.fire(Trigger.WAIT_OVER)  # a wait that runs out after delivery changes nothing
    assert state.gather is Gather.DELIVERED


def test_a_leaf_delivers_before_its_wait_runs_out_and_waits_no_more() -> None:
    state = RoundState()
    state.fire(Trigger.UP_DELIVERED)
    assert state.gather is Gather.DELIVERED and not state.waiting


def test_the_result_and_the_deadline_end_the_round_in_that_order() -> None:
    state = RoundState()
    state.fire(Trigger.RESULT)
    assert state.finished and not state.over and state.waiting  # the reduce side goes on
    state.fire(Trigger.DEADLINE)
    assert state.outcome is Outcome.OVER and state.over


@pytest.mark.parametrize("steps", [
    [Trigger.DEADLINE],  # the round ends with a result, even an empty one
    [Trigger.RESULT, Trigger.RESULT],
    [Trigger.UP_DELIVERED, Trigger.UP_DELIVERED],
])
def test_a_trigger_the_table_does_not_list_is_refused(steps: list[Trigger]) -> None:
    state = RoundState()
    for trigger in steps[:-1]:
        state.fire(trigger)
    with pytest.raises(ValueError):
        state.fire(steps[-1])


def test_every_state_but_the_last_has_a_way_on() -> None:
    assert {s for s, _ in GATHER_TRANSITIONS} | set(GATHER_TRANSITIONS.values()) == set(Gather)
    assert {s for s, _ in OUTCOME_TRANSITIONS} == {Outcome.RUNNING, Outcome.FINISHED}
