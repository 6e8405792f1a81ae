"""The FT-tree when its root goes down: a live parent passes on a result it already has, and a
round that ended without one says so to whoever asks (instead of leaving them to pull until
the deadline)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from agent.protocol.allreduce import AllreduceConfig, RoundContext, Send
from agent.protocol.ft_tree import FtTreeRound
from agent.protocol.topology import Tree
from agent.protocol.wire import Flag, Frame, Kind

CFG = AllreduceConfig(chunk_size=4, timeout_mode="fixed", fixed_timeout=0.1, round_deadline=5.0)
TREE = Tree((0, 1, 2, 3, 4, 5, 6), 2)  # 0 root; 1 inner with leaves 3 and 4
EVERYONE = frozenset(range(7))


def machine(node: int) -> FtTreeRound:
    m = FtTreeRound(RoundContext(CFG, TREE, node, 0, np.ones(8, np.float32), 0, CFG.new_links(), 0.0))
    m.start(0.0)
    return m


def sends(actions: list[object], kind: Kind) -> list[Send]:
    return [a for a in actions if isinstance(a, Send) and a.frame.kind == kind]


def final(j: int, sender: int) -> Frame:
    return Frame(Kind.DATA, CFG.job, 0, sender, j, 2, Flag.BROADCAST | Flag.FINAL,
                 contributors=EVERYONE).with_values(np.full(4, 0.5, np.float32))


def test_a_parent_that_ended_without_the_root_says_so_and_the_child_ends_at_once() -> None:
    parent, leaf = machine(1), machine(3)
    parent.peer_down(0, 0.01)  # our parent is the root's child: nobody to ask, skip
    assert parent.result is not None and parent.result.contributors == (frozenset(), frozenset())
    pull = Frame(Kind.PULL, CFG.job, 0, 3, 0, 2, Flag.BROADCAST)
    notices = sends(parent.on_frame(pull, 0.02), Kind.NACK)
    assert [(n.dst, n.frame.flags & Flag.FINAL, n.frame.indices()) for n in notices] == [(3, Flag.FINAL, [0, 1])]
    assert leaf.result is None
    leaf.on_frame(notices[0].frame, 0.03)
    assert leaf.result is not None and leaf.result.finished_at == 0.03  # not the 5 s deadline
    assert leaf.result.contributors == (frozenset(), frozenset())  # skipped, as its parent did


def test_only_the_parent_or_the_root_can_say_a_round_has_no_result() -> None:
    leaf = machine(3)
    sibling_says = Frame(Kind.NACK, CFG.job, 0, 4, 0, 2, Flag.BROADCAST | Flag.FINAL).with_indices([0, 1])
    leaf.on_frame(sibling_says, 0.02)
    assert leaf.result is None  # a peer's word that is not the result's source counts for nothing


def test_on_the_roots_will_a_leaf_takes_the_result_its_parent_already_has() -> None:
    leaf = machine(3)
    asked = sends(leaf.peer_down(0, 0.01), Kind.PULL)
    assert [a.dst for a in asked] == [1] and leaf.result is None  # asks before it skips
    for j in (0, 1):
        leaf.on_frame(replace(final(j, 1), target=3), 0.02)  # the answer names its puller
    assert leaf.result is not None and not leaf.result.degraded  # the root's data counts
    assert leaf.result.contributors == (EVERYONE, EVERYONE)


def test_on_the_roots_will_a_leaf_whose_parent_is_silent_skips_after_one_pull_timeout() -> None:
    leaf = machine(3)
    leaf.peer_down(0, 0.01)
    while leaf.result is None and (wake := leaf.next_timer()) is not None and wake < 1.0:
        leaf.on_timer(wake)
    assert leaf.result is not None and leaf.result.contributors == (frozenset(), frozenset())
    assert leaf.result.finished_at <= 0.01 + CFG.fixed_timeout + 1e-9


def test_a_parent_still_waiting_tells_an_early_puller_when_its_round_ends_without_a_result() -> None:
    parent = machine(1)
    pull = Frame(Kind.PULL, CFG.job, 0, 3, 0, 2, Flag.BROADCAST)
    assert sends(parent.on_frame(pull, 0.01), Kind.NACK) == []  # it may still get the result
    notices = sends(parent.peer_down(0, 0.02), Kind.NACK)
    assert [(n.dst, n.frame.indices()) for n in notices] == [(3, [0, 1])]


def test_a_round_whose_chunks_were_skipped_is_degraded_even_with_everyone_else_down() -> None:
    # Our connection dropped (a site broker's restart): everyone else is down for us, one
    # chunk of the root's result came, the other was skipped. Our model is not the fleet's:
    # the round says so (it said "complete", and a bench counted a second model).
    node = machine(1)
    node.on_frame(final(0, 0), 0.01)
    for peer in (2, 3, 4, 5, 6):
        node.peer_down(peer, 0.02)
    node.peer_down(0, 0.03)
    assert node.result is not None and node.result.contributors == (EVERYONE, frozenset())
    assert node.result.degraded
