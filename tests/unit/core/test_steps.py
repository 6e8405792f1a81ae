"""The steps between the phases (agent/core/steps.py): the one decision how a round ends, and
the one table of which step runs in which phase."""

from __future__ import annotations

import numpy as np

from agent.core.progress import Phase
from agent.core.steps import ADVANCE, RoundEnd, round_end
from agent.protocol.allreduce import RoundResult, RoundStats


def _result(missing: tuple[int, ...] = (), root_hash: int | None = None) -> RoundResult:
    return RoundResult(round=7, values=np.ones(4, np.float32), contributors=(frozenset({0, 1}),),
                       missing_chunks=missing, degraded=bool(missing), root_model_hash=root_hash,
                       stats=RoundStats(), link_states={})


def test_a_round_is_given_up_when_the_fleets_later_state_is_here_whatever_its_result() -> None:
    result = _result()
    assert round_end(7, 9, result, 0) == (RoundEnd.ABANDON, None)
    assert round_end(7, 9, None, 0) == (RoundEnd.ABANDON, None)


def test_without_a_result_the_round_is_unfinished_and_a_state_of_it_or_before_resyncs() -> None:
    result = _result()
    assert round_end(7, None, None, 0) == (RoundEnd.UNFINISHED, None)
    assert round_end(7, 7, None, 0) == (RoundEnd.UNFINISHED, None)
    assert round_end(7, 7, result, 0) == (RoundEnd.RESYNC, None)
    assert round_end(7, 5, result, 0) == (RoundEnd.RESYNC, None)


def test_every_phase_before_the_end_has_a_step_and_the_finished_ones_none() -> None:
    stepped = set().union(*(phases for phases, _, _ in ADVANCE))
    assert stepped == {Phase.JOINING, Phase.WAITING, Phase.COMPUTING, Phase.RUNNING, Phase.FINAL_SYNC}
    assert not stepped & {Phase.CONNECTING, Phase.LINGERING, Phase.DONE}  # time moves those


def test_a_result_is_applied_and_when_our_model_differs_from_the_fleets_its_state_is_fetched_too() -> None:
    assert round_end(7, None, _result(root_hash=0xab), 0xab) == (RoundEnd.APPLY, None)
    assert round_end(7, None, _result(root_hash=None), 0xab) == (RoundEnd.APPLY, None)
    end, why = round_end(7, None, _result(root_hash=0xcd), 0xab)
    assert end is RoundEnd.APPLY_AND_FETCH and why == "000000ab != root 000000cd"
    assert round_end(7, None, _result(missing=(1,)), 0xab) == (
        RoundEnd.APPLY_AND_FETCH, "1 chunks fell back to the local value")

