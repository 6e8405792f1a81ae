"""Silence detection of one FT-tree round: what we heard from whom and when, whether the links
around us are still draining a large frame, and when a peer has been silent long enough to be
reported to the fleet.

A peer that sends nothing is not yet a dead peer: the fleet needs two witnesses (the core
reports our ``SILENT`` note), and a peer that refutes a report lives, only its links are slow or
cut. Evidence that links are busy holds a verdict until DOWNLINK_BUSY_HOLD after the last such
report, if it concerns the peer judged: our transport says a large frame is still arriving
(everything sent to us queues behind it), or a PROBE|PROGRESS from the peer or a node whose data
it carries says their downlink is. Another member's PROGRESS is not: on a starved host every
large frame reads slowly, the members' PROGRESS never stopped, and a node cut off was reported
only at the round's wait cap.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from agent.protocol.allreduce import (
    DOWNLINK_BUSY_HOLD,
    OWN_LINK_HOLD,
    PROGRESS_EVERY,
    WAITING_EVERY,
)
from agent.protocol.ft_scope import RoundScope, latest
from agent.protocol.notes import NoteKind
from agent.protocol.rto import MIN_RATE_SAMPLE_BYTES
from agent.protocol.wire import Flag, Frame, Kind

# A child silent this many times its usual first-frame time, plus one timeout, is reported
# (see PeerWatch.silence_span).
FIRST_FRAME_MARGIN = 1.25


class PeerWatch:
    def __init__(self, scope: RoundScope) -> None:
        self.scope = scope
        self.last_heard: dict[int, float] = {}  # peer -> when any frame from it last arrived
        self.heard_of: dict[int, float] = {}  # node -> last frame from it or originated at it
        self.reported_silent: dict[int, float] = {}  # peer -> when we last reported it silent
        self.refuted: set[int] = set()  # peers that refuted a report of silence this round
        self.progress_from: dict[int, float] = {}  # peer -> its last PROBE|PROGRESS
        self.down_busy_at: float | None = None  # our transport last said a large frame is still arriving
        self.progress_sent_at: float | None = None
        # A child that sends nothing at all for this long is silent: stop waiting for it.
        now = scope.start_time
        self.silence_at: dict[int, float] = {c: now + self.silence_span(c) for c in scope.children}
        self.relay_watch: dict[int, float] = {}  # relay target -> first relay not answered yet
        self.large_from: dict[int, float] = {}  # peer -> when its last large frame of this round came

    # ------------------------------------------------------------------ what we hear

    def heard(self, frame: Frame, now: float, shows_link: bool) -> bool:
        """A frame came; ``shows_link``: it shows that the link from its sender works (the
        root's fan-out shows the root lives, not that). True when it is the sender's first.
        A PROGRESS is no word of the sender in this round: one sent in the last round (still
        receiving its result) is replayed into ours, and would shield a node cut off after it."""
        first = frame.sender not in self.last_heard
        if shows_link:
            self.last_heard[frame.sender] = now
        if not (frame.kind == Kind.PROBE and frame.flags & Flag.PROGRESS):
            self.heard_of[frame.sender] = self.heard_of[frame.origin] = now
        return first

    def paced(self, sender: int, nbytes: int, now: float) -> None:
        """A frame of this round from ``sender``: the gap since its previous large one shows
        how fast its uplink brings us its bytes (``arrival``)."""
        if nbytes < MIN_RATE_SAMPLE_BYTES:
            return
        previous, self.large_from[sender] = self.large_from.get(sender), now
        if previous is not None:
            self.scope.links.observe_inbound(sender, nbytes, now - previous)

    def first_frame(self, sender: int, now: float) -> None:
        """A child's first frame, before any verdict on it: how long it usually takes."""
        scope = self.scope
        if sender in self.silence_at and not scope.ctx.irregular_start:
            scope.links.observe_first_frame(sender, now - scope.start_time)

    def arriving(self, sender: int | None, now: float) -> None:
        """Our transport says a large frame is arriving from ``sender`` (None: our uplink is
        still busy): hold the verdicts, and tell every member at most every PROGRESS_EVERY."""
        scope = self.scope
        self.down_busy_at = now  # (or our uplink: the same hold either way)
        if sender is not None and sender != scope.node and sender in scope.tree.members and not self._audits_only(sender):
            if sender not in self.last_heard:
                self.first_frame(sender, now)  # its first frame began
            self.last_heard[sender] = self.heard_of[sender] = now
        if self.progress_sent_at is None or now - self.progress_sent_at >= PROGRESS_EVERY:
            self.progress_sent_at = now
            # To every member, not only our neighbours: a leaf waiting for the broadcast learns
            # that the round is still under way elsewhere (instead of pulling a copy).
            for peer in scope.tree.members:
                if peer != scope.node and peer not in scope.down:
                    scope.out.send(peer, scope.frame(Kind.PROBE, 0, Flag.PROGRESS, frozenset(), target=peer))

    def _audits_only(self, sender: int) -> bool:
        """A grandchild whose parent we still wait for sends us only its audit copies: no word
        that it reaches us around its parent (see ``orphaned``)."""
        ancestors = self.scope.tree.ancestors(sender)
        return len(ancestors) >= 2 and ancestors[1] == self.scope.node and ancestors[0] in self.scope.expected

    def progress(self, peer: int, now: float) -> None:
        self.progress_from[peer] = now  # it lives (last_heard), its downlink is busy

    # ------------------------------------------------------------------ busy links

    def draining(self, now: float, about: Collection[int] | None = None) -> bool:
        """Links show they are still delivering: our downlink is busy with a large frame, or a
        member's is (its PROGRESS; of ``about`` only, when given)."""
        end = self.drain_end(about)
        return end is not None and now < end

    def drain_end(self, about: Collection[int] | None = None) -> float | None:
        """When ``draining`` turns false, unless more evidence comes (None: no evidence).
        ``about``: the peers whose PROGRESS counts (None: every member's)."""
        if not self.scope.adaptive:
            return None
        busy = latest(self.down_busy_at, self._last_progress(about))
        return None if busy is None else busy + DOWNLINK_BUSY_HOLD

    def _last_progress(self, about: Collection[int] | None) -> float | None:
        """The last PROGRESS of a peer in ``about`` (None: of any member)."""
        return latest(*(t for p, t in self.progress_from.items() if about is None or p in about))

    def child_hold_end(self, child: int) -> float | None:
        """When a verdict on ``child``'s silence may come, as far as busy links go (None: no
        evidence). A node of its subtree whose downlink is busy (its data may wait for what it
        still reads) repeats its PROGRESS every PROGRESS_EVERY while it is; the next one may
        wait behind a frame being written on its uplink (a unit at the floor rate). Our own
        links hold it OWN_LINK_HOLD after their last report. A whole DOWNLINK_BUSY_HOLD after a
        PROGRESS of the last round's result, read just before a cut, kept the root's verdict
        on a subtree cut off 1.3 s into its round on mosquitto (15 agents)."""
        scope = self.scope
        if not scope.adaptive:
            return None
        progress = self._last_progress(scope.tree.subtree(child))
        next_progress = PROGRESS_EVERY + scope.unit_bytes / scope.cfg.link_rate_floor
        return latest(None if self.down_busy_at is None else self.down_busy_at + OWN_LINK_HOLD,
                      None if progress is None else progress + next_progress)

    def busy_towards(self, peer: int) -> float | None:
        """Until when a unit to ``peer`` counts as queued, not lost: our link was busy, or the
        peer's downlink was, DOWNLINK_BUSY_HOLD ago at the latest."""
        if not self.scope.adaptive:
            return None
        # A hold beyond the last report: the next report comes PROGRESS_EVERY later at best.
        # (Every timer computation asks this: no temporaries.)
        busy, progress = self.down_busy_at, self.progress_from.get(peer)
        if progress is not None and (busy is None or progress > busy):
            busy = progress
        return None if busy is None else busy + DOWNLINK_BUSY_HOLD

    # ------------------------------------------------------------------ silence

    def silence_span(self, child: int) -> float:
        """How long a healthy child's first frame can take before we ask the fleet: two
        timeouts of its link per level of its subtree (an inner child waits for its own
        children first). Its first frame comes when it usually does, plus one timeout, if
        that is sooner: the rest of the two timeouts is start-up skew that it has shown it
        does not have (not when this round starts irregularly: after an evaluation, a
        degraded round or a view change, the skew varies). An inner child's first frame may
        be its word that it waits (WAITING_EVERY after its start), not its data."""
        scope = self.scope
        below = self._below(child)
        span = self._subtree_span(child, below)
        usual = scope.links.first_frame(child)
        if usual is not None and not scope.ctx.irregular_start:
            beat = WAITING_EVERY if below else 0.0
            span = min(span, FIRST_FRAME_MARGIN * usual + beat + scope.rto(child))
        return span

    def orphaned(self, lost: int, now: float, since: float | None = None, gone: bool = True) -> None:
        """``lost``, below us and waited for, is gone (down or excused), or (``gone`` False)
        we just reported it: the nodes under it now reach us around it (a relay through a
        sibling, an uncle, an ancestor). Watch them as children: one cut off together with it
        is reported within about a round, not waited for until the deadline (nobody else hears
        from it: its parent was its witness). ``since``: when the fleet first heard that
        ``lost`` is silent (see ``orphan_start``)."""
        scope = self.scope
        start = orphan_start(scope.start_time, now, since)
        # It found its parent silent meanwhile (as the fleet did) and tried its routes in turn:
        # a timeout on its link to ``lost``, two on a relay through a backup (two hops), one
        # for its start; then its unit's way to us at the pace of ``lost``'s frames lately,
        # as measured: the timeouts hold the headroom. (Our link to ``lost`` carries no large
        # frame with the fan-out broadcast: at its floor rate the orphans of a subtree cut off
        # came 0.4 s after it on mosquitto. With three timeouts a live orphan was reported in
        # 2 of 3 runs of 3 of 7, then refuted.)
        at = start + 4 * scope.rto(lost) + scope.arrival(lost, scope.unit_bytes, headroom=False)
        if gone:
            # Gone for the fleet: one that lives goes around it now (its courier's peer_down,
            # its custody sent on), and its unit comes within a timeout and its transfer.
            # The span above alone made a second wait after the parent's grace (4 of 7 cut
            # with its parent reported 0.9 s after it: the round of the cut 1.56 s in memory).
            at = min(at, now + scope.rto(lost) + scope.arrival(lost, scope.unit_bytes))
        for node in scope.tree.subtree(lost):
            if node == lost or node in self.heard_of or node not in scope.expected:
                continue
            self.silence_at[node] = min(at, self.silence_at.get(node, at))

    def check_children(self, now: float, may_be_silent: Callable[[int], bool]) -> None:
        for child, at in list(self.silence_at.items()):
            if now < at:
                continue
            # Its first frame may queue behind what we receive, or wait for what its subtree
            # receives: until the hold after the last such report (see child_hold_end), and one
            # timeout.
            end = self.child_hold_end(child)
            if end is not None and now < end:
                self.silence_at[child] = end + self.scope.rto(child)
                continue
            del self.silence_at[child]
            if not may_be_silent(child):
                continue
            # Reported to the fleet: a live child (only its links are slow or cut) refutes at
            # once; unrefuted, the report comes back as ``excuse`` and we stop waiting. The
            # nodes under a child of ours are watched from the round's start (``orphaned``):
            # one that lives went around it from then on.
            since = self.scope.start_time if child in self.scope.children else None
            self.report_silent(child, "nothing from it for a whole wait", now, since)

    def quiet_span(self, child: int) -> float:
        """How long a child heard from may go quiet while it still owes us data: the whole
        span of its subtree's depth, with no shortcut for a leaf (see ``silence_span``). An
        inner child tells us every WAITING_EVERY that it waits: two timeouts after that."""
        below = self._below(child)
        span = self._subtree_span(child, below)
        if below and self.scope.adaptive:
            span = min(span, WAITING_EVERY + 2 * self.scope.rto(child))
        return span

    def _below(self, child: int) -> int:
        """Levels of ``child``'s subtree under it."""
        tree = self.scope.tree
        return max(tree.depth(m) for m in tree.subtree(child)) - tree.depth(child)

    def _subtree_span(self, child: int, below: int) -> float:
        """Two timeouts a level, and a unit's way up each level: behind its siblings' units,
        at the pace ``child``'s frames came lately (the pipeline's pace below it). One level
        counts it as timers count a rate (RATE_HEADROOM slower), the others as measured: one
        stage of the subtree may slow down that much, not all at once."""
        scope = self.scope
        slow = scope.arrival(child, scope.unit_bytes, len(scope.children))
        usual = scope.arrival(child, scope.unit_bytes, len(scope.children), headroom=False)
        return 2 * scope.rto(child) * (below + 1) + slow + below * usual

    def _quiet_until(self, child: int) -> float | None:
        heard = self.heard_of.get(child)
        if heard is None or child in self.reported_silent or child in self.scope.down:
            return None  # not heard of at all: the first frame's watch (check_children)
        due = heard + self.quiet_span(child)
        end = self.child_hold_end(child)
        return due if end is None else max(due, end + self.scope.rto(child))

    def check_quiet_children(self, now: float, owes: Callable[[int], bool]) -> None:
        """A child heard from in this round that owes us data and went quiet (cut off after
        its first frames: its unit to us, an ACK) is reported; otherwise nothing would."""
        for child in self.scope.children:
            at = self._quiet_until(child)
            if at is not None and now >= at and owes(child):
                self.report_silent(child, "nothing more from it for a whole wait", now, self.scope.start_time)

    def quiet_timers(self, owes: Callable[[int], bool]) -> list[float]:
        return [at for c in self.scope.children if (at := self._quiet_until(c)) is not None and owes(c)]

    def relay_wait(self, target: int) -> float:
        return self.scope.rto(target) + self.scope.transmit(target, self.scope.unit_bytes)

    def watch_relay(self, target: int, now: float) -> None:
        """We relayed a unit to ``target``, which ACKs through us: its silence is our evidence."""
        self.relay_watch.setdefault(target, now)

    def _answered(self, target: int, since: float) -> bool:
        heard = self.heard_of.get(target)
        return heard is not None and heard >= since

    def check_relay_targets(self, now: float) -> None:
        for target, at in list(self.relay_watch.items()):
            if self._answered(target, at):
                del self.relay_watch[target]
            elif now >= at + self.relay_wait(target) and not self.draining(now, (target,)):
                del self.relay_watch[target]
                self.report_silent(target, "relayed to it, no answer", now)

    def relay_timers(self) -> list[float]:
        # While links drain, the verdict on a relay target waits (see check_relay_targets).
        out = []
        for t, at in self.relay_watch.items():
            if not self._answered(t, at):
                drained = self.drain_end((t,))
                out.append(at + self.relay_wait(t) if drained is None else max(at + self.relay_wait(t), drained))
        return out

    def report_silent(self, peer: int, why: str, now: float, since: float | None = None) -> None:
        """Tell the fleet ``peer`` sent nothing for a whole timeout (the core reports it).
        ``since``: whence the nodes under it are watched (see ``orphaned``; None: now)."""
        self.reported_silent[peer] = now
        self.scope.out.note(NoteKind.SILENT, peer, why)
        if peer in self.scope.expected and peer in self.scope.subtree:
            # Those under it may be as silent: nobody else watches them.
            self.orphaned(peer, now, since, gone=False)

    def unheard_since_reported(self, peer: int) -> bool:
        # Once it refuted, it lives (and the fleet hears one report per round from us).
        reported = self.reported_silent.get(peer)
        return (reported is not None and peer not in self.refuted
                and not self._answered(peer, reported))

    def quiet_for(self, peer: int, now: float) -> float:
        """Seconds since any word from or of ``peer``, its PROGRESS too (infinite: none this
        round)."""
        heard = latest(self.heard_of.get(peer), self.progress_from.get(peer))
        return float("inf") if heard is None else now - heard

    def shown_life(self, peer: int, since: float) -> bool:
        """A word from or of ``peer`` after ``since``, or its PROGRESS (its downlink is busy)."""
        heard = latest(self.heard_of.get(peer), self.progress_from.get(peer))
        return heard is not None and heard > since


def orphan_start(round_start: float, now: float, reported: float | None) -> float:
    """Whence the nodes under a lost node are watched, ``now`` it is gone (excused or down).
    An orphan that lives found its parent silent when the fleet's first witness did, and went
    around it from then on: its span counts from the first report the fleet heard (within
    this round), not from the excusal a grace later. Both ran one after the other: 4 of 7,
    cut off with its parent 1, was reported 0.9 s after 1's excusal and excused a grace after
    that (the round of the cut 2.1-2.3 s on an idle host). Its verdict still comes no sooner
    than its parent's excusal (``now``): a parent only slow refutes within its grace, and its
    children's frames, merged into its own, never show them to us."""
    if reported is None:
        return now
    return min(now, max(round_start, reported))
