"""Reliable delivery of one FT-tree round's units, sans IO: ``send`` a unit, feed the ACKs in
(``on_ack``), call ``expire`` at ``next_due`` (the shape of aioquic's recovery: on_packet_sent,
on_ack_received, get_loss_detection_time, on_loss_detection_timeout); the courier resends,
reroutes and gives up, and says what became of each unit and peer by events (``Delivered``,
``Undeliverable``, ``PeerSilent``). Its frames go to the round's outbox.

Each unit is ACKed; a unit that is not ACKed within the link's RTO marks that link dead for the
round and moves, with every other unit waiting on that link, to the next of its routes (relay
through the backup link(s), then, for the reduce, straight to the grandparent and further
ancestors, finally a flood over the FT graph).

A lossy link is not a dead link (QoS 0 drops single frames): like TCP, a unit sent straight to
a peer is retransmitted on the SAME link, a bounded number of times, when an ACK of a unit sent
after it comes back first (frames on one link topic arrive in order, so it was lost) or when
half an RTO passed without its ACK. The link is declared dead only when the peer has been
silent (no frame at all from it) for a whole RTO while a unit waited: a dead link still costs
one RTO, a lossy one only retransmissions.

A slow link is neither: TCP under MQTT loses nothing, it only queues. Every timer of a unit sent
straight to a peer (its resend, the peer's silence) therefore runs from the last frame heard
from the peer and covers the transmission of every byte still unACKed towards the peer up to and
including the unit (``LinkEstimators.transmit_time``): while ACKs of earlier units keep coming,
the link is draining and nothing is resent or rerouted. Resends of one unit back off
exponentially, and a resent unit gives no RTT or rate sample (Karn). A unit queued on our uplink
behind a unit to another peer that still shows life waits for it.

A dead link stays dead across rounds (``LinkEstimators.dead``): the next round routes around it
from the start and sends the peer a PROBE instead; an answer (or an ACK of a frame sent straight
to the peer) proves the link works both ways and heals it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from agent.protocol.allreduce import frame_size
from agent.protocol.ft_relay import Relay
from agent.protocol.ft_scope import Hop, RoundScope
from agent.protocol.ft_watch import PeerWatch
from agent.protocol.notes import NoteKind
from agent.protocol.wire import Flag, Frame, Kind

SILENCE_BACKOFF_CAP = 2.0  # RTOs of silence from a peer that showed life that make it silent
MAX_RETRIES = 3  # retransmissions of one unit on one direct link before it tries the next route
# Resends of one unit one peer's NACKs get from us in a round: the losses of a lossy link,
# a few times over; past that a NACK (a few bytes for a unit of up to a whole chunk) is
# refused, counted, and the unit's own timers resend it.
NACK_RESENDS_PER_UNIT = MAX_RETRIES
# Two timers this close are one instant: with fixed timeouts a unit's second resend (half an RTO
# after the first, itself half an RTO after the peer was heard) falls on the peer's silence
# verdict exactly, and the float rounding of the two sums, not the fleet, chose between a
# resend and the verdict (frames 200 ns later flipped seeds of test_ft_tree_loss.py).
SAME_INSTANT = 1e-9

UnitKey = tuple[bool, int, int | frozenset[int]]


@dataclass(frozen=True)
class Route:
    kind: Hop
    via: int  # first hop (direct: the target itself; flood: -1)
    target: int

    @property
    def hop_key(self) -> tuple[str, int, int]:
        return (self.kind, self.via, self.target)


@dataclass
class Pending:
    """A unit that waits for its ACK."""

    broadcast: bool
    chunk: int
    peer: int  # reduce: the intended aggregator; broadcast: the child it is for
    contributors: frozenset[int]
    frame: Frame  # DATA frame from this node; routing fields are set per attempt
    routes: list[Route]
    route_i: int = 0
    sent_at: float = 0.0
    timeout: float = 0.0
    retransmitted: bool = False
    cycle: bool = False  # reduce units keep cycling through routes until the deadline
    route_since: float = 0.0  # first send on the current route: silence counts from here
    retries: int = 0  # retransmissions on the current route
    seq: int = 0  # send order: an ACK of a later unit on the same direct link means a loss
    size: int = 0  # bytes of the DATA frame
    held: bool = False  # a flood waiting for the fleet's verdict on its silent target

    @property
    def route(self) -> Route:
        return self.routes[self.route_i]

    @property
    def key(self) -> UnitKey:
        return (self.broadcast, self.chunk, self.peer if self.broadcast else self.contributors)


@dataclass(frozen=True)
class Delivered:
    unit: Pending
    at: float


@dataclass(frozen=True)
class Undeliverable:
    """Every route of ``unit`` failed: it is given up."""

    unit: Pending


@dataclass(frozen=True)
class PeerSilent:
    """The link to ``peer`` died and not a word came from or of it for a whole timeout."""

    peer: int
    why: str
    at: float


CourierEvent = Delivered | Undeliverable | PeerSilent


class Courier:
    def __init__(self, scope: RoundScope, watch: PeerWatch, relay: Relay,
                 on_event: Callable[[CourierEvent], None]) -> None:
        self.scope, self.watch, self.relay, self.on_event = scope, watch, relay, on_event
        self.pending: dict[UnitKey, Pending] = {}
        self.progress: dict[tuple[str, int, int], float] = {}  # hop -> its last ACK
        self.acked_at: dict[int, float] = {}  # peer -> last ACK of direct units from it (rates)
        self.drain_from: dict[int, tuple[float, int]] = {}  # peer -> (start, bytes): see _drained
        self.held_for: set[int] = set()  # targets of floods held (see advance)
        self.send_seq = 0
        self.nack_resends: dict[UnitKey, int] = {}  # unit -> resends its target's NACKs got
        self.delivered_to: dict[int, set[int]] = {}  # chunk -> who ACKed our reduce units (the aggregator, around a parent down)
        self._ahead: dict[UnitKey, int] = {}  # see _ahead_bytes
        self._ahead_version = (-1, -1)
        # Dead in an earlier round: skipped from the start, probed, healed by a round trip.
        self.remembered_dead = scope.links.dead & set(scope.neighbours)  # empty unless remembering
        scope.dead |= self.remembered_dead
        for peer in self.remembered_dead:
            scope.book.mark(peer, "failed")

    # ------------------------------------------------------------------ sending

    def send(self, p: Pending, now: float) -> None:
        """Deliver ``p``: on its first usable route, or given up at once if none is."""
        p.size = frame_size(p.frame)
        self.pending[p.key] = p
        while self.unusable(p.route):
            if not self._step(p):
                del self.pending[p.key]
                return
        self._emit(p, now)

    def resend(self, p: Pending, now: float) -> None:
        """``p`` once more on its route now (what was in flight may be lost)."""
        self._emit(p, now, fresh=False)

    def _emit(self, p: Pending, now: float, fresh: bool = True) -> None:
        """Send ``p`` on its current route; ``fresh``: the first time on this route."""
        scope, route = self.scope, p.route
        p.sent_at = now
        self.send_seq += 1
        p.seq = self.send_seq
        if fresh:
            p.route_since, p.retries = now, 0
            p.timeout = self._route_timeout(route)
        if not p.broadcast and route.kind != Hop.DIRECT:
            # Our units go around our parent: the result comes back the same way (ft_scope.result_source).
            scope.carriers.update([route.via] if route.kind == Hop.RELAY else scope.tree.backups(scope.node))
        if route.kind == Hop.DIRECT:
            scope.out.send(route.target, replace(p.frame, kind=Kind.DATA, target=route.target))
        elif route.kind == Hop.RELAY:
            scope.out.send(route.via, replace(p.frame, kind=Kind.RELAY, target=route.target))
        else:
            self.relay.flood_own(replace(p.frame, kind=Kind.RELAY, target=route.target,
                                         flags=p.frame.flags | Flag.FLOOD))

    def _route_timeout(self, route: Route) -> float:
        rto = self.scope.rto
        if route.kind == Hop.DIRECT:
            return rto(route.target)
        if route.kind == Hop.RELAY:
            return rto(route.via) + rto(route.target)
        return rto(route.target) * (2 * self.scope.tree.height + 2)

    def unusable(self, route: Route) -> bool:
        if route.kind == Hop.FLOOD:
            return route.target in self.scope.down
        return route.via in self.scope.dead or route.target in self.scope.down

    def _step(self, p: Pending) -> bool:
        """Move to the next route; False when there is none left."""
        if p.route_i + 1 < len(p.routes):
            p.route_i += 1
            return True
        if p.cycle and any(not self.unusable(r) for r in p.routes):
            p.route_i = 0
            return True
        return False

    def advance(self, p: Pending, now: float) -> None:
        """``p`` on its next usable route, or given up."""
        scope = self.scope
        for _ in range(len(p.routes) + 1):
            if not self._step(p):
                break
            if not self.unusable(p.route):
                scope.stats.reroutes += 1
                scope.out.note(NoteKind.REROUTE if p.route.kind != Hop.DIRECT else NoteKind.ESCALATE, p.peer,
                           f"{p.route.kind} via {p.route.via}")
                if p.route.kind == Hop.FLOOD and self.watch.unheard_since_reported(p.route.target):
                    # Every member would forward the unit (a whole vector each: 21 MB at 15
                    # agents) to a peer we reported silent and have not heard since. Frozen,
                    # it is found so in a moment (peer_down drops the unit); alive with its
                    # links cut, it refutes (peer_spoke) and the flood goes then.
                    p.held, p.sent_at = True, now
                    self.held_for.add(p.route.target)
                    return
                self._emit(p, now)
                return
        self.pending.pop(p.key, None)
        self.on_event(Undeliverable(p))

    def release_held(self, peer: int, now: float) -> None:
        """``peer`` spoke: the floods held for it go now."""
        if peer not in self.held_for:
            return
        self.held_for.discard(peer)
        for p in list(self.pending.values()):
            if p.held and p.route.target == peer:
                p.held = False
                self._emit(p, now)

    # ------------------------------------------------------------------ timers

    def next_due(self) -> float | None:
        return min((self._due(p) for p in self.pending.values()), default=None)

    def _due(self, p: Pending) -> float:
        scope = self.scope
        if p.held:
            return float("inf")
        if scope.away and not scope.away.isdisjoint((p.peer, p.route.via, p.route.target)):
            return float("inf")  # its Will explains the silence: wait for it (peer_back)
        if p.route.kind != Hop.DIRECT:
            # A relayed unit crosses two links (a flood more, but its timeout is long).
            start = max(p.sent_at, self.progress.get(p.route.hop_key, p.sent_at))
            return start + p.timeout + scope.transmit(p.route.via, 2 * p.size)
        silent = self._silent_at(p)
        drain = self.drain(p)
        queued = self._queued_evidence(p)
        if self._may_retransmit(p):
            # Half an RTO (doubled by every resend, adaptive) after the link last showed life
            # and drained what is queued up to this unit: the resend's ACK can still come
            # before the peer counts as silent.
            heard = max(p.sent_at, self.watch.last_heard.get(p.route.target, p.sent_at))
            if queued is not None and queued > heard:
                heard = queued
            resend = heard + drain + p.timeout / 2 * self._backoff(p)
            return min(silent, resend)
        start = p.sent_at if queued is None else max(p.sent_at, queued)
        return min(silent, start + drain + p.timeout)

    def drain(self, p: Pending) -> float:
        """Transmission time of the bytes unACKed on ``p``'s direct link up to ``p`` itself."""
        return self.scope.transmit(p.route.target, self._ahead_bytes(p))

    def _ahead_bytes(self, p: Pending) -> int:
        # Every timer computation asks this for every unit: computed once per change of the
        # pending set (a send bumps send_seq; an ACK or a give-up shrinks it).
        version = (self.send_seq, len(self.pending))
        if self._ahead_version != version:
            by_route: dict[Route, list[Pending]] = {}
            for q in self.pending.values():
                if q.route.kind == Hop.DIRECT:
                    by_route.setdefault(q.route, []).append(q)
            self._ahead = {}
            for units in by_route.values():
                total = 0
                for q in sorted(units, key=lambda u: u.seq):
                    total += q.size
                    self._ahead[q.key] = total
            self._ahead_version = version
        return self._ahead.get(p.key, p.size)

    def _queued_evidence(self, p: Pending) -> float | None:
        """The latest sign that direct unit ``p`` is queued, not lost (a time to count its
        timers from): our link or the peer's downlink was busy (``PeerWatch.busy_towards``);
        or a unit sent before ``p`` to another peer is unACKed and that peer was heard from
        (our uplink still drains it)."""
        if not self.scope.adaptive:
            return None
        evidence = self.watch.busy_towards(p.route.target)
        for q in self.pending.values():
            if q.seq < p.seq and q.route.kind == Hop.DIRECT and q.route.target != p.route.target:
                heard = self.watch.last_heard.get(q.route.target)
                if heard is not None and (evidence is None or heard > evidence):
                    evidence = heard
        return evidence

    def _silent_at(self, p: Pending) -> float:
        """When the peer of a direct unit will have been silent for a whole RTO beyond the time
        the bytes queued towards it up to this unit need."""
        heard = max(self.watch.last_heard.get(p.route.target, p.route_since),
                    self.progress.get(p.route.hop_key, p.route_since))
        queued = self._queued_evidence(p)
        if queued is not None and queued > heard:
            heard = queued
        # Two resends back off (each waits for the one before), but not the verdict beyond
        # two RTOs of nothing at all: a child that ACKed one chunk of the broadcast and froze
        # kept its parent resending the next for eight RTOs (1.6 s) before it was reported.
        backoff = min(self._backoff(p), SILENCE_BACKOFF_CAP)
        return max(p.route_since, heard) + p.timeout * backoff + self.drain(p)

    def _backoff(self, p: Pending) -> float:
        """Exponential backoff of a unit resent on a live link (adaptive timeouts only: the
        fixed ones reproduce the thesis tables). The silence verdict backs off with it, so a
        resend still comes before it; a peer silent from the start gets one RTO."""
        return float(2 ** p.retries) if self.scope.adaptive else 1.0

    def _may_retransmit(self, p: Pending) -> bool:
        if p.retries >= MAX_RETRIES:
            return False
        # Only while the peer shows life: a silent peer gets its one RTO, then the backup.
        heard = self.watch.last_heard.get(p.route.target)
        return heard is not None and heard >= p.route_since

    def expire(self, now: float) -> None:
        """Resend, reroute or give up every unit whose time came."""
        for p in sorted(self.pending.values(), key=self._due):
            if p.key not in self.pending or self._due(p) > now:
                continue
            route = p.route
            if route.kind == Hop.DIRECT and self._silent_at(p) > now + SAME_INSTANT:
                if self._may_retransmit(p):
                    self._retransmit(p, now)
                else:
                    # The peer lives but this unit never got through: this unit alone moves on.
                    self.scope.stats.timeouts += 1
                    self.advance(p, now)
                continue
            self.scope.stats.timeouts += 1
            self.scope.out.note(NoteKind.TIMEOUT, route.via if route.kind != Hop.FLOOD else route.target,
                            f"chunk {p.chunk} {'broadcast' if p.broadcast else 'reduce'} {route.kind}")
            if route.kind == Hop.DIRECT:
                self._declare_dead(route.target, now)
            for q in [q for q in self.pending.values() if q.route == route]:
                self.advance(q, now)

    def _retransmit(self, p: Pending, now: float) -> None:
        p.retries += 1
        p.retransmitted = True
        self.scope.stats.retransmits += 1
        self._emit(p, now, fresh=False)

    # ------------------------------------------------------------------ ACKs

    def on_ack(self, frame: Frame, now: float) -> None:
        """An ACK for us: what it names is delivered; what was sent before it on the same
        direct link and is still unACKed was lost."""
        broadcast = frame.is_broadcast
        indices = frame.indices() if frame.payload else [frame.chunk_index]
        unit = frame.origin if broadcast else frame.contributors
        latest_seq: dict[Route, int] = {}  # direct route -> highest send seq ACKed by this frame
        sample_bytes, sample_from = 0, now  # units sent once: how much this ACK shows drained
        for j in indices:
            pending = self.pending.pop((broadcast, j, unit), None)
            if pending is None:
                continue
            route = pending.route
            if not broadcast:
                self.delivered_to.setdefault(j, set()).add(frame.origin)
            if route.kind == Hop.DIRECT and not pending.retransmitted:
                self.scope.links.observe(route.target, now - pending.sent_at)
                sample_bytes += pending.size
                sample_from = min(sample_from, pending.sent_at)
            self.progress[route.hop_key] = now
            if route.kind == Hop.DIRECT:
                latest_seq[route] = max(latest_seq.get(route, 0), pending.seq)
            self.on_event(Delivered(pending, now))
        if latest_seq and frame.sender == frame.origin:
            self._sample_rate(frame.sender, sample_bytes, sample_from, now)
        if frame.sender == frame.origin and not frame.flags & Flag.FLOOD:
            self.heal(frame.sender)  # an ACK straight from the peer: a round trip worked
        for route, seq in latest_seq.items():
            self._fast_retransmit(route, seq, now)

    def went_around(self, j: int, parent: int) -> bool:
        """Our unit of chunk ``j`` was ACKed by another aggregator than ``parent``."""
        acked = self.delivered_to.get(j, set())
        return bool(acked) and parent not in acked

    def _sample_rate(self, peer: int, nbytes: int, sent: float, now: float) -> None:
        # The link drained these bytes since it started on them: after the previous ACK
        # from this peer, or when they were sent if the link was idle until then.
        # (With fixed timeouts too: they ignore rates, wire_dtype "auto" does not.)
        if nbytes:
            start = max(sent, self.acked_at.get(peer, sent))
            self.scope.links.observe_rate(peer, nbytes, now - start)
            self._drained(peer, nbytes, start == sent, sent, now)
        self.acked_at[peer] = now

    def _drained(self, peer: int, nbytes: int, idle: bool, sent: float, now: float) -> None:
        """What ``wire_dtype = "auto"`` learns a link's rate from: the bytes of a whole busy
        stretch of the link (from a unit sent while nothing to ``peer`` was unACKed until
        nothing is), over its duration. The samples of single ACKs above are for the timers: an
        ACK that waited behind bulk data on our downlink comes with the next one, and the next
        sample then shows a rate far beyond the link's (float32 frames chosen on a 6 MB/s link)."""
        start, total = (sent, 0) if idle or peer not in self.drain_from else self.drain_from[peer]
        total += nbytes
        if any(p.route.kind == Hop.DIRECT and p.route.target == peer for p in self.pending.values()):
            self.drain_from[peer] = (start, total)
            return
        self.drain_from.pop(peer, None)
        self.scope.links.observe_drain(peer, total, now - start)

    def _fast_retransmit(self, route: Route, acked_seq: int, now: float) -> None:
        """Units sent on ``route`` before the one just ACKed were lost (or their ACK was)."""
        for p in list(self.pending.values()):
            if p.route == route and p.seq < acked_seq and p.retries < MAX_RETRIES:
                self._retransmit(p, now)

    def resend_asked(self, frame: Frame, now: float) -> bool:
        """A NACK: the units it lists that went through its sender, once more, within the
        sender's budget for each (NACK_RESENDS_PER_UNIT this round). False when the NACK
        asked for a unit over budget: a NACK flood cost us a unit per NACK, unbounded."""
        wanted = set(frame.indices())
        within = True
        for p in list(self.pending.values()):
            if p.broadcast == frame.is_broadcast and p.chunk in wanted and p.route.via == frame.sender:
                spent = self.nack_resends.get(p.key, 0)
                if spent >= NACK_RESENDS_PER_UNIT:
                    within = False
                    continue
                self.nack_resends[p.key] = spent + 1
                p.retransmitted = True
                self._emit(p, now, fresh=False)
        return within

    # ------------------------------------------------------------------ links and peers

    def _declare_dead(self, peer: int, now: float) -> None:
        scope = self.scope
        if scope.cfg.remember_dead_links:
            scope.links.mark_dead(peer)
        if peer in scope.dead:
            return
        scope.dead.add(peer)
        scope.book.mark(peer, "failed")
        scope.out.note(NoteKind.LINK_DEAD, peer)
        if self.watch.quiet_for(peer, now) >= scope.rto(peer):
            # Not a word from it, directly or relayed, for a whole timeout: evidence it is
            # silent (the fleet needs two such witnesses; a cut link has one).
            self.on_event(PeerSilent(peer, "link dead, nothing heard", now))

    def heal(self, peer: int) -> None:
        """A round trip with ``peer`` worked: forget an earlier round's verdict on the link.
        A link declared dead in THIS round stays dead until the round ends."""
        scope = self.scope
        was_dead = scope.links.heal(peer)
        if peer in self.remembered_dead:
            self.remembered_dead.discard(peer)
            scope.dead.discard(peer)
            scope.book.healed(peer)
        if was_dead:
            scope.out.note(NoteKind.LINK_HEALED, peer)

    def on_probe(self, frame: Frame, now: float) -> None:
        """A PROBE: a peer's downlink is busy (PROGRESS), a child waits for its children
        (WAITING), a round trip to it worked (REPLY), or it asks whether ours works (answered)."""
        scope = self.scope
        if frame.flags & Flag.PROGRESS:
            self.watch.progress(frame.sender, now)
        elif frame.flags & Flag.WAITING:
            pass  # a child's word that it is in the round (PeerWatch.heard took it)
        elif frame.flags & Flag.REPLY:
            self.heal(frame.sender)
        else:
            scope.out.send(frame.sender, scope.frame(Kind.PROBE, 0, Flag.REPLY, frozenset(), target=frame.sender))

    def probe_remembered_dead(self) -> None:
        scope = self.scope
        for peer in sorted(self.remembered_dead):
            scope.out.send(peer, scope.frame(Kind.PROBE, 0, Flag.NONE, frozenset(), target=peer))

    def peer_down(self, peer: int, now: float) -> None:
        """``peer`` is offline: drop what was for it, move what went to or through it on."""
        self.scope.dead.add(peer)
        for p in list(self.pending.values()):
            if p.broadcast and p.peer == peer:
                del self.pending[p.key]
            elif self.unusable(p.route):
                # Through it or to it (a unit relayed by a sibling to our silent parent too):
                # the next route now, not when this one's timer gives up.
                self.advance(p, now)

    def resend_all(self, now: float) -> None:
        """Back after a dropped connection: every unACKed unit again now (silence counts
        from here, not from before the drop)."""
        for p in list(self.pending.values()):
            p.route_since = now
            self._emit(p, now, fresh=False)

    def resend_involving(self, peer: int, now: float) -> None:
        """``peer`` is back after a dropped connection: what we sent it meanwhile is lost."""
        for p in list(self.pending.values()):
            if peer in (p.peer, p.route.via, p.route.target):
                p.route_since = now
                self._emit(p, now, fresh=False)

    def settle(self, j: int, counted: frozenset[int], ack_at_once: Callable[[Pending], bool]) -> None:
        """The root's fan-out of chunk ``j`` counts ``counted``: our reduce units it holds
        arrived. One whose ACK would have come before the fan-out (``ack_at_once``) and did not
        shows a link that loses frames one way: marked as a reroute marks it."""
        for p in list(self.pending.values()):
            if not p.broadcast and p.chunk == j and p.contributors <= counted:
                if p.route.kind == Hop.DIRECT and ack_at_once(p):
                    self.scope.book.mark(p.route.target, "rerouted")
                del self.pending[p.key]

    def has_reduce_units(self) -> bool:
        return any(not p.broadcast for p in self.pending.values())

    def clear(self) -> None:
        self.pending.clear()
