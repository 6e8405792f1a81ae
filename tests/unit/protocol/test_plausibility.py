"""The per-child record (agent/protocol/plausibility.py), and a liar left out in real FT-tree
rounds: a leaf's unit, an inner node's own part (its children still counted)."""

from __future__ import annotations

import numpy as np

from agent.protocol.allreduce import AllreduceConfig, Note, RoundContext
from agent.protocol.ft_tree import FtTreeRound
from agent.protocol.influence import InfluenceBound
from agent.protocol.notes import NoteKind
from agent.protocol.plausibility import (
    FLAG_ROUNDS,
    WINDOW,
    Evidence,
    PlausibilityBook,
)
from agent.protocol.topology import Tree
from agent.protocol.wire import Flag, Frame, Kind, RejectReason


def test_a_child_is_flagged_after_enough_far_off_rounds_within_the_window_once() -> None:
    book = PlausibilityBook()
    flags = [book.observe(3, r, Evidence.FAR) for r in range(FLAG_ROUNDS)]
    assert flags == [False] * (FLAG_ROUNDS - 1) + [True] and book.flagged(3)
    assert not book.observe(3, FLAG_ROUNDS, Evidence.FAR)  # flagged once
    assert "left out from round" in book.evidence(3) and not book.flagged(4)


def test_far_off_rounds_spread_wider_than_the_window_or_in_one_round_flag_nobody() -> None:
    book = PlausibilityBook()
    for r in range(0, 10 * WINDOW, WINDOW // (FLAG_ROUNDS - 1) + 1):
        book.observe(3, r, Evidence.FAR)
    for _ in range(5):
        book.observe(4, 7, Evidence.FAR)  # both chunks of one round, several times: one round
    assert not book.flagged(3) and not book.flagged(4)


def test_a_child_beyond_the_bound_in_every_round_is_a_suspect_but_never_flagged() -> None:
    book = PlausibilityBook()
    # Measured: an honest dirichlet:0.1 leaf clipped in 7 rounds in a row, as a x-3 flip is.
    assert not any(book.observe(4, r, Evidence.BEYOND) for r in range(3 * WINDOW))
    assert not book.flagged(4) and 4 in book.suspects


# ---------------------------------------------------------------------- in FT-tree rounds

CFG = AllreduceConfig(chunk_size=4, min_timeout=0.05, initial_timeout=0.5, round_deadline=5.0, audit_units=True)
TREE = Tree((0, 1, 2, 3), 2)  # 0 root; 1 inner with leaf 3; 2 a leaf
BOUND = InfluenceBound((1.0, 1.0), factor=3.0, refuse_factor=2.0)


def vec(value: float) -> np.ndarray:
    return np.full(4, value, np.float32)


def unit(rnd: int, origin: int, ids: set[int], value: float, flags: Flag = Flag.NONE) -> Frame:
    frame = Frame(Kind.DATA, CFG.job, rnd, origin, 0, 2, flags, contributors=frozenset(ids))
    return frame.with_values(vec(value), CFG.wire_dtype)


def root_round(rnd: int, book: PlausibilityBook) -> FtTreeRound:
    ctx = RoundContext(CFG, TREE, 0, rnd, np.full(8, 0.5, np.float32), 0, CFG.new_links(), 0.0,
                       influence=BOUND, plausibility=book)
    machine = FtTreeRound(ctx)
    machine.start(0.0)
    return machine


def test_a_leaf_far_beyond_the_bound_in_several_rounds_is_left_out_and_noted_once() -> None:
    book, notes = PlausibilityBook(), list[Note]()
    for rnd in range(FLAG_ROUNDS):
        root = root_round(rnd, book)
        notes += [a for a in root.on_frame(unit(rnd, 2, {2}, -5.0), 0.01) if isinstance(a, Note) and a.kind is NoteKind.LIAR]
    assert book.flagged(2) and len(notes) == 1 and notes[0].peer == 2
    root = root_round(FLAG_ROUNDS, book)
    root.on_frame(unit(FLAG_ROUNDS, 2, {2}, 0.5), 0.01)  # honest-looking now: still left out
    ids, values = root.reducer.merged(0)
    assert ids == {0, 2} and np.allclose(values, 0.25)


def test_an_inner_liar_is_left_out_and_its_children_still_count() -> None:
    book = PlausibilityBook()
    for rnd in range(FLAG_ROUNDS):
        root = root_round(rnd, book)
        root.on_frame(unit(rnd, 3, {3}, 0.5, Flag.AUDIT), 0.01)
        root.on_frame(unit(rnd, 1, {1, 3}, -1.5), 0.02)  # whole unit x-3: own part far beyond
    assert book.flagged(1) and root.stats.refused[RejectReason.LIAR_LEFT_OUT] == 1
    root = root_round(FLAG_ROUNDS, book)
    root.on_frame(unit(FLAG_ROUNDS, 3, {3}, 0.4, Flag.AUDIT), 0.01)
    root.on_frame(unit(FLAG_ROUNDS, 1, {1, 3}, 0.45), 0.02)  # plausible now: its own part still out
    ids, values = root.reducer.merged(0)
    assert ids == {0, 1, 3} and np.allclose(values, (0.5 + 0.4 + 0.0) / 3)


def test_an_honest_inner_node_is_never_flagged() -> None:
    book = PlausibilityBook()
    for rnd in range(3 * WINDOW):
        root = root_round(rnd, book)
        root.on_frame(unit(rnd, 3, {3}, 0.6, Flag.AUDIT), 0.01)
        root.on_frame(unit(rnd, 1, {1, 3}, 0.55), 0.02)
    assert not book.records.get(1) or not book.flagged(1)
    assert not root.stats.refused
