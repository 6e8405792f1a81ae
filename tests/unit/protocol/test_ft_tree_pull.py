"""Whom a node without the round's result asks, and how long it waits for each answer."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from agent.protocol.allreduce import AllreduceConfig, Broadcast, RoundContext, Send, frame_size
from agent.protocol.answer_budget import AMPLIFICATION, asked_indices, padded
from agent.protocol.ft_courier import NACK_RESENDS_PER_UNIT
from agent.protocol.ft_tree import FtTreeRound
from agent.protocol.rto import LinkEstimators
from agent.protocol.topology import Tree
from agent.protocol.wire import DType, Flag, Frame, Kind

CFG = AllreduceConfig(chunk_size=4, min_timeout=0.05, initial_timeout=0.5, round_deadline=5.0)
TREE = Tree((0, 1, 2, 3, 4, 5, 6), 2)  # 0 root; 1 inner with leaves 3 and 4


def leaf(links: LinkEstimators) -> FtTreeRound:
    m = FtTreeRound(RoundContext(CFG, TREE, 3, 0, np.ones(8, np.float32), 0, links, 0.0))
    m.start(0.0)
    return m


def acked(m: FtTreeRound, now: float) -> None:
    """The parent ACKs our reduce units: only the broadcast is left to wait for."""
    for j in (0, 1):
        ack = Frame(Kind.ACK, CFG.job, 0, 1, j, 2, Flag.NONE, origin=1, target=3, contributors=frozenset({3}))
        m.on_frame(ack.with_indices([j]), now)


def pulls_until(m: FtTreeRound, until: float) -> list[tuple[float, int]]:
    out: list[tuple[float, int]] = []
    while (wake := m.next_timer()) is not None and wake < until:
        out += [(wake, a.dst) for a in m.on_timer(wake) if isinstance(a, Send) and a.frame.kind == Kind.PULL]
    return out


def measured_parent() -> LinkEstimators:
    links = CFG.new_links()
    for _ in range(5):
        links.observe(1, 0.01)  # the parent's link: RTO at the 0.05 s floor
    return links


def test_a_node_whose_parent_went_down_asks_the_grandparent_first_not_a_sibling() -> None:
    m = leaf(measured_parent())
    acked(m, 0.01)
    actions = m.peer_down(1, 0.02)  # the parent's Will: its siblings wait for it as we do
    asked = [a.dst for a in actions if isinstance(a, Send) and a.frame.kind == Kind.PULL]
    asked += [dst for _, dst in pulls_until(m, 0.021)]
    assert asked[:1] == [0], asked


def test_an_unmeasured_sibling_asked_for_the_result_gets_the_parents_timeout_not_the_initial() -> None:
    m = leaf(measured_parent())
    acked(m, 0.01)
    asked = pulls_until(m, 2.0)[:2]
    (first_at, first), (second_at, second) = asked
    assert (first, second) == (4, 0), asked  # the sibling first: a cut link of ours is likelier
    assert second_at - first_at <= 2 * CFG.min_timeout, asked  # not the 0.5 s initial timeout


@pytest.mark.parametrize("broadcast", ["tree", "fanout"])
def test_a_puller_gets_the_result_from_us_only_when_its_parent_cannot_send_it(broadcast: Broadcast) -> None:
    """In a round stalled on a frozen node every member pulls; each copy the root sent to a
    puller whose parent was alive doubled that puller's broadcast (30 MB more at 15 agents).
    A puller whose parent is down gets it from us."""
    cfg = replace(CFG, broadcast=broadcast)
    tree = Tree(tuple(range(15)), 2)  # 3 (parent of 7 and 8) is down; 5's parent 2 lives
    root = FtTreeRound(RoundContext(cfg, tree, 0, 0, np.zeros(8, np.float32), 0, cfg.new_links(), 0.0))
    root.start(0.0)
    root.peer_down(3, 0.01)
    for puller in (5, 7):
        root.on_frame(Frame(Kind.PULL, CFG.job, 0, puller, 0, 2, Flag.BROADCAST, origin=puller, target=0), 0.02)
    sent: list[Send] = []
    for sender, ids in ((1, {1, 4, 7, 8, 9, 10}), (2, {2, 5, 6, 11, 12, 13, 14})):
        for j in (0, 1):
            unit = Frame(Kind.DATA, CFG.job, 0, sender, j, 2, Flag.NONE, origin=sender, target=0,
                         contributors=frozenset(ids)).with_values(np.ones(4, np.float32))
            sent += [a for a in root.on_frame(unit, 0.03) if isinstance(a, Send)]
    assert root.result is not None and not root.result.degraded
    finals = {a.dst for a in sent if a.frame.kind == Kind.DATA and a.frame.flags & Flag.FINAL}
    # Relayed, the root's children get it from us too; with the fan-out only the puller.
    assert finals == ({1, 2, 7} if broadcast == "tree" else {7})


def test_a_pull_flood_gets_each_chunk_of_the_result_twice_a_round_and_is_counted() -> None:
    """A ~50-byte PULL got the whole result every time (1.24 MB of pulls cost 12.4 GB)."""
    tree = Tree((0, 1), 2)
    root = FtTreeRound(RoundContext(CFG, tree, 0, 0, np.zeros(8, np.float32), 0, CFG.new_links(), 0.0))
    root.start(0.0)
    for j in (0, 1):
        unit = Frame(Kind.DATA, CFG.job, 0, 1, j, 2, Flag.NONE, origin=1, target=0, contributors=frozenset({1}))
        root.on_frame(unit.with_values(np.ones(4, np.float32)), 0.01)
    assert root.result is not None
    pull = Frame(Kind.PULL, CFG.job, 0, 1, 0, 2, Flag.BROADCAST, origin=1, target=0)
    sent = [a for _ in range(50) for a in root.on_frame(pull, 1.0)
            if isinstance(a, Send) and a.frame.kind == Kind.DATA]
    assert len(sent) == 2 * 2  # two chunks, each twice (one answer may be lost)
    assert root.stats.refused["pull_budget"] == 48


def test_a_nack_flood_gets_each_unit_resent_a_bounded_number_of_times_and_is_counted() -> None:
    """A NACK is a few bytes asking for a unit of up to a whole chunk again: unbudgeted, a
    flood of them from one peer was a PULL-like amplification."""
    m = leaf(CFG.new_links())  # node 3: its two reduce units wait for parent 1's ACK
    nack = Frame(Kind.NACK, CFG.job, 0, 1, 0, 2, Flag.NONE, origin=1, target=3).with_indices([0, 1])
    resent = [a for _ in range(50) for a in m.on_frame(nack, 0.01)
              if isinstance(a, Send) and a.frame.kind == Kind.DATA]
    assert len(resent) == 2 * NACK_RESENDS_PER_UNIT and {a.dst for a in resent} == {1}
    assert m.stats.refused["nack_budget"] == 50 - NACK_RESENDS_PER_UNIT
    # Another peer's NACK asks for nothing we sent through it: nothing resent, nothing spent.
    other = replace(nack, sender=4, origin=4)
    assert [a for a in m.on_frame(other, 0.02) if isinstance(a, Send) and a.frame.kind == Kind.DATA] == []


def test_an_honest_nack_of_a_lost_unit_is_answered() -> None:
    m = leaf(CFG.new_links())
    nack = Frame(Kind.NACK, CFG.job, 0, 1, 0, 2, Flag.NONE, origin=1, target=3).with_indices([1])
    resent = [a for a in m.on_frame(nack, 0.01) if isinstance(a, Send) and a.frame.kind == Kind.DATA]
    assert [(a.dst, a.frame.chunk_index) for a in resent] == [(1, 1)]
    assert m.stats.refused["nack_budget"] == 0


def test_below_a_site_root_only_the_own_site_is_asked_while_one_of_it_lives() -> None:
    # s0 = 0..2, s1 = 3..6 under its root 3: an answer from s0 crosses the uplinks, a whole
    # result per ask (after a healed bridge cut, 21 agents pulled 100-200 times a round).
    sites = {m: "s0" if m < 3 else "s1" for m in range(7)}
    tree = Tree.of(range(7), 2, sites=sites)
    below = next(m for m in range(4, 7) if tree.parent(m) == 3)
    links = CFG.new_links()
    for peer in range(7):
        for _ in range(5):
            links.observe(peer, 0.01)
    m = FtTreeRound(RoundContext(CFG, tree, below, 0, np.ones(8, np.float32), 0, links, 0.0))
    m.start(0.0)
    for j in (0, 1):
        ack = Frame(Kind.ACK, CFG.job, 0, 3, j, 2, Flag.NONE, origin=3, target=below,
                    contributors=frozenset({below}))
        m.on_frame(ack.with_indices([j]), 0.01)
    asked = [dst for _, dst in pulls_until(m, 4.0)]
    assert asked and all(sites[p] == "s1" for p in asked), asked
    root3 = FtTreeRound(RoundContext(CFG, tree, 3, 0, np.ones(8, np.float32), 0, links, 0.0))
    root3.start(0.0)
    for child in tree.children(3):
        for j in (0, 1):
            unit = Frame(Kind.DATA, CFG.job, 0, child, j, 2, origin=child, target=3,
                         contributors=frozenset(tree.subtree(child)))
            root3.on_frame(unit.with_values(np.ones(4, np.float32)), 0.01)
    for j in (0, 1):
        ack = Frame(Kind.ACK, CFG.job, 0, 0, j, 2, Flag.NONE, origin=0, target=3, contributors=frozenset({3}))
        root3.on_frame(ack.with_indices([j]), 0.02)
    assert 0 in [dst for _, dst in pulls_until(root3, 4.0)]  # the site root asks across


def test_a_pull_is_answered_with_at_most_three_times_the_bytes_its_puller_sent() -> None:
    """Issue 54: a ~60-byte PULL was answered with a chunk of the result (~5,100x by bytes).
    An unpadded flood from a node that sent us nothing else gets nothing, counted; a padded
    pull (as ResultPull sends them) gets the result, within AMPLIFICATION x its bytes."""
    cfg = replace(CFG, chunk_size=4096)
    tree = Tree((0, 1, 2, 3), 2)  # 3 below 1: the root hears from it only by its pulls
    root = FtTreeRound(RoundContext(cfg, tree, 0, 0, np.zeros(8192, np.float32), 0, cfg.new_links(), 0.0))
    root.start(0.0)
    for sender, ids in ((1, {1, 3}), (2, {2})):
        for j in (0, 1):
            unit = Frame(Kind.DATA, cfg.job, 0, sender, j, 2, Flag.NONE, origin=sender, target=0,
                         contributors=frozenset(ids)).with_values(np.ones(4096, np.float32))
            root.on_frame(unit, 0.01)
    assert root.result is not None
    flood = Frame(Kind.PULL, cfg.job, 0, 3, 0, 2, Flag.BROADCAST).with_indices([0])
    answered = [a for _ in range(50) for a in root.on_frame(flood, 1.0) if isinstance(a, Send) and a.frame.kind == Kind.DATA]
    assert answered == [] and root.stats.refused["pull_unpaid"] == 50
    paid = padded(flood, root.scope.result_bytes([0]))
    answers = [a for a in root.on_frame(paid, 1.1) if isinstance(a, Send) and a.frame.kind == Kind.DATA]
    assert [a.frame.chunk_index for a in answers] == [0]
    asked = 50 * frame_size(flood) + frame_size(paid)
    assert frame_size(answers[0].frame) <= AMPLIFICATION * asked
    assert root.pull.budget.amplification(3) <= AMPLIFICATION


def test_a_pull_of_ours_pays_for_what_it_asks() -> None:
    m = leaf(CFG.new_links())
    pulls = [a for a in m.on_timer(CFG.round_deadline * 0.9) if isinstance(a, Send) and a.frame.kind == Kind.PULL]
    assert pulls and all(AMPLIFICATION * frame_size(a.frame) >= m.scope.result_bytes(range(m.n)) for a in pulls)
    assert all(asked_indices(a.frame) == [] for a in pulls)  # the whole result


def _sibling_result(j: int) -> Frame:
    return Frame(Kind.DATA, CFG.job, 0, 4, j, 2, Flag.BROADCAST | Flag.FINAL, target=3,
                 contributors=frozenset(range(7))).with_values(np.full(4, 0.5, np.float32))


def test_a_siblings_result_is_taken_only_once_we_asked_it() -> None:
    """Issue 54: a sibling (a backup) sent its victim the rounds' results unasked and they
    were taken (189 of 200 rounds differed). Refused and counted until we pull from it."""
    m = leaf(measured_parent())
    acked(m, 0.01)
    m.on_frame(_sibling_result(0), 0.01)
    assert not m.results.has(0) and m.stats.refused["result_backup_not_routed"] == 1
    asked = pulls_until(m, 2.0)
    assert asked and asked[0][1] == 4  # the sibling first (see above): now it carries the result
    for j in (0, 1):
        m.on_frame(_sibling_result(j), asked[0][0] + 0.01)
    assert m.result is not None and m.stats.refused["result_backup_not_routed"] == 1


def test_a_siblings_result_is_taken_once_our_parent_is_down() -> None:
    m = leaf(CFG.new_links())
    m.peer_down(1, 0.01)
    m.on_frame(_sibling_result(0), 0.02)
    assert m.results.has(0) and not m.stats.refused["result_backup_not_routed"]


def test_a_grandchilds_audit_copies_pay_for_no_answer_to_its_pulls() -> None:
    """The int8 copies a grandchild sends us of its units are no word to us: with them
    paying, a flood of unpadded pulls from it was answered (91x by the asks' bytes)."""
    cfg = replace(CFG, chunk_size=4096)
    tree = Tree((0, 1, 2, 3), 2)  # 3 below 1
    root = FtTreeRound(RoundContext(cfg, tree, 0, 0, np.zeros(8192, np.float32), 0, cfg.new_links(), 0.0))
    root.start(0.0)
    for j in (0, 1):
        copy = Frame(Kind.DATA, cfg.job, 0, 3, j, 2, Flag.AUDIT, origin=3, contributors=frozenset({3}))
        root.on_frame(copy.with_values(np.ones(4096, np.float32), DType.I8), 0.005)
    for sender, ids in ((1, {1, 3}), (2, {2})):
        for j in (0, 1):
            unit = Frame(Kind.DATA, cfg.job, 0, sender, j, 2, Flag.NONE, origin=sender, target=0,
                         contributors=frozenset(ids)).with_values(np.ones(4096, np.float32))
            root.on_frame(unit, 0.01)
    flood = Frame(Kind.PULL, cfg.job, 0, 3, 0, 2, Flag.BROADCAST).with_indices([0])
    answered = [a for _ in range(10) for a in root.on_frame(flood, 1.0) if isinstance(a, Send) and a.frame.kind == Kind.DATA]
    assert answered == [] and root.stats.refused["pull_unpaid"] == 10
