"""The FT-tree after our broker connection dropped and came back within a round."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from agent.protocol.allreduce import AllreduceConfig, RoundContext, Send
from agent.protocol.ft_tree import FtTreeRound
from agent.protocol.topology import Tree
from agent.protocol.wire import Flag, Frame, Kind

CFG = AllreduceConfig(chunk_size=8, min_timeout=0.05, initial_timeout=0.5, round_deadline=5.0)
TREE = Tree((0, 1, 2, 3, 4, 5, 6), 2)  # 0 root; 1 inner with leaves 3 and 4


def inner() -> FtTreeRound:
    links = CFG.new_links()
    for peer in (0, 3, 4):
        for _ in range(5):
            links.observe(peer, 0.01)  # RTOs at the 0.05 s floor
    m = FtTreeRound(RoundContext(CFG, TREE, 1, 0, np.ones(8, np.float32), 0, links, 0.0))
    m.start(0.0)
    return m


def data_from(child: int) -> Frame:
    frame = Frame(Kind.DATA, CFG.job, 0, child, 0, 1, Flag.NONE, origin=child, contributors=frozenset({child}))
    return frame.with_values(np.full(8, 0.5, np.float32))


def sent_up(actions: list[object]) -> list[frozenset[int]]:
    return [a.frame.contributors for a in actions
            if isinstance(a, Send) and a.dst == 0 and a.frame.kind == Kind.DATA]


def test_back_from_a_short_drop_an_inner_node_passes_on_what_it_has_within_a_timeout() -> None:
    """Child 4 sends to us as usual; child 3 started the round while our Will was out and
    sent around us, to the root. Waiting a whole wait for 3 kept the root waiting for 4.
    (What the core does after a short drop: ``reconnected``, then ``went_on``.)"""
    m = inner()
    assert sent_up(m.on_frame(data_from(4), 0.01)) == []  # still waiting for 3
    back = m.reconnected(0.02) + m.went_on(0.02)
    # What 3 sent us while we were away is lost: asked for at once, not after its timeout.
    nacks = [(a.dst, a.frame.indices()) for a in back if isinstance(a, Send) and a.frame.kind == Kind.NACK]
    assert nacks == [(3, [0])]
    up = sent_up(back)
    while not up and (wake := m.next_timer()) is not None and wake < 1.0:
        up = sent_up(m.on_timer(wake))
        at = wake
    assert up == [frozenset({1, 4})]
    assert at <= 0.02 + CFG.min_timeout + 1e-9, at  # children's first frames not measured yet
    # 3's data, if it comes after all (it resent to us), follows as a unit of its own.
    assert sent_up(m.on_frame(data_from(3), at + 0.01)) == [frozenset({3})]


def test_a_result_the_fleet_reached_without_us_is_applied_as_it_is() -> None:
    """Our Will came and the root averaged without us: we take the fleet's mean unchanged
    (adding our own gradient made our model drift, a state transfer after every flap)."""
    links = CFG.new_links()
    leaf = FtTreeRound(RoundContext(CFG, TREE, 3, 0, np.ones(8, np.float32), 0, links, 0.0))
    leaf.start(0.0)
    without_us = frozenset({0, 1, 2, 4, 5, 6})
    final = Frame(Kind.DATA, CFG.job, 0, 1, 0, 1, Flag.BROADCAST | Flag.FINAL, origin=0, contributors=without_us)
    leaf.on_frame(final.with_values(np.full(8, 0.25, np.float32)), 0.05)
    assert leaf.result is not None
    assert leaf.result.contributors == (without_us,)
    assert np.array_equal(leaf.result.values, np.full(8, 0.25, np.float32))
    assert not leaf.result.degraded  # the root's report says what it missed, not ours


def around_from(child: int, ids: frozenset[int], chunks: list[int]) -> Frame:
    ack = Frame(Kind.ACK, CFG.job, 0, child, chunks[0], 1, Flag.AROUND, origin=child, target=1, contributors=ids)
    return ack.with_indices(chunks)


def test_back_from_a_drop_an_inner_node_told_its_childs_unit_went_around_it_passes_on_at_once() -> None:
    """Waiting as long as a first frame takes for a child whose unit the root already had
    kept the root waiting for us: 0.27 s rounds against 0.05 s in a flapping fleet."""
    m = inner()
    m.on_frame(data_from(4), 0.01)
    m.reconnected(0.02)
    m.went_on(0.02)
    assert sent_up(m.on_frame(around_from(3, frozenset({3}), [0]), 0.021)) == [frozenset({1, 4})]


def test_went_around_from_a_non_child_or_for_others_or_for_part_of_what_we_lack_is_no_reason_to_stop_waiting() -> None:
    for frame in (around_from(5, frozenset({5}), [0]),  # not our child
                  around_from(3, frozenset({3, 4}), [0]),  # speaks for its sibling
                  replace(around_from(3, frozenset({3}), [0]), origin=0)):  # relayed: not its own word
        m = inner()
        m.on_frame(data_from(4), 0.01)
        assert sent_up(m.on_frame(frame, 0.02)) == []
        assert m.stats.dropped == 1


def leaf_acked_by(aggregator: int) -> FtTreeRound:
    m = FtTreeRound(RoundContext(CFG, TREE, 3, 0, np.ones(8, np.float32), 0, CFG.new_links(), 0.0))
    m.start(0.0)
    ack = Frame(Kind.ACK, CFG.job, 0, aggregator, 0, 1, Flag.NONE, origin=aggregator, target=3,
                contributors=frozenset({3}))
    m.on_frame(ack.with_indices([0]), 0.01)
    return m


def arounds(actions: list[object]) -> list[tuple[int, list[int], frozenset[int]]]:
    return [(a.dst, a.frame.indices(), a.frame.contributors) for a in actions
            if isinstance(a, Send) and a.frame.kind == Kind.ACK and a.frame.flags & Flag.AROUND]


def test_a_child_whose_unit_another_aggregator_took_says_so_to_its_parents_nack_only() -> None:
    nack = Frame(Kind.NACK, CFG.job, 0, 1, 0, 1, Flag.NONE, origin=1, target=3).with_indices([0])
    assert arounds(leaf_acked_by(0).on_frame(nack, 0.02)) == [(1, [0], frozenset({3}))]
    # The parent itself had it (it lost it while away): nothing went around it.
    assert arounds(leaf_acked_by(1).on_frame(nack, 0.02)) == []
    # A NACK from a node that is not our parent learns nothing from us.
    assert arounds(leaf_acked_by(0).on_frame(replace(nack, sender=4, origin=4), 0.02)) == []
