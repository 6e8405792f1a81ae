"""sync-every auto: the coordinator's period from the members' step and sync times."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.protocol.sync_period import (
    CHANGE_RATIO,
    MAX_SYNC_EVERY,
    SETTLE_ROUNDS,
    ChangePeriod,
    Hold,
    KeepPeriod,
    PeriodRule,
    Timing,
    comm_share,
    decide_period,
    median_timing,
    sync_every_for,
)

RULE = PeriodRule(0.2)


def test_the_period_is_the_fewest_steps_whose_sync_takes_at_most_the_share() -> None:
    # 1 s sync, 5 ms steps: 0.8 / (0.2 * 0.005) = 800 steps, held to 64.
    assert sync_every_for(Timing(0.005, 1.0), RULE) == MAX_SYNC_EVERY
    # 40 ms sync, 10 ms steps: 0.04 * 0.8 / (0.2 * 0.01) = 16 exactly (not 17 by float error).
    assert sync_every_for(Timing(0.01, 0.04), RULE) == 16
    assert comm_share(Timing(0.01, 0.04), 16) == pytest.approx(0.2)
    assert comm_share(Timing(0.01, 0.04), 15) > 0.2
    # A sync shorter than a step: one step is already under the share.
    assert sync_every_for(Timing(0.1, 0.01), RULE) == 1
    assert sync_every_for(Timing(0.01, 0.04), PeriodRule(0.5)) == 4
    assert sync_every_for(Timing(0.0, 0.5), RULE) == MAX_SYNC_EVERY  # steps cost nothing measurable
    assert sync_every_for(Timing(0.01, 0.0), RULE) == 1


@given(st.floats(1e-5, 10), st.floats(1e-5, 100), st.floats(0.01, 0.99))
def test_the_chosen_period_meets_the_share_unless_clamped_and_one_fewer_would_not(
        step: float, sync: float, share: float) -> None:
    rule = PeriodRule(share, 1, MAX_SYNC_EVERY)
    timing = Timing(step, sync)
    h = sync_every_for(timing, rule)
    assert 1 <= h <= MAX_SYNC_EVERY
    if h < MAX_SYNC_EVERY:
        assert comm_share(timing, h) <= share + 1e-9
    if h > 1:
        assert comm_share(timing, h - 1) > share - 1e-9


def test_the_fleets_pace_is_its_median_member_not_a_straggler() -> None:
    timings = [Timing(0.01, 0.2), Timing(0.011, 0.21), Timing(0.2, 0.01), Timing(0.009, 0.19), Timing(0.01, 0.2)]
    assert median_timing(timings) == Timing(0.01, 0.2)


def test_a_period_is_judged_after_it_settled_and_with_a_majority_measured() -> None:
    slow_link = [Timing(0.005, 1.0)] * 4
    assert decide_period(1, SETTLE_ROUNDS - 1, slow_link, 4, RULE) == KeepPeriod(Hold.SETTLING)
    assert decide_period(1, SETTLE_ROUNDS, slow_link[:2], 4, RULE) == KeepPeriod(Hold.UNMEASURED)
    assert decide_period(1, SETTLE_ROUNDS, [], 1, RULE) == KeepPeriod(Hold.UNMEASURED)
    change = decide_period(1, SETTLE_ROUNDS, slow_link[:3], 4, RULE)
    assert change == ChangePeriod(MAX_SYNC_EVERY, Timing(0.005, 1.0))
    assert "sync every 64 local steps (was 1)" in change.describe(1)


def test_small_moves_of_the_ideal_period_keep_the_view() -> None:
    timings = [Timing(0.01, 0.04)] * 3  # ideal 16
    assert decide_period(16, 10, timings, 3, RULE) == KeepPeriod(Hold.WITHIN)
    assert decide_period(14, 10, timings, 3, RULE) == KeepPeriod(Hold.WITHIN)  # 16 / 14 < CHANGE_RATIO
    assert decide_period(19, 10, timings, 3, RULE) == KeepPeriod(Hold.WITHIN)
    assert decide_period(20, 10, timings, 3, RULE) == ChangePeriod(16, Timing(0.01, 0.04))  # 20 / 16 = CHANGE_RATIO
    low = int(16 / CHANGE_RATIO)
    assert decide_period(low, 10, timings, 3, RULE) == ChangePeriod(16, Timing(0.01, 0.04))  # up
    assert decide_period(40, 10, timings, 3, RULE) == ChangePeriod(16, Timing(0.01, 0.04))  # and down
    # Held at the top: an ideal beyond it is the top, and the top stays.
    assert decide_period(MAX_SYNC_EVERY, 10, [Timing(0.001, 5.0)] * 3, 3, RULE) == KeepPeriod(Hold.WITHIN)


@pytest.mark.parametrize("bad", [{"comm_share": 0.0}, {"comm_share": 1.0}, {"comm_share": -0.2},
                                 {"lo": 0}, {"lo": 9, "hi": 8}])
def test_a_rule_outside_its_range_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        PeriodRule(**bad)  # type: ignore[arg-type]
