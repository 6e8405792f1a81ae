"""The chunk reducer alone: what it counts, what it refuses, what goes up."""

from __future__ import annotations

import numpy as np
import pytest

from agent.protocol.ft_reducer import IMPLAUSIBLE_FACTOR, ChunkReducer, Offer, peak
from agent.protocol.wire import DType


def vec(value: float) -> np.ndarray:
    return np.full(4, value, np.float32)


def reducer(passes_up: bool = True, own_peak: float = 1.0) -> ChunkReducer:
    r = ChunkReducer(2, own_peak, passes_up)
    r.accept(0, frozenset({1}), vec(1.0))
    return r


def test_disjoint_units_merge_into_the_weighted_mean() -> None:
    r = reducer()
    assert r.classify(0, frozenset({3, 4})) is Offer.NEW
    r.accept(0, frozenset({3, 4}), vec(4.0))
    ids, mean = r.merged(0)
    assert ids == {1, 3, 4} and mean.tolist() == pytest.approx([3.0] * 4)  # (1 + 2 * 4) / 3
    assert r.ready(0, {1, 3, 4}) and not r.ready(0, {1, 3, 4, 5})


def test_a_covered_set_is_a_duplicate_and_a_partial_overlap_is_refused() -> None:
    r = reducer()
    r.accept(0, frozenset({3, 4}), vec(4.0))
    assert r.classify(0, frozenset({3})) is Offer.DUPLICATE
    assert r.classify(0, frozenset({4, 5})) is Offer.OVERLAP
    assert r.classify(1, frozenset({4, 5})) is Offer.NEW  # chunks are counted apart


def test_a_unit_holding_units_not_sent_up_yet_replaces_them() -> None:
    r = reducer()
    r.accept(0, frozenset({3}), vec(3.0))
    assert r.classify(0, frozenset({3, 4})) is Offer.NEW
    r.accept(0, frozenset({3, 4}), vec(5.0))
    ids, mean = r.merged(0)
    assert ids == {1, 3, 4} and mean.tolist() == pytest.approx([11 / 3] * 4)  # (1 + 2 * 5) / 3


def test_a_unit_holding_units_already_sent_up_is_an_overlap_except_at_the_root() -> None:
    for passes_up, offer in ((True, Offer.OVERLAP), (False, Offer.NEW)):
        r = reducer(passes_up)
        r.accept(0, frozenset({3}), vec(3.0))
        r.take_unsent(0)
        assert r.classify(0, frozenset({3, 4})) is offer


def test_what_goes_up_is_each_unit_once_first_the_chunk_then_supplements() -> None:
    r = reducer()
    assert not r.first_sent(0) and r.sent_so_far(0) is None
    first = r.take_unsent(0)
    assert first is not None and first[0] == {1} and r.first_sent(0)
    assert r.take_unsent(0) is None  # nothing new
    r.accept(0, frozenset({3}), vec(3.0))
    supplement = r.take_unsent(0)
    assert supplement is not None and supplement[0] == {3}
    so_far = r.sent_so_far(0)
    assert so_far is not None and so_far[0] == {1, 3} and so_far[1].tolist() == pytest.approx([2.0] * 4)
    assert not r.all_first_sent()
    r.take_unsent(1)  # an empty chunk opens too
    assert r.all_first_sent()


def test_values_far_beyond_our_own_are_implausible() -> None:
    r = reducer(own_peak=0.5)  # at least 1 counts: tiny gradients do not make everything suspect
    assert r.plausible(vec(IMPLAUSIBLE_FACTOR))
    assert not r.plausible(vec(-IMPLAUSIBLE_FACTOR * 1.01))
    assert peak(np.array([-3.0, 2.0], np.float32)) == 3.0 and peak(np.array([], np.float32)) == 0.0


def test_the_narrowest_format_merged_into_a_chunk_is_kept() -> None:
    r = reducer()
    assert r.narrowest(0) == DType.F32
    r.accept(0, frozenset({3}), vec(3.0), DType.I8)
    r.accept(0, frozenset({4}), vec(3.0), DType.F16)
    assert r.narrowest(0) == DType.I8 and r.narrowest(1) == DType.F32
