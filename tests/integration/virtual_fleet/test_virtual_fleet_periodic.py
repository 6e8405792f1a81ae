"""Periodic averaging in the in-memory fleet (the agent's own cores, fake time): sync-every
auto's period chosen by the coordinator and taken by every member at the same round."""

from __future__ import annotations

import itertools

from agent.protocol.allreduce import AllreduceConfig
from agent.protocol.notes import NoteKind
from agent.protocol.sync_period import AUTO_START, SETTLE_ROUNDS, PeriodRule
from simulate.virtual_fleet import FaultSpec, RoundRecord, run_fleet

# 20 ms a message, 10 ms a local step: a sync of ~80 ms, so a 20 % share needs ~32 steps.
LINKS = dict(length=1000, allreduce=AllreduceConfig(round_deadline=5.0), latency=0.02, compute_time=0.01,
             sync_every=AUTO_START, max_time=1e3)


def _steps(records: list[RoundRecord]) -> list[int | None]:
    """Each round's local steps, the same on every member that started it."""
    out = []
    for rec in records:
        steps = set(rec.local_steps.values())
        assert len(steps) == 1, (rec.round, rec.local_steps)
        out.append(steps.pop())
    return out


def _period_notes(records: list[RoundRecord]) -> list[str]:
    return [n.detail for r in records for notes in r.notes.values() for n in notes if n.kind == NoteKind.SYNC_PERIOD]


def test_auto_fleet_switches_from_its_start_to_the_coordinators_period_at_one_round() -> None:
    records = run_fleet(5, 16, sync_auto=PeriodRule(0.2), **LINKS)  # type: ignore[arg-type]
    steps = _steps(records)
    switch = steps.index(next(s for s in steps if s != AUTO_START))
    assert steps[:switch] == [AUTO_START] * switch and switch >= SETTLE_ROUNDS
    chosen = steps[switch]
    assert chosen is not None and 20 <= chosen <= 40, steps  # ~80 ms sync / 10 ms steps at 20 %
    assert steps[switch:] == [chosen] * (len(steps) - switch)  # decided once: no flapping
    notes = _period_notes(records)
    assert len(notes) == 1 and f"sync every {chosen} local steps (was 1)" in notes[0] and f"from round {switch}" in notes[0]
    for rec in records:  # every member holds the same bits at the start of every round
        assert len(set(rec.start_hashes.values())) == 1 and not rec.degraded


def test_a_larger_share_for_the_sync_picks_fewer_local_steps() -> None:
    tight = _steps(run_fleet(5, 12, sync_auto=PeriodRule(0.2), **LINKS))[-1]  # type: ignore[arg-type]
    loose = _steps(run_fleet(5, 12, sync_auto=PeriodRule(0.5), **LINKS))[-1]  # type: ignore[arg-type]
    assert tight is not None and loose is not None and loose * 3 < tight


def test_a_fixed_period_stays_and_no_period_is_one_gradient_a_round() -> None:
    assert set(_steps(run_fleet(5, 8, **{**LINKS, "sync_every": 8}))) == {8}  # type: ignore[arg-type]
    assert set(_steps(run_fleet(5, 4, **{**LINKS, "sync_every": None}))) == {None}  # type: ignore[arg-type]
    assert not _period_notes(run_fleet(5, 8, **{**LINKS, "sync_every": 8}))  # type: ignore[arg-type]


def test_the_period_outlives_its_coordinator() -> None:
    """The view without the crashed coordinator keeps the period; its successor judges anew."""
    records = run_fleet(5, 16, sync_auto=PeriodRule(0.2), faults=(FaultSpec("crash", 9, 0),),  # type: ignore[arg-type]
                        **LINKS)
    steps = _steps(records)
    assert steps[0] == AUTO_START and len(set(steps[6:])) == 1 and steps[-1] != AUTO_START, steps
    assert 0 not in records[-1].members
    for rec in records[-3:]:
        assert len(set(rec.start_hashes.values())) == 1


STRAGGLER = 5  # a leaf of the 7-node tree, its steps 3x the others'
STEP, SYNC_EVERY, DEADLINE = 0.01, 8, 0.05


def _fleet_periods(deadline: float) -> tuple[list[float], list[RoundRecord]]:
    """The time between the ends of consecutive rounds on the members other than the straggler."""
    records = run_fleet(7, 16, length=1000, allreduce=AllreduceConfig(round_deadline=5.0, straggler_deadline=deadline),
                        latency=0.002, compute_time=STEP, sync_every=SYNC_EVERY, slow=((STRAGGLER, 3.0),),
                        max_time=1e3)
    ends = [max(t for n, t in rec.result_at.items() if n != STRAGGLER) for rec in records]
    return [b - a for a, b in itertools.pairwise(ends)], records


def test_a_straggler_costs_the_fleet_at_most_its_deadline_per_sync_and_never_a_halt() -> None:
    waited, _ = _fleet_periods(0.0)
    assert min(waited[2:]) >= 3 * STEP * SYNC_EVERY  # without a deadline the fleet runs at its pace
    periods, records = _fleet_periods(DEADLINE)
    assert len(records) == 16  # every round ran: no halt
    compute = STEP * SYNC_EVERY
    assert max(periods[2:]) <= compute + DEADLINE + 0.02, periods  # the steps, the deadline, the sync
    for rec in records[2:]:
        assert STRAGGLER in rec.members  # left out of the average, never evicted
        fast = [res for n, res in rec.results.items() if n != STRAGGLER]
        assert all(set().union(*res.contributors) == set(rec.members) - {STRAGGLER} for res in fast)
        # Everybody who starts a round, the straggler included (the fleet's result or state
        # taken), starts it from the same model.
        assert len(set(rec.start_hashes.values())) == 1
    # It goes on with the fleet: each round it ends with the fleet's result, or past it with
    # the fleet's state once it fell behind (3x slower, it cannot keep up unwaited).
    assert all(STRAGGLER in rec.ended for rec in records[2:-1])
