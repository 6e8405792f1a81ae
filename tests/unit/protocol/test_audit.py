"""An inner node's own part of its unit, checked against its children's audit copies
(agent/protocol/audit.py), and the check in real FT-tree rounds: the grandchild sends the
copy, the grandparent keeps it and bounds the inner node's own part as a leaf's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest

from agent.protocol.allreduce import AllreduceConfig, RoundContext, Send
from agent.protocol.audit import Audit, CopyBook, as_counted, audit_unit, own_part, pieces
from agent.protocol.ft_tree import FtTreeRound
from agent.protocol.influence import InfluenceBound
from agent.protocol.topology import Tree
from agent.protocol.wire import DType, Flag, Frame, Kind, RejectReason

BOUND = InfluenceBound((1.0,), factor=3.0, refuse_factor=2.0)  # a member's unit: norm <= 3, zero beyond 6


def vec(value: float, n: int = 4) -> np.ndarray:
    return np.full(n, value, np.float32)  # norm 2 x value


def test_the_copies_must_make_up_the_unit_exactly() -> None:
    copies = [(frozenset({3}), vec(1.0)), (frozenset({4}), vec(1.0))]
    assert pieces(1, frozenset({1, 3, 4}), copies) == copies
    assert pieces(1, frozenset({1, 3}), copies) == copies[:1]  # 4 came late: not in this unit
    assert pieces(1, frozenset({1, 3, 4, 5}), copies) is None  # 5 unaccounted for
    assert pieces(1, frozenset({1}), copies) is None  # nothing to check: its own part only
    assert pieces(1, frozenset({1, 3}), [*copies, (frozenset({3, 9}), vec(0.0))]) == copies[:1]
    assert pieces(1, frozenset({1, 3}), [(frozenset({3}), vec(1.0)), (frozenset({3}), vec(2.0))]) is None


def test_the_own_part_is_the_sum_less_the_copies() -> None:
    own = own_part(frozenset({1, 3, 4}), vec(1.0), [(frozenset({3}), vec(0.5)), (frozenset({4}), vec(2.0))])
    assert np.allclose(own, 3.0 - 0.5 - 2.0)


def test_an_honest_inner_unit_counts_as_sent() -> None:
    unit = (vec(0.5) + vec(0.4) + vec(0.6)) / 3
    outcome = audit_unit(1, 0, frozenset({1, 3, 4}), unit, [(frozenset({3}), vec(0.4)), (frozenset({4}), vec(0.6))],
                         BOUND)
    assert outcome.audit is Audit.WITHIN and outcome.values is unit
    assert outcome.own_norm == pytest.approx(1.0, rel=1e-5)


@pytest.mark.parametrize("factor", [-3.0, -10.0])
def test_a_whole_unit_flipped_leaves_the_childrens_copies_and_a_bounded_own_part(factor: float) -> None:
    honest = (vec(0.5) + vec(0.5)) / 2
    outcome = audit_unit(1, 0, frozenset({1, 3}), honest * factor, [(frozenset({3}), vec(0.5))], BOUND)
    # Own part per value: factor - 0.5, norm >= 7: far beyond a member's bound, counted as zero.
    assert outcome.audit is Audit.REFUSED
    assert np.allclose(outcome.values, 0.25)  # (copy 0.5 + own 0) / 2: the child counts, the liar not


def test_an_own_gradient_flipped_x3_is_clipped_to_a_members_bound() -> None:
    own = vec(-2.0)  # norm 4: beyond a member's 3, within 6
    unit = (own + vec(0.5)) / 2
    outcome = audit_unit(1, 0, frozenset({1, 3}), unit, [(frozenset({3}), vec(0.5))], BOUND)
    assert outcome.audit is Audit.CLIPPED
    assert np.allclose(outcome.values, (vec(-1.5) + vec(0.5)) / 2)  # own part held to norm 3, sign kept


def test_a_supplement_adds_no_more_than_a_members_bound_of_its_own() -> None:
    copies = [(frozenset({4}), vec(0.5))]
    assert audit_unit(1, 0, frozenset({4}), vec(0.5), copies, BOUND).audit is Audit.WITHIN
    forged = audit_unit(1, 0, frozenset({4}), vec(5.0), copies, BOUND)
    assert forged.audit is Audit.REFUSED and np.allclose(forged.values, 0.5)


def test_without_copies_the_unit_is_unaudited_and_counts_as_sent() -> None:
    unit = vec(-9.0)
    outcome = audit_unit(1, 0, frozenset({1, 3}), unit, [], BOUND)
    assert outcome.audit is Audit.UNAUDITED and outcome.values is unit


def test_the_copy_book_keeps_the_first_copy_of_each_set() -> None:
    book = CopyBook()
    book.keep(0, 1, frozenset({3}), vec(1.0))
    book.keep(0, 1, frozenset({3}), vec(7.0))
    book.keep(1, 1, frozenset({3}), vec(2.0))
    assert [float(v[0]) for _, v in book.of(0, 1)] == [1.0] and book.of(0, 2) == []


# ---------------------------------------------------------------------- in FT-tree rounds

CFG = AllreduceConfig(chunk_size=4, min_timeout=0.05, initial_timeout=0.5, round_deadline=5.0, audit_units=True)
TREE = Tree((0, 1, 2, 3), 2)  # 0 root; 1 inner with leaf 3; 2 a leaf


def machine(node: int, value: float, cfg: AllreduceConfig = CFG) -> FtTreeRound:
    ctx = RoundContext(cfg, TREE, node, 0, vec(value, 8), 0, cfg.new_links(), 0.0, influence=BOUND)
    return FtTreeRound(ctx)


def unit(origin: int, ids: set[int], value: float, j: int = 0, flags: Flag = Flag.NONE) -> Frame:
    frame = Frame(Kind.DATA, CFG.job, 0, origin, j, 2, flags, contributors=frozenset(ids))
    return frame.with_values(vec(value), CFG.wire_dtype)


def sent_frames(actions: Sequence[object]) -> list[tuple[int, Frame]]:
    return [(a.dst, a.frame) for a in actions if isinstance(a, Send)]


def test_a_grandchild_sends_its_grandparent_a_copy_once_and_a_child_of_the_root_does_not() -> None:
    leaf = sent_frames(machine(3, 0.5).start(0.0))
    copies = [(peer, f) for peer, f in leaf if f.flags & Flag.AUDIT]
    assert sorted(peer for peer, _ in copies) == [0, 0]  # one per chunk, to the root
    assert all(f.kind is Kind.DATA and f.contributors == {3} and f.dtype is DType.I8 for _, f in copies)
    assert not any(f.flags & Flag.AUDIT for _, f in sent_frames(machine(2, 0.5).start(0.0)))
    off = sent_frames(machine(3, 0.5, replace(CFG, audit_units=False)).start(0.0))
    assert not any(f.flags & Flag.AUDIT for _, f in off)


def test_the_root_counts_a_liars_children_and_not_its_whole_flipped_unit() -> None:
    root = machine(0, 0.5)
    root.start(0.0)
    root.on_frame(unit(3, {3}, 0.5, flags=Flag.AUDIT), 0.01)  # the copy: kept, not counted
    assert root.reducer.covered(0) == {0}
    root.on_frame(unit(1, {1, 3}, -3 * 0.5), 0.02)  # node 1 flips its whole unit x-3
    ids, values = root.reducer.merged(0)
    assert ids == {0, 1, 3}
    assert np.allclose(values, (0.5 + 0.5 + 0.0) / 3)  # root, leaf 3's copy, node 1's own part zero
    assert root.stats.refused[RejectReason.OWN_PART_REFUSED] == 1


def test_the_root_counts_an_honest_inner_unit_as_sent() -> None:
    root = machine(0, 0.5)
    root.start(0.0)
    root.on_frame(unit(3, {3}, 0.4, flags=Flag.AUDIT), 0.01)
    root.on_frame(unit(1, {1, 3}, 0.45), 0.02)
    _, values = root.reducer.merged(0)
    assert np.allclose(values, (0.5 + 0.45 * 2) / 3)
    assert not root.stats.refused


def test_a_copy_from_anyone_but_a_grandchild_is_dropped() -> None:
    root = machine(0, 0.5)
    root.start(0.0)
    root.on_frame(unit(2, {2}, 0.5, flags=Flag.AUDIT), 0.01)  # a child, not a grandchild
    root.on_frame(unit(3, {1, 3}, 0.5, flags=Flag.AUDIT), 0.01)  # claims beyond its subtree
    assert root.auditor.copies.copies == {} and root.stats.dropped == 2


def test_a_suspects_copy_may_have_been_left_out_by_its_honest_parent() -> None:
    # Node 1 left its lying child 3 out (zero): its unit is (own 0.5 + 0) / 2.
    copies = [(frozenset({3}), vec(-1.4))]  # the liar's copy, within the bound here
    unit = (vec(0.5) + vec(0.0)) / 2
    blamed = audit_unit(1, 0, frozenset({1, 3}), unit, copies, BOUND)
    assert blamed.audit is not Audit.WITHIN  # read as counted, node 1's own part looks off
    read = audit_unit(1, 0, frozenset({1, 3}), unit, copies, BOUND, suspects=frozenset({3}))
    assert read.audit is Audit.WITHIN and read.values is unit and read.own_norm == pytest.approx(1.0)


def test_the_reading_that_leaves_the_smallest_own_part_is_taken() -> None:
    parts = [(frozenset({3}), vec(2.0)), (frozenset({4}), vec(0.5))]
    unit = (vec(0.5) + vec(2.0) + vec(0.5)) / 3  # nobody left out
    assert [float(v[0]) for _, v in as_counted(frozenset({1, 3, 4}), unit, parts, frozenset({3, 4}))] == [2.0, 0.5]
    left = (vec(0.5) + vec(0.5)) / 3  # 3 left out
    assert [float(v[0]) for _, v in as_counted(frozenset({1, 3, 4}), left, parts, frozenset({3}))] == [0.0, 0.5]
