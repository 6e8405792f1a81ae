"""A leaf child that goes silent: how long its parent waits before it asks the fleet. The
conservative wait (two timeouts and the drain of its first units) is shortened to the child's
usual first-frame time plus one timeout once the child has shown it (issue 12), never when
the round starts irregularly (after an evaluation, a degraded round, a view change)."""

from __future__ import annotations

import numpy as np

from agent.protocol.allreduce import AllreduceConfig, Note, RoundContext
from agent.protocol.ft_tree import FtTreeRound
from agent.protocol.ft_watch import FIRST_FRAME_MARGIN
from agent.protocol.rto import LinkEstimators
from agent.protocol.topology import Tree
from agent.protocol.wire import Frame, Kind

CFG = AllreduceConfig(chunk_size=8, round_deadline=5.0, min_timeout=0.2, initial_timeout=0.2)
TREE = Tree((0, 1, 2), 2)  # 0 is the parent of the leaves 1 and 2


def parent(links: LinkEstimators, round: int, now: float, irregular_start: bool = False) -> FtTreeRound:
    return FtTreeRound(RoundContext(CFG, TREE, 0, round, np.zeros(8, np.float32), 0, links, now,
                                    irregular_start=irregular_start))


def data(sender: int, round: int) -> Frame:
    return Frame(Kind.DATA, 0, round, sender, 0, 1, origin=sender,
                 contributors=frozenset({sender})).with_values(np.ones(8, np.float32))


def silent_report_at(m: FtTreeRound, child: int, start: float) -> float:
    """Step the machine's timers until it reports ``child`` silent."""
    t = start
    while t < start + CFG.round_deadline:
        wake = m.next_timer()
        assert wake is not None
        t = max(t, wake)
        if any(isinstance(a, Note) and a.kind == "silent" and a.peer == child for a in m.on_timer(t)):
            return t - start
        t += 1e-4
    raise AssertionError("never reported")


def _learned(first_frame_after: float) -> LinkEstimators:
    links = CFG.new_links()
    for rnd in range(3):  # three clean rounds: both leaves' data 10 ms after our start
        start = 10.0 * rnd
        m = parent(links, rnd, start)
        m.start(start)
        for child in (1, 2):
            m.on_frame(data(child, rnd), start + first_frame_after)
    return links


def test_a_leaf_that_showed_its_first_frame_time_is_reported_one_timeout_after_it() -> None:
    links = _learned(0.01)
    usual = links.first_frame(1)
    assert usual is not None and abs(usual - 0.01) < 1e-9
    m = parent(links, 3, 30.0)
    m.start(30.0)
    m.on_frame(data(2, 3), 30.01)  # 2 is fine, 1 froze
    waited = silent_report_at(m, 1, 30.0)
    assert abs(waited - (FIRST_FRAME_MARGIN * 0.01 + links.rto(1))) < 1e-3, waited


def test_after_an_irregular_start_or_before_any_clean_round_the_wait_is_the_conservative_one() -> None:
    links = _learned(0.01)
    conservative = 2 * links.rto(1) + links.transmit_time(1, parent(links, 9, 0.0).scope.unit_bytes * 2)
    m = parent(links, 3, 30.0, irregular_start=True)
    m.start(30.0)
    assert abs(silent_report_at(m, 1, 30.0) - conservative) < 1e-3
    fresh = parent(CFG.new_links(), 0, 0.0)  # nothing learned yet
    fresh.start(0.0)
    assert silent_report_at(fresh, 1, 0.0) > 2 * CFG.min_timeout


def test_a_slow_round_raises_the_usual_time_at_once_and_it_comes_down_slowly() -> None:
    links = LinkEstimators()
    links.observe_first_frame(1, 0.01)
    links.observe_first_frame(1, 0.5)  # a checkpoint round, say
    assert links.first_frame(1) == 0.5
    links.observe_first_frame(1, 0.01)
    assert abs((links.first_frame(1) or 0) - (0.8 * 0.5 + 0.2 * 0.01)) < 1e-9
    assert LinkEstimators(fixed=0.5).first_frame(1) is None


def test_a_child_heard_from_that_goes_quiet_still_owing_data_is_reported_and_excused() -> None:
    """Cut off after its first frames (one of two chunks here): it had no verdict at all, the
    fleet's excusal of it was ignored (it had been heard from), and on mosquitto the round ran
    to the root's wait cap. Now it is reported a whole span after its last word, and the
    fleet's excusal, from a report after that word, is taken."""
    m = FtTreeRound(RoundContext(CFG, TREE, 0, 0, np.zeros(16, np.float32), 0, CFG.new_links(), 0.0))
    m.start(0.0)
    m.on_frame(Frame(Kind.DATA, 0, 0, 1, 0, 2, origin=1, contributors=frozenset({1})).with_values(np.ones(8, np.float32)), 0.05)
    for j in range(2):
        m.on_frame(Frame(Kind.DATA, 0, 0, 2, j, 2, origin=2, contributors=frozenset({2})).with_values(np.ones(8, np.float32)), 0.05)
    at = silent_report_at(m, 1, 0.05)
    assert 0.05 + at < CFG.round_deadline * CFG.reduce_fraction  # before the wait cap
    assert abs(at - m.watch.quiet_span(1)) < 1e-3  # a whole span after its last word
    m.excuse(1, 0.05 + at + 0.4, reported=0.05 + at)
    assert 1 not in m.scope.expected
    # One heard from after the fleet's first report lives: its excusal is ignored.
    spoke = FtTreeRound(RoundContext(CFG, TREE, 0, 0, np.zeros(16, np.float32), 0, CFG.new_links(), 0.0))
    spoke.start(0.0)
    spoke.on_frame(Frame(Kind.DATA, 0, 0, 1, 0, 2, origin=1, contributors=frozenset({1})).with_values(np.ones(8, np.float32)), 0.5)
    spoke.excuse(1, 0.9, reported=0.3)
    assert 1 in spoke.scope.expected
