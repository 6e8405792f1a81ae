"""Bounded influence per contributor (agent/protocol/influence.py): the verdicts, the running
median, and a unit in a real FT-tree round: an honest one counted as sent, a hostile one
clipped or counted with zero values, and counted."""

from __future__ import annotations

import numpy as np
import pytest

from agent.protocol.allreduce import AllreduceConfig, RoundContext
from agent.protocol.ft_tree import FtTreeRound
from agent.protocol.influence import (
    FLOOR_SHARE,
    Influence,
    InfluenceBound,
    NormHistory,
    bound_unit,
    judge,
    norm,
)
from agent.protocol.notes import NoteKind
from agent.protocol.topology import Tree
from agent.protocol.wire import Frame, Kind, RejectReason


def test_the_verdicts_say_yes_and_no() -> None:
    assert judge(2.9, 1.0 * 3, 2.0) is Influence.WITHIN
    assert judge(3.0, 3.0, 2.0) is Influence.WITHIN
    assert judge(3.1, 3.0, 2.0) is Influence.CLIPPED
    assert judge(6.1, 3.0, 2.0) is Influence.REFUSED
    assert judge(float("inf"), 3.0, 2.0) is Influence.REFUSED
    assert judge(float("nan"), 3.0, 2.0) is Influence.REFUSED


def test_an_honest_unit_passes_unchanged_and_a_large_one_is_clipped_to_the_bound() -> None:
    bound = InfluenceBound((1.0, 2.0), factor=3.0, refuse_factor=2.0)
    honest = np.full(4, 0.5, np.float32)  # norm 1
    verdict, kept = bound_unit(honest, 0, bound)
    assert verdict is Influence.WITHIN and kept is honest
    flipped = np.full(4, -4.0, np.float32)  # norm 8, chunk 1's bound 6
    verdict, kept = bound_unit(flipped, 1, bound)
    assert verdict is Influence.CLIPPED
    assert norm(kept) == pytest.approx(6.0, rel=1e-6) and np.all(kept < 0)  # direction kept
    verdict, kept = bound_unit(np.full(4, 1800.0, np.float32), 0, bound)
    assert verdict is Influence.REFUSED and not np.any(kept)


def test_the_norm_does_not_overflow_on_float32_extremes() -> None:
    assert np.isfinite(norm(np.full(4, 1e20, np.float32)))
    assert norm(np.full(4, 3e38, np.float32)) == pytest.approx(6e38, rel=1e-6)


def test_the_median_follows_our_own_norms_and_ignores_one_outlier_round() -> None:
    history = NormHistory(window=5, factor=3.0)
    bounds = [(0, 4), (4, 8)]
    for r, scale in enumerate([1.0, 1.0, 100.0, 1.0]):
        bound = history.observe(r, np.full(8, scale * 0.5, np.float32), bounds)
    assert bound is not None and bound.medians == pytest.approx((1.0, 1.0))
    # The same round again (a restart on a new view) adds nothing.
    for _ in range(3):
        again = history.observe(3, np.full(8, 50.0, np.float32), bounds)
    assert again is not None and again.medians == pytest.approx((1.0, 1.0))


def test_an_all_zero_chunk_of_our_own_still_admits_a_peers_small_values() -> None:
    history = NormHistory(factor=3.0)
    grad = np.zeros(8, np.float32)
    grad[4:] = 1.0  # chunk 0 all zero here (inputs never lit on this shard), chunk 1 norm 2
    bound = history.observe(0, grad, [(0, 4), (4, 8)])
    assert bound is not None
    assert bound.medians[0] == pytest.approx(FLOOR_SHARE * 2.0 * np.sqrt(0.5))
    verdict, _ = bound_unit(np.full(4, 0.1, np.float32), 0, bound)
    assert verdict is Influence.WITHIN


def test_a_factor_of_zero_turns_the_bound_off() -> None:
    assert NormHistory(factor=0.0).observe(0, np.ones(4, np.float32), [(0, 4)]) is None


def test_a_new_chunk_layout_starts_its_own_history() -> None:
    history = NormHistory(factor=3.0)
    history.observe(0, np.full(8, 10.0, np.float32), [(0, 8)])
    bound = history.observe(1, np.full(8, 1.0, np.float32), [(0, 4), (4, 8)])
    assert bound is not None and bound.medians == pytest.approx((2.0, 2.0))


# ---------------------------------------------------------------------- in an FT-tree round

CFG = AllreduceConfig(chunk_size=4, min_timeout=0.05, initial_timeout=0.5, round_deadline=5.0)
TREE = Tree((0, 1, 2, 3), 2)  # 0 root; 1 inner with leaf 3


def inner(bound: InfluenceBound | None) -> FtTreeRound:
    grad = np.full(8, 0.5, np.float32)  # norm 1 per chunk
    m = FtTreeRound(RoundContext(CFG, TREE, 1, 0, grad, 0, CFG.new_links(), 0.0, influence=bound))
    m.start(0.0)
    return m


def unit_from_leaf(value: float, j: int = 0) -> Frame:
    frame = Frame(Kind.DATA, CFG.job, 0, 3, j, 2, contributors=frozenset({3}))
    return frame.with_values(np.full(4, value, np.float32), CFG.wire_dtype)


BOUND = InfluenceBound((1.0, 1.0), factor=3.0, refuse_factor=2.0)


def test_an_honest_childs_unit_is_counted_as_sent() -> None:
    m = inner(BOUND)
    m.on_frame(unit_from_leaf(0.6), 0.01)  # norm 1.2: within 3
    ids, values = m.reducer.merged(0)
    assert ids == {1, 3} and np.allclose(values, 0.55)
    assert m.stats.refused[RejectReason.NORM_CLIPPED] == m.stats.refused[RejectReason.NORM_REFUSED] == 0


def test_a_sign_flipped_x10_unit_is_bounded_and_noted() -> None:
    m = inner(BOUND)
    actions = m.on_frame(unit_from_leaf(-2.0), 0.01)  # norm 4: beyond 3, within 6: clipped
    _, values = m.reducer.merged(0)
    assert np.allclose(values, (0.5 - 1.5) / 2)  # its share held to 3 x the median, sign kept
    assert m.stats.refused[RejectReason.NORM_CLIPPED] == 1
    assert any(getattr(a, "kind", None) is NoteKind.INFLUENCE_BOUNDED and a.peer == 3 for a in actions)


def test_a_constant_unit_far_beyond_counts_with_zero_values_and_nobody_waits_for_it() -> None:
    m = inner(BOUND)
    m.on_frame(unit_from_leaf(100.0), 0.01)  # within the implausibility limit (1000)
    ids, values = m.reducer.merged(0)
    assert ids == {1, 3} and np.allclose(values, 0.25)  # covered, moves nothing
    assert m.stats.refused[RejectReason.NORM_REFUSED] == 1 and m.reducer.ready(0, {1, 3})


def test_without_a_bound_the_unit_is_taken_as_before() -> None:
    m = inner(None)
    m.on_frame(unit_from_leaf(-2.0), 0.01)
    _, values = m.reducer.merged(0)
    assert np.allclose(values, -0.75) and m.stats.refused[RejectReason.NORM_CLIPPED] == 0


def test_an_implausible_unit_under_a_bound_counts_with_zero_values_and_nobody_waits() -> None:
    m = inner(BOUND)
    m.on_frame(unit_from_leaf(1800.0), 0.01)  # beyond 1000 x our largest value
    ids, values = m.reducer.merged(0)
    assert ids == {1, 3} and np.allclose(values, 0.25) and m.stats.implausible == 1
