"""Silence detection alone: who was heard, busy links, reports of silence."""

from __future__ import annotations

import numpy as np
import pytest

from agent.protocol.allreduce import (
    DOWNLINK_BUSY_HOLD,
    OWN_LINK_HOLD,
    PROGRESS_EVERY,
    AllreduceConfig,
    Note,
    RoundContext,
    Send,
)
from agent.protocol.ft_scope import RoundScope
from agent.protocol.ft_watch import PeerWatch, orphan_start
from agent.protocol.notes import NoteKind
from agent.protocol.topology import Tree
from agent.protocol.wire import Flag, Frame, Kind

TREE = Tree((0, 1, 2, 3, 4), 2)  # 1: children 3, 4


def watch(node: int = 1, mode: str = "adaptive") -> PeerWatch:
    cfg = AllreduceConfig(chunk_size=4, timeout_mode=mode, fixed_timeout=0.1)  # type: ignore[arg-type]
    return PeerWatch(RoundScope(RoundContext(cfg, TREE, node, 0, np.zeros(8, np.float32), 0, cfg.new_links(), 0.0)))


def test_the_first_frame_of_a_peer_is_told_apart_and_a_fanout_shows_no_link() -> None:
    w = watch()
    frame = Frame(Kind.DATA, 0, 0, 0, 0, 2, Flag.BROADCAST, origin=0)
    assert w.heard(frame, 0.01, shows_link=False)
    assert 0 not in w.last_heard and w.heard_of[0] == 0.01
    assert w.heard(frame, 0.02, shows_link=True)  # still its first on a link
    assert not w.heard(frame, 0.03, shows_link=True) and w.last_heard[0] == 0.03


def test_busy_links_hold_verdicts_until_a_hold_after_the_last_report() -> None:
    w = watch()
    assert not w.draining(0.0) and w.drain_end() is None and w.busy_towards(3) is None
    w.progress(3, 0.5)  # 3's downlink is busy
    assert w.busy_towards(3) == pytest.approx(0.5 + DOWNLINK_BUSY_HOLD)
    assert w.busy_towards(4) is None
    w.arriving(0, 0.7)  # ours is
    assert w.busy_towards(4) == pytest.approx(0.7 + DOWNLINK_BUSY_HOLD)
    assert w.draining(0.7 + DOWNLINK_BUSY_HOLD - 0.01) and not w.draining(0.7 + DOWNLINK_BUSY_HOLD)
    fixed = watch(mode="fixed")
    fixed.progress(3, 0.5)
    assert fixed.drain_end() is None and fixed.busy_towards(3) is None  # fixed timeouts ignore it


def test_a_busy_downlink_tells_every_other_member_at_most_every_progress_interval() -> None:
    w = watch()
    w.arriving(0, 0.0)
    probes = [a for a in w.scope.out.flush() if isinstance(a, Send)]
    assert sorted(p.dst for p in probes) == [0, 2, 3, 4]
    assert all(p.frame.kind == Kind.PROBE and p.frame.flags & Flag.PROGRESS for p in probes)
    w.arriving(0, PROGRESS_EVERY / 2)
    assert w.scope.out.flush() == []
    w.arriving(None, PROGRESS_EVERY)
    assert len(w.scope.out.flush()) == 4


def test_a_silent_child_is_reported_once_its_span_ran_out_unless_links_drain() -> None:
    """Our downlink busy, the child's frame may queue behind what we read: it comes once that
    is read, so the verdict waits OWN_LINK_HOLD after the last report (a whole
    DOWNLINK_BUSY_HOLD kept a root's verdicts 1 s past its children's data), and a timeout."""
    w = watch()
    span = w.silence_at[3]
    assert span == pytest.approx(w.silence_span(3)) and set(w.silence_at) == {3, 4}
    w.arriving(0, span - 0.1)
    w.scope.out.flush()
    w.check_children(span, lambda child: True)
    assert w.scope.out.flush() == [] and w.silence_at[3] == pytest.approx(span - 0.1 + OWN_LINK_HOLD + w.scope.rto(3))
    assert OWN_LINK_HOLD < DOWNLINK_BUSY_HOLD
    later = w.silence_at[3]
    w.check_children(later, lambda child: child == 3)
    assert w.scope.out.flush() == [Note(NoteKind.SILENT, 3, "nothing from it for a whole wait")]
    assert w.silence_at == {} and w.unheard_since_reported(3) and not w.unheard_since_reported(4)


def test_only_the_childs_own_links_or_ours_hold_its_verdict_not_another_members() -> None:
    """On a starved host every large frame reads slowly: the members' PROGRESS never stopped
    and held the verdict on a child cut off until the round's wait cap. Our parent's busy
    downlink carries nothing of our child's to us; the child's own PROGRESS (it lives, its
    data waits behind what it receives) does hold it."""
    w = watch()
    span = w.silence_at[3]
    w.progress(0, span - 0.1)  # our parent's downlink
    w.progress(2, span - 0.1)  # a member elsewhere
    w.check_children(span, lambda child: child == 3)
    assert w.scope.out.flush() == [Note(NoteKind.SILENT, 3, "nothing from it for a whole wait")]
    w = watch()
    w.progress(3, span - 0.1)
    w.check_children(span, lambda child: child == 3)
    # Its next PROGRESS may wait behind a unit being written at the floor rate.
    hold = PROGRESS_EVERY + w.scope.unit_bytes / w.scope.cfg.link_rate_floor
    assert w.scope.out.flush() == [] and w.silence_at[3] == pytest.approx(span - 0.1 + hold + w.scope.rto(3))
    assert hold < DOWNLINK_BUSY_HOLD


def test_a_peer_that_refutes_or_speaks_after_a_report_counts_as_heard() -> None:
    w = watch()
    w.report_silent(3, "test", 1.0)
    assert w.unheard_since_reported(3)
    w.heard(Frame(Kind.PROBE, 0, 0, 3, 0, 2), 1.1, shows_link=True)
    assert not w.unheard_since_reported(3)
    w.report_silent(4, "test", 1.0)
    w.refuted.add(4)
    assert not w.unheard_since_reported(4)
    assert w.quiet_for(3, 1.5) == pytest.approx(0.4) and w.quiet_for(2, 1.5) == float("inf")


def test_the_nodes_under_a_lost_node_are_watched_from_the_fleets_first_report_of_it() -> None:
    """Root 0 excuses its child 1 at 2.0, a grace after 1's first report (1.6): 1's children
    3 and 4 are watched from the report on, their verdict due at 1.6 + their span, or (gone
    for the fleet, a live orphan goes around it at once) a timeout and a unit's arrival after
    the excusal, if that is sooner. Our own report of 1 is no excusal: the span only."""
    w = watch(node=0)
    span = 4 * w.scope.rto(1) + w.scope.arrival(1, w.scope.unit_bytes, headroom=False)
    around = w.scope.rto(1) + w.scope.arrival(1, w.scope.unit_bytes)
    w.orphaned(1, 2.0, since=1.6)
    due = min(1.6 + span, 2.0 + around)
    assert w.silence_at[3] == pytest.approx(due) and w.silence_at[4] == pytest.approx(due)
    late = watch(node=0)
    late.orphaned(1, 2.0)  # nobody reported it (its Will): from now
    assert late.silence_at[3] == pytest.approx(2.0 + min(span, around))
    ours = watch(node=0)
    ours.orphaned(1, 2.0, gone=False)
    assert ours.silence_at[3] == pytest.approx(2.0 + span)
    ours.orphaned(1, 2.1)  # then excused: the sooner verdict holds
    assert ours.silence_at[3] == pytest.approx(min(2.0 + span, 2.1 + around))


def test_an_orphans_watch_starts_at_the_report_within_the_round_and_never_after_the_excusal() -> None:
    assert orphan_start(round_start=1.0, now=2.0, reported=1.6) == 1.6
    assert orphan_start(round_start=1.0, now=2.0, reported=0.5) == 1.0  # reported in a round before
    assert orphan_start(round_start=1.0, now=2.0, reported=None) == 2.0
    assert orphan_start(round_start=1.0, now=2.0, reported=2.5) == 2.0
