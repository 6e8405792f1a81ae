"""The straggler deadline: a child that has not sent anything is waited for at most the deadline
(its subtree's share below the root), whatever else keeps the links busy; off, the waits are
as before."""

from __future__ import annotations

import numpy as np

from agent.protocol.allreduce import AllreduceConfig, RoundContext
from agent.protocol.ft_tree import FtTreeRound
from agent.protocol.topology import Tree
from agent.protocol.wire import Flag, Frame, Kind

TREE = Tree((0, 1, 2), 2)
ROUND_DEADLINE = 5.0


def root(straggler_deadline: float) -> FtTreeRound:
    cfg = AllreduceConfig(chunk_size=4, round_deadline=ROUND_DEADLINE, straggler_deadline=straggler_deadline)
    m = FtTreeRound(RoundContext(cfg, TREE, 0, 3, np.zeros(4, np.float32), 0, cfg.new_links(), 0.0))
    m.start(0.0)
    return m


def data(sender: int) -> Frame:
    frame = Frame(Kind.DATA, 0, 3, sender, 0, 1, Flag.NONE, origin=sender, contributors=frozenset({sender}))
    return frame.with_values(np.full(4, 3.0, np.float32))


def result_time(m: FtTreeRound, busy_until: float) -> float:
    """Child 1's data comes at 0.05 s, child 2 (the straggler) sends nothing; our uplink reports
    a backlog every 50 ms until ``busy_until`` (a busy host: other frames queue there)."""
    m.on_frame(data(1), 0.05)
    now = 0.05
    while m.result is None and now < 3 * ROUND_DEADLINE:
        due = m.next_timer()
        beat = now + 0.05 if now + 0.05 < busy_until else None
        now = min(t for t in (due, beat) if t is not None)
        if beat is not None and now == beat:
            m.arriving(None, now)
        m.on_timer(now)
    return now


def test_a_straggler_is_waited_for_at_most_the_deadline_even_while_the_links_are_busy() -> None:
    m = root(straggler_deadline=0.4)
    at = result_time(m, busy_until=10.0)
    assert 0.4 <= at < 0.45
    assert m.result is not None and m.result.contributors[0] == frozenset({0, 1})
    np.testing.assert_allclose(m.result.values, 1.5)  # the mean of the two that came


def test_without_a_deadline_busy_links_keep_the_wait_going() -> None:
    at = result_time(root(straggler_deadline=0.0), busy_until=10.0)
    assert at > 1.0  # the hold for a draining link, past the base wait's share


def test_a_child_that_passed_on_its_subtree_without_the_straggler_is_not_waited_for_again() -> None:
    """Node 2 waited its share for its straggling child 6, then sent {2, 5}: past the deadline
    the root takes that, and does not wait for 2 (heard a moment ago) to send 6's part."""
    tree = Tree(tuple(range(7)), 2)
    cfg = AllreduceConfig(chunk_size=4, round_deadline=ROUND_DEADLINE, straggler_deadline=0.4)
    m = FtTreeRound(RoundContext(cfg, tree, 0, 3, np.zeros(4, np.float32), 0, cfg.new_links(), 0.0))
    m.start(0.0)
    for sender, ids in ((1, {1, 3, 4}), (2, {2, 5})):
        frame = Frame(Kind.DATA, 0, 3, sender, 0, 1, Flag.NONE, origin=sender, contributors=frozenset(ids))
        m.on_frame(frame.with_values(np.full(4, 7.0, np.float32)), 0.38)
    now = 0.38
    while m.result is None and now < ROUND_DEADLINE:
        now = m.next_timer() or ROUND_DEADLINE
        m.on_timer(now)
    assert now < 0.45 and m.result is not None
    assert m.result.contributors[0] == frozenset({0, 1, 2, 3, 4, 5})
