"""The phases of the agent core and their one transition table (agent/core/progress.py)."""

from __future__ import annotations

import pytest

from agent.core.progress import TRANSITIONS, Phase, PhaseError, Progress, Trigger, next_phase


def test_a_round_goes_from_waiting_through_computing_and_running_back_to_waiting() -> None:
    phase = Phase.WAITING
    for trigger in (Trigger.ROUND_STARTS, Trigger.GRADIENT_READY, Trigger.VIEW_RESTARTS_ROUND,
                    Trigger.ROUND_FINISHED):
        phase = next_phase(phase, trigger)
    assert phase == Phase.WAITING


def test_a_transition_the_table_does_not_have_is_an_error_not_a_jump() -> None:
    with pytest.raises(PhaseError, match="WAITING on GRADIENT_READY"):
        next_phase(Phase.WAITING, Trigger.GRADIENT_READY)
    with pytest.raises(PhaseError):
        next_phase(Phase.DONE, Trigger.DISPLACED)  # said once


def test_every_phase_but_done_ends_when_a_newer_life_of_the_node_runs_and_done_is_final() -> None:
    assert all(next_phase(p, Trigger.DISPLACED) == Phase.DONE for p in Phase if p != Phase.DONE)
    assert not [key for key in TRANSITIONS if key[0] == Phase.DONE]


def test_every_phase_can_be_reached_and_every_trigger_is_used() -> None:
    reached = {Phase.CONNECTING}
    for _ in Phase:
        reached |= {to for (src, _), to in TRANSITIONS.items() if src in reached}
    assert reached == set(Phase)
    assert {trigger for _, trigger in TRANSITIONS} == set(Trigger)


def _progress(resumed_round: int | None = None) -> Progress:
    return Progress(rounds=5, resumed_round=resumed_round, round_known_at=0.0, deadline=10.0)


def test_joining_is_the_phase_itself_not_a_flag_beside_it() -> None:
    progress = _progress()
    assert not progress.joining and progress.phase is Phase.CONNECTING
    progress.go(Trigger.FLEET_RUNS)
    assert progress.joining
    progress.go(Trigger.STATE_INSTALLED)
    assert not progress.joining and progress.phase is Phase.WAITING
    progress.go(Trigger.LEFT_OUT)  # the fleet went on without us
    assert progress.joining


def test_progress_knows_its_round_deadline_and_the_end_of_the_run() -> None:
    progress = _progress(resumed_round=4)
    assert progress.resumed and progress.round == 4 and not progress.done
    assert not progress.expired(9.9) and progress.expired(10.0)
    progress.round += 1
    assert progress.done
    assert not _progress().resumed and not Progress(rounds=0, resumed_round=9, round_known_at=0.0,
                                                   deadline=None).done  # 0: until stopped
