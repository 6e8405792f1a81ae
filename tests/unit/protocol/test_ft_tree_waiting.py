"""A node with children tells its parent that it is in the round while it waits for their
data (a PROBE with the WAITING flag every WAITING_EVERY), so its parent tells it from a node
cut off without waiting over its whole subtree's depth: on mosquitto the root's wait for a
subtree of 7 cut off was 1.26 s (two timeouts a level) and the round of the cut 1.7-2.2 s."""

from __future__ import annotations

import numpy as np
import pytest

from agent.protocol.allreduce import WAITING_EVERY, AllreduceConfig, Note, RoundContext, Send
from agent.protocol.ft_tree import FtTreeRound
from agent.protocol.ft_watch import FIRST_FRAME_MARGIN
from agent.protocol.rto import LinkEstimators
from agent.protocol.topology import Tree
from agent.protocol.wire import Flag, Frame, Kind

CFG = AllreduceConfig(chunk_size=8, round_deadline=5.0, min_timeout=0.2, initial_timeout=0.2)
TREE = Tree(tuple(range(15)), 2)  # 0 -> 1, 2; 1 -> 3, 4; 3 -> 7, 8; 4 -> 9, 10; ...


def machine(node: int, links: LinkEstimators | None = None, round: int = 0, now: float = 0.0,
            cfg: AllreduceConfig = CFG) -> FtTreeRound:
    links = cfg.new_links() if links is None else links
    return FtTreeRound(RoundContext(cfg, TREE, node, round, np.zeros(8, np.float32), 0, links, now))


def beats(actions: list[Send | Note]) -> list[int]:
    return [a.dst for a in actions if isinstance(a, Send) and a.frame.kind == Kind.PROBE
            and a.frame.flags & Flag.WAITING]


def waiting(sender: int, round: int = 0) -> Frame:
    return Frame(Kind.PROBE, 0, round, sender, 0, 0, Flag.WAITING, origin=sender, target=0)


def data(sender: int, round: int, contributors: frozenset[int]) -> Frame:
    return Frame(Kind.DATA, 0, round, sender, 0, 1, origin=sender,
                 contributors=contributors).with_values(np.ones(8, np.float32))


def step(m: FtTreeRound, start: float, until: float) -> list[tuple[float, Send | Note]]:
    """Every timer of ``m`` from ``start`` to ``until``, with what each did."""
    out: list[tuple[float, Send | Note]] = []
    t = start
    while True:
        wake = m.next_timer()
        if wake is None or wake > until:
            return out
        t = max(t, wake)
        out += [(t, a) for a in m.on_timer(t)]
        t += 1e-6


def silent_at(events: list[tuple[float, Send | Note]], peer: int) -> float | None:
    return next((t for t, a in events if isinstance(a, Note) and a.kind == "silent" and a.peer == peer), None)


def test_a_node_with_children_tells_its_parent_every_interval_until_it_has_the_result() -> None:
    inner = machine(1)
    assert beats(inner.start(0.0)) == []
    sent = [(t, a) for t, a in step(inner, 0.0, 0.35) if beats([a])]
    assert [a.dst for _, a in sent] == [0, 0, 0]
    assert [round(t, 6) for t, _ in sent] == pytest.approx([WAITING_EVERY, 2 * WAITING_EVERY, 3 * WAITING_EVERY])
    # Its parent gone, nobody is told.
    inner.peer_down(0, 0.35)
    assert not [a for _, a in step(inner, 0.35, 0.8) if beats([a])]


@pytest.mark.parametrize("which", ["leaf", "root", "fixed timeouts"])
def test_a_leaf_the_root_and_fixed_timeouts_send_no_word_of_waiting(which: str) -> None:
    m = {"leaf": lambda: machine(7), "root": lambda: machine(0),
         "fixed timeouts": lambda: machine(1, cfg=AllreduceConfig(chunk_size=8, timeout_mode="fixed"))}[which]()
    sent = m.start(0.0) + [a for _, a in step(m, 0.0, 1.0)]
    assert beats(sent) == []


def _learned(after: float) -> LinkEstimators:
    """Three clean rounds at the root: each child's data ``after`` its start."""
    links = CFG.new_links()
    for rnd in range(3):
        start = 10.0 * rnd
        m = machine(0, links, rnd, start)
        m.start(start)
        for child in (1, 2):
            m.on_frame(data(child, rnd, frozenset(TREE.subtree(child))), start + after)
    return links


def test_an_inner_child_gone_quiet_after_its_word_is_reported_within_the_interval_and_two_timeouts() -> None:
    links = _learned(0.05)
    root = machine(0, links, 3, 30.0)
    root.start(30.0)
    root.on_frame(data(2, 3, frozenset(TREE.subtree(2))), 30.05)
    root.on_frame(waiting(1, 3), 30.1)  # then cut off
    at = silent_at(step(root, 30.1, 35.0), 1)
    assert at is not None
    assert at - 30.1 == pytest.approx(WAITING_EVERY + 2 * links.rto(1), abs=1e-3)
    assert at - 30.0 < root.watch._subtree_span(1, 2)  # not the whole subtree's depth


def test_an_inner_child_never_heard_is_reported_its_usual_first_frame_and_an_interval_after_the_start() -> None:
    links = _learned(0.05)
    usual = links.first_frame(1)
    assert usual is not None
    root = machine(0, links, 3, 30.0)
    root.start(30.0)
    root.on_frame(data(2, 3, frozenset(TREE.subtree(2))), 30.05)
    at = silent_at(step(root, 30.0, 35.0), 1)
    assert at is not None
    assert at - 30.0 == pytest.approx(FIRST_FRAME_MARGIN * usual + WAITING_EVERY + links.rto(1), abs=1e-3)


def test_an_inner_child_that_keeps_telling_it_waits_is_never_reported() -> None:
    """Its own child hangs: it waits over its subtree's depth, and its parent with it."""
    links = _learned(0.05)
    root = machine(0, links, 3, 30.0)
    root.start(30.0)
    root.on_frame(data(2, 3, frozenset(TREE.subtree(2))), 30.05)
    events: list[tuple[float, Send | Note]] = []
    t = 30.0
    while t < 32.0:
        root.on_frame(waiting(1, 3), t + WAITING_EVERY)
        events += step(root, t, t + WAITING_EVERY)
        t += WAITING_EVERY
    assert silent_at(events, 1) is None


def test_the_parent_of_a_node_that_tells_it_waits_hears_it_between_two_real_machines() -> None:
    """The inner node's own word, delivered, keeps its parent's verdict off."""
    links = _learned(0.05)
    root, inner = machine(0, links, 3, 30.0), machine(1, round=3, now=30.0)
    root.start(30.0)
    inner.start(30.0)
    root.on_frame(data(2, 3, frozenset(TREE.subtree(2))), 30.05)
    events: list[tuple[float, Send | Note]] = []
    t = 30.0
    while t < 31.5:
        for at, a in step(inner, t, t + 0.01):
            if isinstance(a, Send) and a.dst == 0:
                root.on_frame(a.frame, at + 0.001)
        events += step(root, t, t + 0.01)
        t += 0.01
    assert silent_at(events, 1) is None
