"""Busy links (issue 19): what the transport sees of a slow link (a large frame arriving piece
by piece, our own sends still queued) and what the peers say of theirs (PROBE|PROGRESS) hold
every verdict on silence, resend, pull and the deadline while it lasts, and nothing else: a
silent peer is still found once the links go quiet, and fixed timeouts ignore it all."""

from __future__ import annotations

import numpy as np
import pytest

from agent.protocol.allreduce import (
    DEADLINE_STRETCH,
    DOWNLINK_BUSY_HOLD,
    PROGRESS_EVERY,
    AllreduceConfig,
    Note,
    RoundContext,
    Send,
)
from agent.protocol.ft_tree import FtTreeRound
from agent.protocol.topology import Tree
from agent.protocol.wire import Flag, Frame, Kind

CHUNK = 262_144
CFG = AllreduceConfig(chunk_size=CHUNK, round_deadline=5.0)
TREE = Tree((0, 1, 2), 2)


def machine(node: int, cfg: AllreduceConfig = CFG, chunks: int = 2) -> FtTreeRound:
    grad = np.ones(cfg.chunk_size * chunks, np.float32)
    return FtTreeRound(RoundContext(cfg, TREE, node, 0, grad, 0, cfg.new_links(), 0.0))


def kinds(actions: list[Send | Note]) -> list[str]:
    return [a.kind for a in actions if isinstance(a, Note)]


def progress_frames(actions: list[Send | Note]) -> list[Send]:
    return [a for a in actions if isinstance(a, Send) and a.frame.kind == Kind.PROBE
            and a.frame.flags & Flag.PROGRESS]


def progress(sender: int, target: int) -> Frame:
    return Frame(Kind.PROBE, 0, 0, sender, 0, 1, Flag.PROGRESS, origin=sender, target=target)


def run_until(m: FtTreeRound, until: float, report: float | None = None, sender: int | None = None,
              every: float = 0.05) -> list[Send | Note]:
    """Fire every timer up to ``until``; while ``now < report``, the transport reports a busy
    link every ``every`` s."""
    out: list[Send | Note] = []
    now = 0.0
    while True:
        due = m.next_timer()
        nxt = now + every if report is not None and now + every < report else None
        step = min(t for t in (due, nxt) if t is not None) if (due is not None or nxt is not None) else None
        if step is None or step > until:
            return out
        now = step
        if nxt is not None and now == nxt:
            out += m.arriving(sender, now)
        out += m.on_timer(now)


def test_without_reports_a_silent_parent_is_declared_dead_within_a_timeout_and_a_drain() -> None:
    m = machine(1)
    m.start(0.0)
    out = run_until(m, 2.0)
    assert "link_dead" in kinds(out)


def test_our_own_busy_uplink_holds_the_verdict_and_every_resend_until_it_drains() -> None:
    m = machine(1)
    m.start(0.0)
    out = run_until(m, 3.0, report=2.0)  # the uplink is backlogged for 2 s, then quiet
    dead_at = [a for a in out if isinstance(a, Note) and a.kind == "link_dead"]
    assert m.stats.retransmits == 0 and m.stats.reroutes == 0
    assert dead_at == []
    # Quiet links again: the silent parent is found after the hold, a timeout and the drain.
    out = []
    now = 3.0
    while (due := m.next_timer()) is not None and due < 2.0 + DOWNLINK_BUSY_HOLD + 2.0:
        now = max(now, due)
        out += m.on_timer(now)
        if "link_dead" in kinds(out):
            break
    assert "link_dead" in kinds(out)
    assert now >= 2.0 + DOWNLINK_BUSY_HOLD - 0.05


def test_a_busy_link_is_told_to_every_member_at_most_every_progress_interval() -> None:
    m = machine(0)
    m.start(0.0)
    first = progress_frames(m.arriving(1, 0.1))
    assert sorted(a.dst for a in first) == [1, 2]
    assert progress_frames(m.arriving(1, 0.1 + PROGRESS_EVERY / 2)) == []
    assert len(progress_frames(m.arriving(1, 0.1 + PROGRESS_EVERY))) == 2


def test_a_peers_progress_holds_our_units_towards_it() -> None:
    m = machine(1)
    m.start(0.0)
    out: list[Send | Note] = []
    now = 0.0
    while now < 3.0:  # the parent's downlink is busy (its PROGRESS every 0.1 s) for 3 s
        now = round(now + 0.1, 6)
        out += m.on_frame(progress(0, 1), now)
        while (due := m.next_timer()) is not None and due <= now:
            out += m.on_timer(due)
    assert "link_dead" not in kinds(out) and "silent" not in kinds(out)
    assert m.stats.retransmits == 0 and m.stats.reroutes == 0


def test_a_child_whose_first_frame_queues_behind_others_is_not_reported_silent() -> None:
    root = machine(0)
    root.start(0.0)
    # Child 1's data arrives, slowly, for 3 s; child 2's frames wait behind it.
    out = run_until(root, 3.0, report=3.0, sender=1)
    assert "silent" not in kinds(out)
    assert 1 in root.watch.heard_of


def test_the_deadline_is_put_off_while_links_drain_up_to_its_stretch() -> None:
    leaf = machine(1)
    leaf.start(0.0)
    for j in range(leaf.n):  # its data is through; the broadcast arrives, slowly, for ever
        leaf.on_frame(Frame(Kind.ACK, 0, 0, 0, j, 2, Flag.NONE, origin=0, target=1, contributors=frozenset({1})), 0.1)
    out = run_until(leaf, 30.0, report=30.0, sender=0)
    assert kinds(out).count("deadline_put_off") == 1
    assert leaf.result is not None and leaf.result.degraded
    assert leaf.result.finished_at == pytest.approx(CFG.round_deadline * DEADLINE_STRETCH, abs=DOWNLINK_BUSY_HOLD)


def test_the_roots_wait_goes_on_while_contributions_arrive_up_to_its_stretched_cap() -> None:
    root = machine(0)
    root.start(0.0)
    run_until(root, 30.0, report=30.0, sender=1)
    assert root.result is not None
    base = CFG.round_deadline * CFG.reduce_fraction
    assert root.result.finished_at == pytest.approx(base + (CFG.round_deadline * DEADLINE_STRETCH - base) / 2,
                                                    abs=DOWNLINK_BUSY_HOLD)


def test_a_root_whose_links_went_quiet_after_the_default_deadline_ends_with_what_it_has() -> None:
    root = machine(0)
    root.start(0.0)
    run_until(root, 12.0, report=7.0, sender=1)
    assert root.result is not None
    assert 7.0 < root.result.finished_at <= 7.0 + DOWNLINK_BUSY_HOLD + 0.05
    assert root.result.contributors[0] == frozenset({0})  # its own: the children sent nothing whole


def test_no_pull_while_a_members_link_is_busy() -> None:
    def first_pull(busy_until: float) -> float:
        m = machine(1)
        m.start(0.0)
        for j in range(m.n):
            m.on_frame(Frame(Kind.ACK, 0, 0, 0, j, 2, Flag.NONE, origin=0, target=1,
                             contributors=frozenset({1})), 0.05)
        now = 0.05
        while now < 10.0:
            now = round(now + 0.1, 6)
            if now < busy_until:
                m.on_frame(progress(2, 1), now)  # the sibling's link is busy
            while (due := m.next_timer()) is not None and due <= now:
                if any(isinstance(a, Send) and a.frame.kind == Kind.PULL for a in m.on_timer(due)):
                    return due
        raise AssertionError("no pull")

    quiet = first_pull(0.0)
    assert quiet < 4.5
    assert first_pull(5.0) >= 5.0 - 0.1 + DOWNLINK_BUSY_HOLD - 1e-6


def test_fixed_timeouts_ignore_busy_links() -> None:
    fixed = AllreduceConfig(chunk_size=CHUNK, round_deadline=5.0, timeout_mode="fixed")
    m = machine(1, fixed)
    m.start(0.0)
    assert m.arriving(None, 0.1) == []
    out = run_until(m, 1.0, report=1.0)
    assert "link_dead" in kinds(out)


def test_a_silent_child_is_reported_while_another_childs_downlink_stays_busy() -> None:
    """A starved host reads every large frame slowly: some member's PROGRESS came every
    0.1 s all round long, and held the verdict on a child cut off until the root's wait cap.
    Child 1's busy downlink carries nothing of child 2's to us."""
    def reported(busy: int | None) -> dict[int, float]:
        """Each child reported silent: when first."""
        root = machine(0)
        root.start(0.0)
        out: dict[int, float] = {}
        now = 0.0
        while now < 6.0:
            now = round(now + 0.1, 6)
            if busy is not None:
                root.on_frame(progress(busy, 0), now)
            while (due := root.next_timer()) is not None and due <= now:
                for a in root.on_timer(due):
                    if isinstance(a, Note) and a.kind == "silent" and a.peer is not None:
                        out.setdefault(a.peer, due)
        return out

    quiet = reported(None)
    assert sorted(quiet) == [1, 2] and quiet[2] < 3.0
    # Child 1 sent nothing either, but its PROGRESS says it lives and its data waits behind
    # what it receives: only child 2 is reported, when it is on quiet links.
    assert reported(1) == {2: quiet[2]}


def test_a_childs_progress_holds_its_verdict_but_is_no_word_of_it_in_this_round() -> None:
    """A loaded host reads the last round's result slowly: a child's PROGRESS of then is
    replayed into our round, and counted as a frame of it; cut off right after, the child was
    never reported by us, its excusal by the fleet ignored, and the round ran to its wait cap."""
    def first_report(busy: int | None) -> float | None:
        root = machine(0)
        root.start(0.0)
        if busy is not None:
            root.on_frame(progress(busy, 0), 0.05)
        now = 0.0
        while (due := root.next_timer()) is not None and due < 6.0:
            now = max(now, due)
            if any(isinstance(a, Note) and a.kind == "silent" and a.peer == 1 for a in root.on_timer(now)):
                return now
        return None

    quiet = first_report(None)
    assert quiet is not None
    held = first_report(1)
    assert held is not None and held >= 0.05 + DOWNLINK_BUSY_HOLD  # it lived at 0.05 s, busy
    excused = machine(0)
    excused.start(0.0)
    excused.on_frame(progress(1, 0), 0.05)
    excused.excuse(1, 0.5)
    assert 1 not in excused.scope.expected
