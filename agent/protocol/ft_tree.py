"""The fault-tolerant tree allreduce (FT-tree) of one round, on one node.

Reduce: every node sends, chunk by chunk, the mean and contributor set of its subtree to its
parent as soon as chunk j of every child subtree is covered; later arrivals follow as separate
disjoint units ("supplements"). Broadcast: the root sends the final mean down; every node
forwards what it gets (``broadcast: fanout``: the root publishes each chunk once on its fan-out
topic instead, every member reads it there, and a chunk it misses is pulled from its parent). Each unit is ACKed; a unit that is not ACKed within the link's RTO
marks that link dead for the round and moves, with every other unit waiting on that link, to
the next route: relay through the backup link(s), then (reduce) straight to the grandparent
and further ancestors, finally a flood over the FT graph. A node that got a peer's data by a
relay answers it (broadcast) by the same relay path, so a link fault costs about one RTO.

A lossy link is not a dead link (QoS 0 drops single frames): like TCP, a unit sent straight to
a peer is retransmitted on the SAME link, a bounded number of times, when an ACK of a unit
sent after it comes back first (frames on one link topic arrive in order, so it was lost) or
when half an RTO passed without its ACK. The link is declared dead only when the peer has
been silent (no frame at all from it) for a whole RTO while a unit waited: a dead link still
costs one RTO, a lossy one only retransmissions.

A slow link is neither (issue 19): TCP under MQTT loses nothing, it only queues. Every timer of
a unit sent straight to a peer (its resend, the peer's silence) therefore runs from the last
frame heard from the peer and covers the transmission of every byte still unACKed towards the
peer up to and including the unit (``LinkEstimators.transmit_time``: the link's measured rate,
never faster than a floor): while ACKs of earlier units keep coming, the link is draining and
nothing is resent or rerouted. Resends of one unit back off exponentially, and a resent unit
gives no RTT or rate sample (Karn).

The rates measured are those of the last rounds: when a link slows down from one round to the
next, the first slow round learns it only from an ACK, which may come after the timers.
Evidence that comes sooner (adaptive timeouts only): our transport reports a large frame that
keeps arriving piece by piece (``arriving``): our downlink is slow, its sender lives, and
whatever else was sent to us queues behind it, so every verdict on silence, every resend and
pull waits until DOWNLINK_BUSY_HOLD after the last report, and we tell the other members so
(PROBE|PROGRESS, at most every PROGRESS_EVERY): their units towards us are queued, not lost,
and the round is still under way (no pull, no deadline yet).
A unit queued on our uplink behind a unit to another peer that still shows life waits for it.
While such evidence keeps coming, the round's hard deadline is put off, up to
DEADLINE_STRETCH x the configured one. On fast links frames arrive whole, nothing is reported,
and a dead link is found as before.

A dead link stays dead across rounds (``LinkEstimators.dead``): the next round routes around
it from the start and sends the peer a PROBE instead, which the peer answers; an answer (or
an ACK of a frame sent straight to the peer) proves the link works both ways and heals it.
A permanent cut thus costs one RTO once, not every round.

ACKs: a unit that came straight from its sender is ACKed in a batch, one ACK frame listing
the chunk indices (u32 payload) of every unit with the same contributor set from that sender:
at once when the unit is the last chunk, is large (``ACK_AT_ONCE_BYTES``: its ACK must not queue
behind what the unit makes us forward) or ``ACK_EVERY`` units wait, else ``ACK_DELAY`` after
the first waiting one (at most a quarter of the link's RTO), and at once when the round ends
here. Frames on one link arrive in order, so a gap in an ACK still means a loss (fast
retransmit). Relayed and flooded units are ACKed one by one, as before.

Wire formats (``wire_auto``, agent option ``wire_dtype = "auto"``): a unit going up is sent in
the narrowest of the format its link fits (``wire_choice.choose`` from the link's typical rate
and the round's budget), the format our own link fits (``choose_for_own_link``, from our
downlink's arrival rate) and the formats of the units of that chunk it merged (its
children's), so a slow link anywhere below narrows every frame above it. The root quantizes
each chunk of the result once, in the narrowest format that went into that chunk, and
everybody passes exactly those bytes on (broadcast, fan-out, answers to pulls, a result sent
again after a reconnect): every member applies the same values. The root's own links to its
children do not narrow the result: their rates come from the broadcast's ACKs, and the root sends each result
chunk to all its children at once, so each child's sample shows a share of the root's uplink
(on a loaded host's loopback that alone made the result float16 in 13 of 30 rounds); a slow
link of the root shows in its children's units, which cross the same connection. Without
``wire_auto`` every frame is in ``wire_dtype``.

Counting: a unit is accepted only when its contributor set is disjoint from everything
counted for that chunk; a unit whose set is already covered is a duplicate (ACKed, not
counted); a partial overlap is refused. Hence no contribution is ever counted twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from agent.protocol.allreduce import (
    DEADLINE_STRETCH,
    DOWNLINK_BUSY_HOLD,
    PROGRESS_EVERY,
    ROOT_RETURN_MARGIN,
    ROOT_WILL_GRACE,
    Action,
    LinkBook,
    Outbox,
    RoundContext,
    RoundResult,
    RoundStats,
    chunk_bounds,
    frame_size,
    merge_means,
)
from agent.protocol.notes import NoteKind
from agent.protocol.wire import HEADER_SIZE, NO_NODE, DType, Flag, Frame, Kind, value_bytes
from agent.protocol.wire_choice import choose, choose_for_own_link, narrowest

DIRECT, RELAY, FLOOD = "direct", "relay", "flood"
SILENCE_BACKOFF_CAP = 2.0  # RTOs of silence from a peer that showed life that make it silent
MAX_RETRIES = 3  # retransmissions of one unit on one direct link before it tries the next route
IMPLAUSIBLE_FACTOR = 1000.0  # x our own largest gradient value, at least 1 (see _plausible)
ACK_EVERY = 8  # direct units ACKed by one frame at most (see the module docstring)
ACK_DELAY = 0.005  # s: longest wait of a direct unit for its batched ACK (<= a quarter RTO)
# A unit this large is ACKed at once: its ACK then leaves before whatever the unit makes us send
# (its transmission dwarfs an ACK frame, and a batched ACK would queue behind a forwarded MB).
ACK_AT_ONCE_BYTES = 65_536
# A leaf child silent this many times its usual first-frame time, plus one timeout, is
# reported (see _silence_span).
FIRST_FRAME_MARGIN = 1.25


def _peak(values: np.ndarray) -> float:
    """The largest magnitude in ``values`` (0 when empty): two reductions, no temporary
    |values| array (every unit received passes here)."""
    if not len(values):
        return 0.0
    return max(float(values.max()), -float(values.min()))


@dataclass(frozen=True)
class Route:
    kind: str  # direct | relay | flood
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
    def key(self) -> tuple[bool, int, int | frozenset[int]]:
        return (self.broadcast, self.chunk, self.peer if self.broadcast else self.contributors)


@dataclass
class ChunkState:
    lo: int
    hi: int
    units: list[tuple[frozenset[int], np.ndarray]] = field(default_factory=list)
    covered: set[int] = field(default_factory=set)
    forwarded: int = 0  # units merged into what went up so far
    first_sent: bool = False
    final: np.ndarray | None = None
    final_ids: frozenset[int] = frozenset()
    final_frame: Frame | None = None  # the result as it travels (its format and bytes), see _set_final
    narrowest: DType = DType.F32  # wire_auto: the narrowest format of the units merged here


class FtTreeRound(Outbox):
    def __init__(self, ctx: RoundContext) -> None:
        config, tree, node, round, gradient = ctx.config, ctx.tree, ctx.node, ctx.round, ctx.gradient
        model_hash, links, now = ctx.model_hash, ctx.links, ctx.now
        self.cfg, self.tree, self.node, self.round = config, tree, node, round
        self.grad, self.model_hash, self.links = gradient, model_hash, links
        self.start_time = now
        self.irregular_start = ctx.irregular_start
        self.own_link_rate = ctx.own_link_rate
        self.parent = tree.parent(node)
        self.children = tree.children(node)
        self.subtree = tree.subtree(node)
        self.expected: set[int] = set(self.subtree)
        self.neighbours = sorted(tree.neighbours(node))
        self.chunks = [ChunkState(lo, hi) for lo, hi in chunk_bounds(len(gradient), config.chunk_size)]
        self.n = len(self.chunks)
        # Bytes of the largest DATA frame of this round (its transmission time counts in waits).
        self.unit_bytes = HEADER_SIZE + max(c.hi - c.lo for c in self.chunks) * value_bytes(config.wire_dtype)
        self.result: RoundResult | None = None
        self.stats = RoundStats()
        self.book = LinkBook()
        self.book.known(self.neighbours)
        self.pending: dict[tuple[bool, int, int | frozenset[int]], Pending] = {}
        self.progress: dict[tuple[str, int, int], float] = {}
        self.last_heard: dict[int, float] = {}  # peer -> when any frame from it last arrived
        self.acked_at: dict[int, float] = {}  # peer -> last ACK of direct units from it (rates)
        self.drain_from: dict[int, tuple[float, int]] = {}  # peer -> (start, bytes): see _drained
        self.heard_of: dict[int, float] = {}  # node -> last frame from it or originated at it
        self.reported_silent: dict[int, float] = {}  # peer -> when we last reported it silent
        self.held_for: set[int] = set()  # targets of floods held (see _advance)
        self.refuted: set[int] = set()  # peers that refuted a report of silence this round
        self.send_seq = 0
        self._ahead: dict[tuple[bool, int, int | frozenset[int]], int] = {}  # see _ahead_bytes
        self._ahead_version = (-1, -1)
        self.dead: set[int] = set()  # peers whose direct link from here is dead this round
        # Dead in an earlier round: skipped from the start, probed, healed by a round trip.
        self.remembered_dead = links.dead & set(self.neighbours)  # empty unless remembering
        self.dead |= self.remembered_dead
        for peer in self.remembered_dead:
            self.book.mark(peer, "failed")
        self.down: set[int] = set()  # peers known to be offline (membership)
        self.away: set[int] = set()  # peers whose Will came, given a moment to come back
        self.bcast_routes: dict[int, Route] = {}  # how to reach a peer whose data came oddly
        self.adopted: set[int] = set()  # non-children that delivered their data to us
        self.pull_waiters: dict[int, set[int]] = {}
        self.no_result_for: dict[int, list[int]] = {}  # peer -> chunks it asked for that we skipped
        self.no_result: set[int] = set()  # chunks our parent or the root says have no result
        self.root_gone_at: float | None = None  # the root's Will came; our parent was asked
        self.seen_floods: set[tuple[object, ...]] = set()
        self.relayed_pairs: set[tuple[int, int]] = set()
        self.relay_watch: dict[int, float] = {}  # relay target -> first relay not answered yet
        own = _peak(gradient)
        self.value_limit = IMPLAUSIBLE_FACTOR * max(own, 1.0)  # see _plausible
        self.nacked: set[tuple[int, bool, int]] = set()
        self.gaps_pulled: set[int] = set()  # chunks lost in the root's fan-out, asked for
        self.fanned_at: dict[int, float] = {}  # chunk -> when the fan-out sent (root) or brought it
        self.fan_sampled: set[int] = set()  # children whose ACK of the fan-out gave an RTT sample
        self.back_at = -1e9  # when our connection came back in this round (see reconnected)
        self.fan_acked: dict[int, set[int]] = {}  # child -> chunks of the result it ACKed
        self.fan_watch: dict[int, float] = {}  # child -> when its ACK of the whole result is due
        self.root_hash: int | None = model_hash if self.parent is None else None
        self.deadline = now + config.round_deadline
        self.deadline_limit = now + config.round_deadline * DEADLINE_STRETCH  # see _draining
        self.down_busy_at = -1e9  # our transport last said a large frame is still arriving
        self.progress_sent_at = -1e9
        self.progress_from: dict[int, float] = {}  # peer -> its last PROBE|PROGRESS
        self.wait_at = now + self._reduce_wait()
        self.wait_fired = False
        # A child that sends nothing at all for this long is silent: stop waiting for it.
        self.silence_at: dict[int, float] = {c: now + self._silence_span(c) for c in self.children}
        self.reduce_done = self.parent is None
        parent_rto = self._rto(self.parent) if self.parent is not None else 0.0
        self.pull_at: float | None = (
            None if self.parent is None
            else now + config.round_deadline * config.reduce_fraction + config.pull_timeouts * parent_rto
        )
        self.pull_chain = self._pull_chain()
        self.pull_i = 0
        self.over = False  # past the hard deadline: only answer frames
        # Batched ACKs of direct units: sender -> (flags, contributors) -> chunk indices.
        self.ack_due: dict[int, dict[tuple[Flag, frozenset[int]], list[int]]] = {}
        self.ack_at: dict[int, float] = {}  # sender -> when its batch goes out at the latest
        self._out: list[Action] = []

    # ------------------------------------------------------------------ public API

    def start(self, now: float) -> list[Action]:
        for peer in sorted(self.remembered_dead):
            self._send(peer, self._frame(Kind.PROBE, 0, Flag.NONE, frozenset(), target=peer))
        for j, ch in enumerate(self.chunks):
            ch.units.append((frozenset({self.node}), self.grad[ch.lo : ch.hi]))
            ch.covered.add(self.node)
            self._try_forward(j, now)
        return self._flush()

    def on_frame(self, frame: Frame, now: float) -> list[Action]:
        self.stats.frames_received += 1
        self.stats.bytes_received += frame_size(frame)
        first = frame.sender not in self.last_heard
        if not self._fanned(frame):
            # The root's fan-out shows it is alive, not that its link to us works (a one-way
            # cut of it hid behind the fan-out: no verdict, and the drift resync leaned on it).
            self.last_heard[frame.sender] = now
        self.heard_of[frame.sender] = self.heard_of[frame.origin] = now
        if self.held_for and not self.held_for.isdisjoint((frame.sender, frame.origin)):
            self._release_held(frame.sender, now)
            self._release_held(frame.origin, now)
        if frame.round != self.round or frame.job != self.cfg.job:
            self.stats.dropped += 1
            return self._flush()  # (floods released above)
        if first and frame.sender in self.silence_at and not self.irregular_start:
            # A child's first frame, before any verdict on it: how long it usually takes.
            self.links.observe_first_frame(frame.sender, now - self.start_time)
        if frame.kind == Kind.DATA:
            self._on_data(frame, now, DIRECT if frame.sender == frame.origin else RELAY)
        elif frame.kind == Kind.RELAY:
            self._on_relay(frame, now)
        elif frame.kind == Kind.ACK:
            self._on_ack(frame, now)
        elif frame.kind == Kind.NACK:
            self._on_nack(frame, now)
        elif frame.kind == Kind.PULL:
            self._on_pull(frame, now)
        elif frame.kind == Kind.PROBE:
            self._on_probe(frame, now)
        else:
            self.stats.dropped += 1
        return self._flush()

    def on_timer(self, now: float) -> list[Action]:
        if self.over:
            return []
        if now >= self.deadline and self._draining(now) and now < self.deadline_limit:
            if self.deadline <= self.start_time + self.cfg.round_deadline:
                self._note(NoteKind.DEADLINE_PUT_OFF, None, "links still draining")
            self.deadline = min(self.deadline_limit, now + DOWNLINK_BUSY_HOLD)
        if now >= self.deadline and not self.wait_fired and self.deadline > self.start_time + self.cfg.round_deadline:
            # A slow round whose wait for contributions went on while its links drained, and
            # they went quiet just now: what we have goes on (the root's result), not nothing.
            self.wait_fired = True
            for j in range(self.n):
                self._try_forward(j, now)
        if now >= self.deadline:
            self.over = True
            self.pending.clear()
            if self.result is None:
                self._finish(now)
            self._send_acks()
            return self._flush()
        for sender, at in list(self.ack_at.items()):
            if now >= at:
                self._send_acks(sender)
        if not self.wait_fired and now >= self.wait_at:
            self.wait_at = self._draining_until(now)
        if not self.wait_fired and now >= self.wait_at:
            self.wait_fired = True
            for j in range(self.n):
                self._try_forward(j, now)
        self._check_silent_children(now)
        self._check_relay_targets(now)
        self._expire_pending(now)
        self._fan_overdue(now)
        # Once the result is in (it may skip chunks), nothing is pulled: next_timer agrees.
        if self.result is None and self.pull_at is not None and now >= self.pull_at:
            if (hold := self._pull_hold()) > now:
                self.pull_at = hold  # the broadcast is under way: a pull would only add a copy
            elif self.root_gone_at is not None:
                self._root_went_down(now)  # the parent did not answer: skip as the others did
            else:
                self._pull(now)
        return self._flush()

    def next_timer(self) -> float | None:
        """When ``on_timer`` has something to do: every check it runs is scheduled here, so
        the round does the same whatever else wakes it (the driver calls ``on_timer`` for any
        timer of the core). A silent child's report goes out at its time also once the wait for
        contributions fired: it was sent only when an unrelated timer happened to fire."""
        if self.over:
            return None
        times = [self.deadline]
        if not self.wait_fired and not self._all_forwarded():
            times.append(self.wait_at)
        times.extend(at for c, at in self.silence_at.items() if self._may_be_silent(c))
        if self.pull_at is not None and self.result is None:
            times.append(self.pull_at)
        times.extend(self._due(p) for p in self.pending.values())
        # While our links drain, the verdict on a relay target waits (see _check_relay_targets).
        drained = self._drain_end()
        times.extend(max(at + self._relay_wait(t), drained) for t, at in self.relay_watch.items()
                     if self.heard_of.get(t, -1e9) < at)
        times.extend(self.ack_at.values())
        times.extend(self.fan_watch.values())
        return min(times)

    def arriving(self, sender: int | None, now: float) -> list[Action]:
        if self.over or self.cfg.timeout_mode == "fixed":
            return []
        self.down_busy_at = now  # (or our uplink: the same hold either way)
        if sender is not None and sender != self.node and sender in self.tree.members:
            if sender not in self.last_heard and sender in self.silence_at and not self.irregular_start:
                self.links.observe_first_frame(sender, now - self.start_time)  # its first frame began
            self.last_heard[sender] = self.heard_of[sender] = now
        if now - self.progress_sent_at >= PROGRESS_EVERY:
            self.progress_sent_at = now
            # To every member, not only our neighbours: a leaf waiting for the broadcast learns
            # that the round is still under way elsewhere (instead of pulling a copy).
            for peer in self.tree.members:
                if peer != self.node and peer not in self.down:
                    self._send(peer, self._frame(Kind.PROBE, 0, Flag.PROGRESS, frozenset(), target=peer))
        return self._flush()

    def _draining(self, now: float) -> bool:
        """Links around us show they are still delivering: our downlink is busy with a large
        frame, or a neighbour's is (its PROGRESS)."""
        return now < self._drain_end()

    def _drain_end(self) -> float:
        """When ``_draining`` turns false, unless more evidence comes."""
        if self.cfg.timeout_mode == "fixed":
            return -1e18
        latest = max(self.down_busy_at, max(self.progress_from.values(), default=-1e9))
        return latest + DOWNLINK_BUSY_HOLD

    def _pull_hold(self) -> float:
        """Pull no sooner than this: our link or a neighbour's is busy with a large frame (the
        broadcast on its way, slowly)."""
        if self.cfg.timeout_mode == "fixed":
            return -1e9
        return max(self.down_busy_at, max(self.progress_from.values(), default=-1e9)) + DOWNLINK_BUSY_HOLD

    def _queued_evidence(self, p: Pending) -> float:
        """The latest sign that direct unit ``p`` is queued, not lost (a time to count its
        timers from): our link was busy (the peer's answer may wait behind a large frame), or
        the peer's downlink was (its PROGRESS), DOWNLINK_BUSY_HOLD ago at the latest; or a unit
        sent before ``p`` to another peer is unACKed and that peer was heard from (our uplink
        still drains it)."""
        if self.cfg.timeout_mode == "fixed":
            return -1e9
        # A hold beyond the last report: the next report comes PROGRESS_EVERY later at best.
        latest = max(self.down_busy_at, self.progress_from.get(p.route.target, -1e9)) + DOWNLINK_BUSY_HOLD
        for q in self.pending.values():
            if q.seq < p.seq and q.route.kind == DIRECT and q.route.target != p.route.target:
                latest = max(latest, self.last_heard.get(q.route.target, -1e9))
        return latest

    def peer_down(self, peer: int, now: float) -> list[Action]:
        """Membership says ``peer`` is offline: stop waiting for it, route around it."""
        if peer == self.node or peer in self.down:
            return []
        self.away.discard(peer)
        self.down.add(peer)
        self.dead.add(peer)
        self.expected.discard(peer)
        for p in list(self.pending.values()):
            if p.broadcast and p.peer == peer:
                del self.pending[p.key]
            elif self._unusable(p.route):
                # Through it or to it (a unit relayed by a sibling to our silent parent too):
                # the next route now, not when this one's timer gives up.
                self._advance(p, now)
        for j in range(self.n):
            self._try_forward(j, now)
        if peer == self.parent and self.result is None:
            self._resend_custody(now)
            if self.pull_at is not None:
                self.pull_at = now  # a silent parent will not broadcast: ask the others at once
        if peer == self.tree.root and self.result is None:
            self._root_went_down(now)
        return self._flush()

    def _root_went_down(self, now: float) -> None:
        """Nobody can average this round any more. Chunks without the root's result are
        skipped (nothing applied), the same on every survivor, so their models stay
        identical; a survivor that got a chunk the others lack is caught by the next root's
        model hash and resyncs. But the root may have broadcast before it went: a live
        parent that got the result passes it on, so ask it once (it answers with the result
        or that there is none) before skipping; one pull timeout at most."""
        parent = self.parent
        if parent is None or parent == self.tree.root or parent in self.down or self.root_gone_at is not None:
            self._note(NoteKind.ROOT_DOWN, self.tree.root)
            self._finish(now, skip_missing=True)
            return
        self.root_gone_at = now
        self._note(NoteKind.ROOT_DOWN, self.tree.root, f"asking {parent} for the result")
        self._send_pull(parent, now)

    def reconnected(self, now: float, away: float = float("inf")) -> list[Action]:
        """Back after a dropped connection: send every unACKed unit again now (silence counts
        from here, not from before the drop), and ask for the round's result at once: the
        peers got our Will and may have finished without us (a peer that has the result
        answers, one that has not yet answers when it has it). Without this the node waited a
        whole timeout for a parent that had moved on, and the fleet's next round waited for it.
        The root, ``away`` long, goes on when the members still wait for it (they give a
        root's Will ``ROOT_WILL_GRACE``); else it ends the round, as they did on its Will."""
        if self.over:
            return []
        for p in list(self.pending.values()):
            p.route_since = now
            self._emit(p, now, fresh=False)
        if self.parent is None and self.cfg.broadcast == "fanout":
            # Our fan-out of the chunks done so far may have been lost with the connection.
            for ch in self.chunks:
                if ch.final_frame is not None:
                    self._fanout(ch.final_frame)
        if self.parent is None and self.result is None and away <= ROOT_WILL_GRACE - ROOT_RETURN_MARGIN:
            self._note(NoteKind.RECONNECTED, self.node, f"back after {away * 1000:.0f} ms: the round goes on")
            self._ask_children_again()
        elif self.parent is None and self.result is None:
            # The root: our Will ended this round on every other member (see peer_down),
            # with the chunks they lack skipped. Do the same rather than wait for children
            # that went on (a chunk they lost in flight and we kept shows up as drift).
            self._note(NoteKind.ROOT_DOWN, self.node, "our connection dropped")
            self._finish(now, skip_missing=True)
        elif self.result is None:
            for _ in range(min(2, len(self.pull_chain))):  # two: a peer ahead is one witness
                self._pull(now)
            # A child that saw our Will sent around us: what it sent us before is no sign that
            # more is on its way (see _draining_until), and we wait for it only as long as a
            # first frame usually takes. An inner node's 10 ms drop, with the fan-out: a child
            # had sent us chunk 0 and chunk 1 around us; we waited for its chunk 1 as for a
            # unit still draining (at the link rate floor: 0.7 s), and the root for us.
            self.back_at = now
            self._stop_waiting_soon(now)
        return self._flush()

    def peer_away(self, peer: int, now: float) -> list[Action]:
        self.away.add(peer)
        return []

    def peer_back(self, peer: int, now: float) -> list[Action]:
        self.away.discard(peer)
        if self.over or peer in self.down:
            return []
        for p in list(self.pending.values()):
            if peer in (p.peer, p.route.via, p.route.target):
                p.route_since = now
                self._emit(p, now, fresh=False)
        if peer == self.parent and self.result is None:
            # Units its silence made us give up as undeliverable meanwhile, and what it had
            # ACKed if it lost them: once more (what it has is ACKed, not counted again).
            self._resend_custody(now)
        return self._flush()

    def peer_spoke(self, peer: int, now: float) -> list[Action]:
        self.refuted.add(peer)
        if not self.over:
            self._release_held(peer, now)
        return self._flush()

    def went_on(self, now: float) -> list[Action]:
        if self.over or self.result is not None or self.parent is None or self.parent in self.down:
            return []
        if not self.stats.pulls:
            # The parent only: it answers at once if it has the result, and sends it once if
            # we are one of its broadcast peers anyway (see _set_final).
            self._note(NoteKind.PULL, self.parent, "the fleet may have gone on without us")
            self._send_pull(self.parent, now)
        self._ask_children_again()
        self._stop_waiting_soon(now)
        return self._flush()

    def _ask_children_again(self) -> None:
        """What a child sent us while we were away is lost and waits for its timeout (no ACK
        came): ask for it now. A child that went around us has nothing to resend."""
        for child in self.children:
            gaps = [j for j, ch in enumerate(self.chunks) if child not in ch.covered]
            if gaps and child not in self.down:
                nack = Frame(Kind.NACK, self.cfg.job, self.round, self.node, 0, self.n, Flag.NONE)
                self._send(child, nack.with_indices(gaps))

    def _stop_waiting_soon(self, now: float) -> None:
        """A child that started this round while our Will was out sends around us, never to
        us: wait for our children only as long as their first frame usually takes, then pass
        on what we have and each unit as it comes (a unit or two more up our link: our parent
        may count on us for some). A whole wait for a child that went around us left the root
        waiting for one that had sent to us: 0.5-1.8 s rounds."""
        if not self.children or self.wait_fired:
            return
        usual = [f for c in self.children if (f := self.links.first_frame(c)) is not None]
        if len(usual) == len(self.children):
            at = self.start_time + FIRST_FRAME_MARGIN * max(usual)
        else:
            at = now + max(self._rto(c) for c in self.children)
        self.wait_at = min(self.wait_at, max(now, at))

    def _resend_custody(self, now: float) -> None:
        """What the parent ACKed may be stuck in it now that it is down: send it again around
        it. The receiver refuses any overlap with what it already counted (merge_means only
        merges disjoint sets), so nothing is counted twice."""
        for j, ch in enumerate(self.chunks):
            if not ch.first_sent or ch.forwarded == 0:
                continue
            ids, mean = merge_means(ch.units[: ch.forwarded])
            if (False, j, ids) not in self.pending:
                self._send_up(j, ids, mean, now)

    def _check_relay_targets(self, now: float) -> None:
        for target, at in list(self.relay_watch.items()):
            if self.heard_of.get(target, -1e9) >= at:
                del self.relay_watch[target]  # it answered
            elif now >= at + self._relay_wait(target) and not self._draining(now):
                del self.relay_watch[target]
                self._report_silent(target, "relayed to it, no answer", now)

    def excuse(self, peer: int, now: float) -> list[Action]:
        if peer == self.node or peer not in self.expected or peer in self.heard_of:
            return []
        self.expected.discard(peer)
        for j in range(self.n):
            self._try_forward(j, now)
        return self._flush()

    # ------------------------------------------------------------------ reduce

    def _silence_span(self, child: int) -> float:
        """How long a healthy child's first frame can take before we ask the fleet: two
        timeouts of its link per level of its subtree (an inner child waits for its own
        children first). A leaf child's first frame comes when it usually does, plus one
        timeout, if that is sooner: the rest of the two timeouts is start-up skew that
        a leaf has shown it does not have (not when this round starts irregularly: after
        an evaluation, a degraded round or a view change, the skew varies)."""
        below = max(self.tree.depth(m) for m in self.tree.subtree(child)) - self.tree.depth(child)
        # Its first frame may wait behind its own children's data and its siblings' units.
        drain = self._transmit(child, self.unit_bytes * max(1, len(self.children)))
        span = (2 * self._rto(child) + drain) * (below + 1)
        usual = self.links.first_frame(child)
        if below == 0 and usual is not None and not self.irregular_start:
            span = min(span, FIRST_FRAME_MARGIN * usual + self._rto(child))
        return span

    def _check_silent_children(self, now: float) -> None:
        for child, at in list(self.silence_at.items()):
            if now < at:
                continue
            if self._draining(now):
                # Its first frame may queue behind what we or our neighbours receive.
                self.silence_at[child] = now + self._rto(child) + DOWNLINK_BUSY_HOLD
                continue
            del self.silence_at[child]
            if not self._may_be_silent(child):
                continue
            # Reported to the fleet: a live child (only its links are slow or cut) refutes at
            # once; unrefuted, the report comes back as ``excuse`` and we stop waiting.
            self._report_silent(child, "nothing from it for a whole wait", now)

    def _may_be_silent(self, child: int) -> bool:
        """Its silence time still matters: nothing heard of it, still waited for, and not
        counted in the result we have (its unit went around us: it is alive, only its link
        to us may not be)."""
        if child in self.heard_of or child in self.down or child not in self.expected:
            return False
        counted = self.result is not None and all(child in c for c in self.result.contributors)
        return not counted

    def _subtree_share(self) -> float:
        """The part of the tree's levels this node's subtree spans (1 at the root)."""
        below = max(self.tree.depth(m) for m in self.subtree) - self.tree.depth(self.node)
        return (below + 1) / (self.tree.height + 1)

    def _wait_span(self) -> float:
        return self.cfg.round_deadline * self.cfg.reduce_fraction * self._subtree_share()

    def _wait_cap(self, stretch: float = 1.0) -> float:
        """The longest wait for contributions: half of what the base wait leaves of the round
        (of the round put off by ``stretch`` while its links drain)."""
        base = self._wait_span()
        return base + (self.cfg.round_deadline * stretch - base) / 2

    def _reduce_wait(self) -> float:
        """How long to wait for every contribution: the base share of the deadline, or (adaptive)
        a quarter more than this node's share of its clean rounds took, up to ``_wait_cap``. On
        slow links a round can take longer than the base share: the broadcast of the previous
        round reaches the leaves late, so their data comes late, every round, cleanly."""
        base = self._wait_span()
        if self.cfg.timeout_mode == "fixed" or self.links.round_peak is None:
            return base
        usual = 1.25 * self.links.round_peak * self._subtree_share()
        return max(base, min(self._wait_cap(), usual))

    def _draining_until(self, now: float) -> float:
        """The wait for contributions is over at ``now``, unless a child that still owes some
        is demonstrably sending them (adaptive timeouts): a frame from it came within its RTO
        plus one unit's transmission, so its next unit is on the way. Then the wait extends to
        when that next unit is due, but never beyond the point that leaves half of what is
        left of the round for the broadcast."""
        if self.cfg.timeout_mode == "fixed":
            return now
        draining = self._draining(now)
        cap = self.start_time + self._wait_cap(DEADLINE_STRETCH if draining else 1.0)
        # Our link or a neighbour's is busy with a large frame: contributions are on the way.
        due = now + DOWNLINK_BUSY_HOLD if draining else now
        for child in self.children:
            owed = self.expected & set(self.tree.subtree(child))
            if child in self.down or not owed or all(owed <= ch.covered for ch in self.chunks):
                continue
            heard = self.last_heard.get(child)
            if heard is not None and heard >= self.back_at:
                due = max(due, heard + self._rto(child) + self._transmit(child, self.unit_bytes))
        return min(due, cap) if due > now else now

    def _all_forwarded(self) -> bool:
        if self.parent is None:
            return all(ch.final is not None for ch in self.chunks)
        return all(ch.first_sent for ch in self.chunks)

    def _try_forward(self, j: int, now: float) -> None:
        ch = self.chunks[j]
        ready = self.wait_fired or self.expected <= ch.covered
        if self.parent is None:
            if ch.final is None and ready:
                self._finalize_chunk(j, now)
            return
        if not ch.first_sent:
            if not ready:
                return
            ch.first_sent = True
        if ch.forwarded < len(ch.units):
            ids, mean = merge_means(ch.units[ch.forwarded :])
            ch.forwarded = len(ch.units)
            self._send_up(j, ids, mean, now)

    def _send_up(self, j: int, ids: frozenset[int], mean: np.ndarray, now: float) -> None:
        assert self.parent is not None
        dtype = self._wire_dtype(self.parent, self.chunks[j])
        frame = self._frame(Kind.DATA, j, Flag.NONE, ids).with_values(mean, dtype)
        pending = Pending(False, j, self.parent, ids, frame, self._up_routes(), cycle=True)
        self._launch(pending, now)

    def _wire_dtype(self, peer: int, ch: ChunkState) -> DType:
        """The format of chunk ``ch``'s values to ``peer`` (see the module docstring)."""
        if not self.cfg.wire_auto:
            return self.cfg.wire_dtype
        fits = choose(len(self.grad), self.links.typical_rate(peer), self.cfg.wire_budget, self.cfg.wire_dtype)
        ours = choose_for_own_link(len(self.grad), self.own_link_rate, self.cfg.wire_dtype)
        return narrowest(narrowest(fits, ours), ch.narrowest)

    def _up_routes(self) -> list[Route]:
        assert self.parent is not None
        parent = self.parent
        routes = [Route(DIRECT, parent, parent)]
        routes += [Route(RELAY, b, parent) for b in self.tree.backups(self.node)]
        routes += [Route(DIRECT, a, a) for a in self.tree.ancestors(self.node)[1:]]
        routes.append(Route(FLOOD, -1, parent))
        return routes

    def _on_contribution(self, frame: Frame, now: float, how: str) -> None:
        j = frame.chunk_index
        ch = self.chunks[j]
        ids = frame.contributors
        if not ids or not ids <= self.subtree or frame.origin not in self.subtree or self.node in ids:
            self.stats.dropped += 1
            return
        self._ack(frame, how, now)
        ended_without = self.result is not None and not self.result.contributors[j]
        if how == DIRECT and (frame.origin in self.down or ended_without):
            # Routed around (its Will came, say after a dropped connection) but running this
            # round: it does not know it was left out and would wait a timeout for a
            # broadcast that skips it. Or the round ended here without a result (root
            # down) before its data came. Its data is a pull: the result is the answer.
            self._answer_with_final(j, frame.origin, now)
            self._send_no_result()
        self._learn_route(frame.origin, frame.sender, how)
        if self.cfg.nack and how == DIRECT:
            self._nack_gaps(frame, lambda i: frame.origin in self.chunks[i].covered)
        if ids <= ch.covered or (self.parent is None and ch.final is not None):
            return  # a duplicate (lost ACK, resend) or too late for the final mean
        if ids & ch.covered and not self._subsumes(ch, ids):
            self.stats.overlaps += 1
            return
        values = frame.values()
        if not self._plausible(values, frame.sender):
            return
        if ids & ch.covered:
            ch.units = [unit for unit in ch.units if not unit[0] & ids]
            ch.covered = set().union(*(u for u, _ in ch.units))
        ch.units.append((ids, values))
        ch.covered |= ids
        ch.narrowest = narrowest(ch.narrowest, frame.dtype)
        self._try_forward(j, now)

    def _subsumes(self, ch: ChunkState, ids: frozenset[int]) -> bool:
        """A unit that holds every unit it overlaps replaces them, if none of them went up
        yet: coverage only grows and nothing is counted twice. A child that saw its parent's
        Will sends what the parent had ACKed around it (``_resend_custody``); the parent, back
        a moment later, sends its subtree's mean with that child's share in it. Refused as an
        overlap, it left the root waiting for the rest of that subtree until its wait ran
        out: a 2.5 s degraded round of a flapping inner node."""
        overlapped = [i for i, (u, _) in enumerate(ch.units) if u & ids]
        if not all(ch.units[i][0] <= ids for i in overlapped):
            return False
        return self.parent is None or min(overlapped) >= ch.forwarded

    def _plausible(self, values: np.ndarray, sender: int) -> bool:
        """A mean of honest gradients is never far larger than our own gradient (same model,
        same data distribution): a unit beyond ``IMPLAUSIBLE_FACTOR`` times our largest
        value is a buggy or hostile peer's, refused and counted, never averaged in."""
        if _peak(values) > self.value_limit:
            self.stats.implausible += 1
            self._note(NoteKind.IMPLAUSIBLE, sender, f"values beyond {self.value_limit:.3g}")
            return False
        return True

    def _learn_route(self, origin: int, hop: int, how: str) -> None:
        if how == DIRECT:
            if origin not in self.children and origin != self.parent:
                self.adopted.add(origin)
            return
        self.book.mark(origin, "rerouted")
        if origin not in self.children:
            self.adopted.add(origin)
        # The direct link failed one way at least: answer by the path that worked.
        self.bcast_routes[origin] = Route(RELAY, hop, origin) if how == RELAY else Route(FLOOD, -1, origin)

    # ------------------------------------------------------------------ broadcast

    def _finalize_chunk(self, j: int, now: float) -> None:
        ch = self.chunks[j]
        ids, mean = merge_means(ch.units)
        dtype = narrowest(self.cfg.wire_dtype, ch.narrowest) if self.cfg.wire_auto else self.cfg.wire_dtype
        frame = self._frame(Kind.DATA, j, Flag.BROADCAST | Flag.FINAL, ids).with_values(mean, dtype)
        if dtype != DType.F32:
            # Everybody applies what the wire carries, the root included: byte-identical.
            mean = frame.values()
        self._set_final(j, ids, mean, now, frame)

    def _set_final(self, j: int, ids: frozenset[int], values: np.ndarray, now: float,
                   wire: Frame) -> None:
        """``wire``: a frame whose payload carries ``values`` in the wire dtype; it is passed
        on as it is (no second quantization, no copy)."""
        ch = self.chunks[j]
        ch.final, ch.final_ids = values, ids
        frame = replace(self._frame(Kind.DATA, j, Flag.BROADCAST | Flag.FINAL, ids),
                        dtype=wire.dtype, scale=wire.scale, payload=wire.payload)
        ch.final_frame = frame  # every later copy of the result: these bytes, never re-encoded
        if self.cfg.broadcast == "fanout":
            broadcast: list[int] = []  # every member reads the root's fan-out (see _on_fanned)
            if self.parent is None:
                self._fanout(frame)
                self.fanned_at[j] = now
        else:
            broadcast = self._broadcast_peers()
        for peer in broadcast:
            self._send_down(j, peer, now)
        # A puller we broadcast to anyway gets it once (with its ACK and resends), not twice;
        # one whose parent lives gets it from there (it pulls again if its link is cut).
        for peer in sorted(self.pull_waiters.pop(j, set()) - set(broadcast)):
            if not self._its_parent_sends_it(peer):
                self._send(peer, replace(frame, target=peer))
        if self.result is None and all(c.final is not None for c in self.chunks):
            if self.cfg.broadcast == "fanout":
                self._watch_fanout(now)
            self._finish(now)

    def _watch_fanout(self, now: float) -> None:
        """Every child ACKs the root's fan-out to us (see _ack_fanned). One that has ACKed none
        of it within an RTO of our having the whole result gets the result from us, each chunk
        ACKed and routed around dead links, as relayed down the tree (see _fan_overdue): so a
        child frozen in this round is found silent in it. Relayed down the tree that copy is what
        finds it; without it a frozen leaf was found only by the next round's wait for its
        contribution (0.64 s against a 0.038 s round, 7 agents, the agents' defaults)."""
        result_bytes = self.n * self.unit_bytes
        for child in self._broadcast_peers():
            if len(self.fan_acked.get(child, ())) < self.n:
                self.fan_watch[child] = now + self._rto(child) + self._transmit(child, result_bytes)

    def _fan_overdue(self, now: float) -> None:
        for child, due in list(self.fan_watch.items()):
            if due > now:
                continue
            del self.fan_watch[child]
            if child not in self.down and not self.fan_acked.get(child):
                # It ACKed none of it (one that ACKed a part lives, and pulls what it lacks).
                for j in range(self.n):
                    self._send_down(j, child, now)

    def _send_down(self, j: int, peer: int, now: float) -> None:
        """Chunk ``j`` of the result to ``peer``, relayed as down the tree: ACKed, resent and
        routed around dead links (a copy already on its way is not sent twice)."""
        ch = self.chunks[j]
        routes = self._down_routes(peer)
        if routes and ch.final_frame is not None and (True, j, peer) not in self.pending:
            self._launch(Pending(True, j, peer, ch.final_ids, ch.final_frame, routes), now)

    def _its_parent_sends_it(self, peer: int) -> bool:
        """``peer`` asked us for a result we did not have yet; its parent, alive as far as we
        know, broadcasts it anyway. In a round stalled on a frozen node every member pulls:
        each copy sent from here doubled their broadcast (30 MB more at 15 agents)."""
        parent = self.tree.parent(peer) if peer in self.tree.members else None
        return parent is not None and parent != self.node and parent not in self.down

    def _broadcast_peers(self) -> list[int]:
        peers = set(self.children) | self.adopted
        return sorted(peers - self.down - {self.node})

    def _down_routes(self, peer: int) -> list[Route]:
        known = self.bcast_routes.get(peer)
        if known is not None:
            return [known] if known.kind == FLOOD else [known, Route(FLOOD, -1, peer)]
        routes = [Route(DIRECT, peer, peer)]
        routes += [Route(RELAY, b, peer) for b in self.tree.backups(peer) if b != self.node]
        routes.append(Route(FLOOD, -1, peer))
        return routes

    def _on_final(self, frame: Frame, now: float, how: str) -> None:
        j = frame.chunk_index
        if how == DIRECT and self._fanned(frame):
            self._on_fanned(frame, now)
            return
        self._ack(frame, how, now)
        if self.chunks[j].final is not None:
            return
        if not frame.contributors or self.parent is None:
            self.stats.dropped += 1
            return
        if self.root_hash is None:
            self.root_hash = frame.model_hash
        if self.cfg.nack and how == DIRECT and frame.sender == self.parent:
            self._nack_gaps(frame, lambda i: self.chunks[i].final is not None)
        values = frame.values()
        if not self._plausible(values, frame.sender):
            return
        self._set_final(j, frame.contributors, values, now, frame)

    def _fanned(self, frame: Frame) -> bool:
        """A result chunk from the root's fan-out topic (the core lets nothing else come from
        there; on a link topic a result always names its target)."""
        return (self.cfg.broadcast == "fanout" and frame.kind == Kind.DATA and frame.is_broadcast
                and frame.target == NO_NODE and frame.sender == frame.origin)

    def _on_fanned(self, frame: Frame, now: float) -> None:
        """A chunk of the result on the root's fan-out topic (``broadcast: fanout``): from this
        round's root only (the topic names its publisher, whom the ACL lets write it alone),
        checked like any other; not ACKed (the root waits for nobody). Frames of one topic
        arrive in order: an earlier chunk that did not come was lost, and is pulled from our
        parent at once (one that lost the last chunk pulls when its pull timer runs out)."""
        j = frame.chunk_index
        if frame.sender != self.tree.root or self.parent is None or not frame.contributors:
            self.stats.dropped += 1
            return
        if self.chunks[j].final is not None:
            return
        if self.root_hash is None:
            self.root_hash = frame.model_hash
        self.fanned_at[j] = now
        self._ack_fanned(frame, now)
        self._missing_acks(j, frame.contributors)
        self._delivered(j, frame.contributors)
        self._pull_gaps(j)
        values = frame.values()
        if not self._plausible(values, frame.sender):
            return
        self._set_final(j, frame.contributors, values, now, frame)
        rest = sum(1 for ch in self.chunks[j + 1 :] if ch.final is None)
        if self.result is None and rest and self.pull_at is not None:
            # The rest of the fan-out follows this chunk at once: what has not come within half
            # an RTO of our parent (and its transmission; when a lost unit would be resent on a
            # link) was lost: ask then, not a pull timeout later.
            due = now + self._rto(self.parent) / 2 + self._transmit(self.tree.root, rest * self.unit_bytes)
            self.pull_at = min(self.pull_at, due)

    def _missing_acks(self, j: int, counted: frozenset[int]) -> None:
        """The fan-out of chunk ``j`` counts what we sent for it straight to a peer, so the peer
        had it before the root published; an ACK it sent at once (the last chunk, a large unit)
        came before the fan-out (causal order through one broker). Still missing, it was lost:
        the link from that peer is cut one way or lossy. Marked as a rerouted broadcast marks it
        in tree mode (a drift resync must not lean on that link, and the dashboard shows it)."""
        for p in self.pending.values():
            if (not p.broadcast and p.chunk == j and p.route.kind == DIRECT and p.contributors <= counted
                    and (j == self.n - 1 or len(p.frame.payload) >= ACK_AT_ONCE_BYTES)):
                self.book.mark(p.route.target, "rerouted")

    def _delivered(self, j: int, counted: frozenset[int]) -> None:
        """Our units of chunk ``j`` that the root's result counts arrived: their ACKs only
        could still tell us so. In a fan-out round our parent sends us nothing else, so a lost
        ACK left such a unit waiting for a peer that had been silent towards us, and it went
        to the backup a timeout later, long after the round had it (p = 0.1 on every link: 51
        reroutes against 114 resends; tree mode, where the parent's broadcast shows its life,
        38 against 326). A link that lost every ACK is marked by _missing_acks."""
        for p in list(self.pending.values()):
            if not p.broadcast and p.chunk == j and p.contributors <= counted:
                del self.pending[p.key]

    def _ack_fanned(self, frame: Frame, now: float) -> None:
        """ACK the fan-out to our parent, batched as if it had sent it: our parent sends us
        nothing else that we ACK, and these give it the RTO of its link to us (its waits for
        a silent child count on it). Its sample runs from when it sent (the root) or got the
        chunk itself: about one trip short of a round trip, under the RTO floor here."""
        parent = self.parent
        if parent is None or self.over or self.result is not None:
            return
        batch = self.ack_due.setdefault(parent, {}).setdefault((Flag.BROADCAST, frame.contributors), [])
        if frame.chunk_index not in batch:
            batch.append(frame.chunk_index)
        if frame.chunk_index == self.n - 1 or len(batch) >= ACK_EVERY:
            self._send_acks(parent)
        elif parent not in self.ack_at:
            self.ack_at[parent] = now + min(ACK_DELAY, self._rto(parent) / 4)

    def _fanout_acked(self, child: int, indices: list[int], now: float) -> None:
        """A child ACKed the fan-out (see _ack_fanned): one RTT sample per child and round,
        when we had every chunk it ACKs."""
        acked = self.fan_acked.setdefault(child, set())
        acked.update(j for j in indices if 0 <= j < self.n)
        if len(acked) == self.n:
            self.fan_watch.pop(child, None)
        if child in self.fan_sampled or not all(j in self.fanned_at for j in indices):
            return
        self.fan_sampled.add(child)
        self.links.observe(child, max(0.0, now - max(self.fanned_at[j] for j in indices)))

    def _pull_gaps(self, j: int) -> None:
        """Ask our parent for the chunks before ``j`` that the fan-out did not bring (once)."""
        gaps = [i for i in range(j) if self.chunks[i].final is None and i not in self.gaps_pulled]
        if not gaps or self.parent is None or self.parent in self.down:
            return
        self.gaps_pulled.update(gaps)
        self.stats.nacks += 1
        self._note(NoteKind.NACK, self.parent, f"{len(gaps)} chunks lost in the fan-out: pulled")
        pull = Frame(Kind.PULL, self.cfg.job, self.round, self.node, 0, self.n, Flag.BROADCAST)
        self._send(self.parent, pull.with_indices(gaps))

    # ------------------------------------------------------------------ frames in

    def _on_data(self, frame: Frame, now: float, how: str) -> None:
        j = frame.chunk_index
        if (j >= self.n or frame.chunk_count != self.n
                or frame.n_values != self.chunks[j].hi - self.chunks[j].lo):
            self.stats.dropped += 1
            return
        if frame.is_broadcast:
            self._on_final(frame, now, how)
        else:
            self._on_contribution(frame, now, how)

    def _on_relay(self, frame: Frame, now: float) -> None:
        flooded = bool(frame.flags & Flag.FLOOD)
        if flooded:
            key = self._flood_key(frame)
            if key in self.seen_floods:
                return
            self.seen_floods.add(key)
        if frame.target == self.node:
            self._on_data(frame, now, FLOOD if flooded else RELAY)
            return
        self.stats.relays += 1
        if (frame.origin, frame.target) not in self.relayed_pairs:
            self.relayed_pairs.add((frame.origin, frame.target))
            self._note(NoteKind.RELAY, frame.origin, f"to {frame.target}")
        onward = replace(frame, sender=self.node)
        if not flooded:
            # The target ACKs through us: silence from it is our evidence, too.
            self.relay_watch.setdefault(frame.target, now)
        if flooded or frame.target in self.dead:
            self._flood(replace(onward, flags=onward.flags | Flag.FLOOD), exclude=frame.sender)
        else:
            self._send(frame.target, onward)

    def _on_ack(self, frame: Frame, now: float) -> None:
        if frame.target != self.node:
            onward = replace(frame, sender=self.node)
            if frame.flags & Flag.FLOOD:
                key = self._flood_key(frame)
                if key not in self.seen_floods:
                    self.seen_floods.add(key)
                    self._flood(onward, exclude=frame.sender)
            else:
                self._send(frame.target, onward)
            return
        broadcast = frame.is_broadcast
        indices = frame.indices() if frame.payload else [frame.chunk_index]
        if len(indices) > self.n:
            self.stats.dropped += 1
            return
        unit = frame.origin if broadcast else frame.contributors
        if (broadcast and self.cfg.broadcast == "fanout" and frame.sender == frame.origin
                and frame.sender in self.children):
            self._fanout_acked(frame.sender, indices, now)
        latest: dict[Route, int] = {}  # direct route -> highest send seq ACKed by this frame
        sample_bytes, sample_from = 0, now  # units sent once: how much this ACK shows drained
        for j in indices:
            pending = self.pending.pop((broadcast, j, unit), None)
            if pending is None:
                continue
            route = pending.route
            if route.kind == DIRECT and not pending.retransmitted:
                self.links.observe(route.target, now - pending.sent_at)
                sample_bytes += pending.size
                sample_from = min(sample_from, pending.sent_at)
            self.progress[route.hop_key] = now
            if route.kind == DIRECT:
                latest[route] = max(latest.get(route, 0), pending.seq)
        if latest and frame.sender == frame.origin:
            # The link drained these bytes since it started on them: after the previous ACK
            # from this peer, or when they were sent if the link was idle until then.
            # (With fixed timeouts too: they ignore rates, wire_dtype "auto" does not.)
            if sample_bytes:
                start = max(sample_from, self.acked_at.get(frame.sender, sample_from))
                self.links.observe_rate(frame.sender, sample_bytes, now - start)
                self._drained(frame.sender, sample_bytes, start == sample_from, sample_from, now)
            self.acked_at[frame.sender] = now
        if frame.sender == frame.origin and not frame.flags & Flag.FLOOD:
            self._heal(frame.sender)  # an ACK straight from the peer: a round trip worked
        for route, seq in latest.items():
            self._fast_retransmit(route, seq, now)
        self._check_reduce_done(now)

    def _drained(self, peer: int, nbytes: int, idle: bool, sent: float, now: float) -> None:
        """What ``wire_dtype = "auto"`` learns a link's rate from: the bytes of a whole busy
        stretch of the link (from a unit sent while nothing to ``peer`` was unACKed until
        nothing is), over its duration. The samples of single ACKs above are for the timers: an
        ACK that waited behind bulk data on our downlink comes with the next one, and the next
        sample then shows a rate far beyond the link's (float32 frames chosen on a 6 MB/s link)."""
        start, total = (sent, 0) if idle or peer not in self.drain_from else self.drain_from[peer]
        total += nbytes
        if any(p.route.kind == DIRECT and p.route.target == peer for p in self.pending.values()):
            self.drain_from[peer] = (start, total)
            return
        self.drain_from.pop(peer, None)
        self.links.observe_drain(peer, total, now - start)

    def _fast_retransmit(self, route: Route, acked_seq: int, now: float) -> None:
        """Units sent on ``route`` before the one just ACKed were lost (or their ACK was)."""
        for p in list(self.pending.values()):
            if p.route == route and p.seq < acked_seq and p.retries < MAX_RETRIES:
                self._retransmit(p, now)

    def _retransmit(self, p: Pending, now: float) -> None:
        p.retries += 1
        p.retransmitted = True
        self.stats.retransmits += 1
        self._emit(p, now, fresh=False)

    def _on_probe(self, frame: Frame, now: float) -> None:
        if frame.flags & Flag.PROGRESS:
            self.progress_from[frame.sender] = now  # it lives (last_heard), its downlink is busy
        elif frame.flags & Flag.REPLY:
            self._heal(frame.sender)
        else:
            self._send(frame.sender, self._frame(Kind.PROBE, 0, Flag.REPLY, frozenset(), target=frame.sender))

    def _on_nack(self, frame: Frame, now: float) -> None:
        if frame.flags & Flag.FINAL:
            self._on_no_result(frame, now)
            return
        wanted = set(frame.indices())
        broadcast = frame.is_broadcast
        for p in list(self.pending.values()):
            if p.broadcast == broadcast and p.chunk in wanted and p.route.via == frame.sender:
                p.retransmitted = True
                self._emit(p, now, fresh=False)

    def _on_pull(self, frame: Frame, now: float) -> None:
        asked = frame.indices() or list(range(self.n))
        puller = frame.sender
        self._note(NoteKind.PULL, puller, "served")
        for j in asked:
            if 0 <= j < self.n:
                self._answer_with_final(j, puller, now)
        self._send_no_result()

    def _answer_with_final(self, j: int, peer: int, now: float) -> None:
        """Chunk ``j``'s result to ``peer``: now, or when we have it (not after the deadline);
        or, when this round ended here without one (its root went down), that it has none."""
        ch = self.chunks[j]
        sent = self.pending.get((True, j, peer))
        if ch.final is not None and sent is not None and now - sent.sent_at < sent.timeout:
            return  # our broadcast to it left just now (resends follow): not a second copy
        if ch.final_frame is not None:
            self._send(peer, replace(ch.final_frame, target=peer))
        elif self.result is not None and not self.result.contributors[j]:
            self.no_result_for.setdefault(peer, []).append(j)
        elif not self.over:
            self.pull_waiters.setdefault(j, set()).add(peer)

    def _send_no_result(self) -> None:
        """One NACK|FINAL per asking peer: "this round has no result for these chunks"
        (see _on_no_result)."""
        for peer, chunks in self.no_result_for.items():
            notice = self._frame(Kind.NACK, 0, Flag.BROADCAST | Flag.FINAL, frozenset(), target=peer)
            self._send(peer, notice.with_indices(sorted(set(chunks))))
        self.no_result_for.clear()

    def _on_no_result(self, frame: Frame, now: float) -> None:
        """Our parent or the root ended this round without a result for some chunks (the root
        went down while we still waited for the broadcast, its Will reached us in another
        round, or it came back and ended the round as the others had): those chunks have no
        result anywhere, so we skip them as they did instead of pulling to the deadline. Only
        the two that could send us the result may say it has none."""
        if self.result is not None or frame.sender not in (self.parent, self.tree.root):
            self.stats.dropped += 1
            return
        for j in frame.indices():
            if 0 <= j < self.n and self.chunks[j].final is None:
                self.no_result.add(j)
        if all(ch.final is not None or j in self.no_result for j, ch in enumerate(self.chunks)):
            self._note(NoteKind.ROOT_DOWN, self.tree.root, f"no result, says {frame.sender}")
            self._finish(now, skip_missing=True)

    # ------------------------------------------------------------------ sending

    def _launch(self, pending: Pending, now: float) -> None:
        pending.size = frame_size(pending.frame)
        self.pending[pending.key] = pending
        while self._unusable(pending.route):
            if not self._step(pending):
                del self.pending[pending.key]
                return
        self._emit(pending, now)

    def _emit(self, p: Pending, now: float, fresh: bool = True) -> None:
        """Send ``p`` on its current route; ``fresh``: the first time on this route."""
        route = p.route
        p.sent_at = now
        self.send_seq += 1
        p.seq = self.send_seq
        if fresh:
            p.route_since, p.retries = now, 0
            p.timeout = self._route_timeout(route)
        if route.kind == DIRECT:
            self._send(route.target, replace(p.frame, kind=Kind.DATA, target=route.target))
        elif route.kind == RELAY:
            self._send(route.via, replace(p.frame, kind=Kind.RELAY, target=route.target))
        else:
            frame = replace(p.frame, kind=Kind.RELAY, target=route.target, flags=p.frame.flags | Flag.FLOOD)
            self.seen_floods.add(self._flood_key(frame))
            self._flood(frame, exclude=None)

    def _route_timeout(self, route: Route) -> float:
        if route.kind == DIRECT:
            return self._rto(route.target)
        if route.kind == RELAY:
            return self._rto(route.via) + self._rto(route.target)
        return self._rto(route.target) * (2 * self.tree.height + 2)

    def _report_silent(self, peer: int, why: str, now: float) -> None:
        """Tell the fleet ``peer`` sent nothing for a whole timeout (the core reports it)."""
        self.reported_silent[peer] = now
        self._note(NoteKind.SILENT, peer, why)

    def _unheard_since_reported(self, peer: int) -> bool:
        # Once it refuted, it lives (and the fleet hears one report per round from us).
        reported = self.reported_silent.get(peer)
        return (reported is not None and peer not in self.refuted
                and self.heard_of.get(peer, -1e9) < reported)

    def _release_held(self, peer: int, now: float) -> None:
        if peer not in self.held_for:
            return
        self.held_for.discard(peer)
        for p in list(self.pending.values()):
            if p.held and p.route.target == peer:
                p.held = False
                self._emit(p, now)

    def _unusable(self, route: Route) -> bool:
        if route.kind == FLOOD:
            return route.target in self.down
        return route.via in self.dead or route.target in self.down

    def _step(self, p: Pending) -> bool:
        """Move to the next route; False when there is none left."""
        if p.route_i + 1 < len(p.routes):
            p.route_i += 1
            return True
        if p.cycle and any(not self._unusable(r) for r in p.routes):
            p.route_i = 0
            return True
        return False

    def _advance(self, p: Pending, now: float) -> None:
        for _ in range(len(p.routes) + 1):
            if not self._step(p):
                break
            if not self._unusable(p.route):
                self.stats.reroutes += 1
                self._note(NoteKind.REROUTE if p.route.kind != DIRECT else NoteKind.ESCALATE, p.peer,
                           f"{p.route.kind} via {p.route.via}")
                if p.route.kind == FLOOD and self._unheard_since_reported(p.route.target):
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
        self._note(NoteKind.UNDELIVERABLE, p.peer, f"chunk {p.chunk}")

    def _due(self, p: Pending) -> float:
        if p.held:
            return float("inf")
        if self.away and not self.away.isdisjoint((p.peer, p.route.via, p.route.target)):
            return float("inf")  # its Will explains the silence: wait for it (peer_back)
        if p.route.kind != DIRECT:
            # A relayed unit crosses two links (a flood more, but its timeout is long).
            start = max(p.sent_at, self.progress.get(p.route.hop_key, p.sent_at))
            return start + p.timeout + self._transmit(p.route.via, 2 * p.size)
        silent = self._silent_at(p)
        drain = self._drain(p)
        if self._may_retransmit(p):
            # Half an RTO (doubled by every resend, adaptive) after the link last showed life
            # and drained what is queued up to this unit: the resend's ACK can still come
            # before the peer counts as silent.
            heard = max(p.sent_at, self.last_heard.get(p.route.target, p.sent_at), self._queued_evidence(p))
            resend = heard + drain + p.timeout / 2 * self._backoff(p)
            return min(silent, resend)
        return min(silent, max(p.sent_at, self._queued_evidence(p)) + drain + p.timeout)

    def _drain(self, p: Pending) -> float:
        """Transmission time of the bytes unACKed on ``p``'s direct link up to ``p`` itself."""
        return self._transmit(p.route.target, self._ahead_bytes(p))

    def _ahead_bytes(self, p: Pending) -> int:
        # Every timer computation asks this for every unit: computed once per change of the
        # pending set (a send bumps send_seq; an ACK or a give-up shrinks it).
        version = (self.send_seq, len(self.pending))
        if self._ahead_version != version:
            by_route: dict[Route, list[Pending]] = {}
            for q in self.pending.values():
                if q.route.kind == DIRECT:
                    by_route.setdefault(q.route, []).append(q)
            self._ahead = {}
            for units in by_route.values():
                total = 0
                for q in sorted(units, key=lambda u: u.seq):
                    total += q.size
                    self._ahead[q.key] = total
            self._ahead_version = version
        return self._ahead.get(p.key, p.size)

    def _transmit(self, peer: int, nbytes: int) -> float:
        if self.cfg.timeout_mode == "fixed":
            return 0.0
        return self.links.transmit_time(peer, nbytes)

    def _relay_wait(self, target: int) -> float:
        return self._rto(target) + self._transmit(target, self.unit_bytes)

    def _silent_at(self, p: Pending) -> float:
        """When the peer of a direct unit will have been silent for a whole RTO beyond the time
        the bytes queued towards it up to this unit need."""
        heard = max(self.last_heard.get(p.route.target, p.route_since),
                    self.progress.get(p.route.hop_key, p.route_since), self._queued_evidence(p))
        # Two resends back off (each waits for the one before), but not the verdict beyond
        # two RTOs of nothing at all: a child that ACKed one chunk of the broadcast and froze
        # kept its parent resending the next for eight RTOs (1.6 s) before it was reported.
        backoff = min(self._backoff(p), SILENCE_BACKOFF_CAP)
        return max(p.route_since, heard) + p.timeout * backoff + self._drain(p)

    def _backoff(self, p: Pending) -> float:
        """Exponential backoff of a unit resent on a live link (adaptive timeouts only: the
        fixed ones reproduce the thesis tables). The silence verdict backs off with it, so a
        resend still comes before it; a peer silent from the start gets one RTO."""
        return 1.0 if self.cfg.timeout_mode == "fixed" else float(2 ** p.retries)

    def _may_retransmit(self, p: Pending) -> bool:
        if p.retries >= MAX_RETRIES:
            return False
        # Only while the peer shows life: a silent peer gets its one RTO, then the backup.
        return self.last_heard.get(p.route.target, -1.0) >= p.route_since

    def _expire_pending(self, now: float) -> None:
        for p in sorted(self.pending.values(), key=self._due):
            if p.key not in self.pending or self._due(p) > now:
                continue
            route = p.route
            if route.kind == DIRECT and self._silent_at(p) > now:
                if self._may_retransmit(p):
                    self._retransmit(p, now)
                else:
                    # The peer lives but this unit never got through: this unit alone moves on.
                    self.stats.timeouts += 1
                    self._advance(p, now)
                continue
            self.stats.timeouts += 1
            self._note(NoteKind.TIMEOUT, route.via if route.kind != FLOOD else route.target,
                       f"chunk {p.chunk} {'broadcast' if p.broadcast else 'reduce'} {route.kind}")
            if route.kind == DIRECT:
                self._declare_dead(route.target, now)
            same = [q for q in self.pending.values() if q.route == route]
            for q in same:
                self._advance(q, now)

    def _declare_dead(self, peer: int, now: float) -> None:
        if self.cfg.remember_dead_links:
            self.links.mark_dead(peer)
        if peer in self.dead:
            return
        self.dead.add(peer)
        self.book.mark(peer, "failed")
        self._note(NoteKind.LINK_DEAD, peer)
        if now - self.heard_of.get(peer, -1e9) >= self._rto(peer):
            # Not a word from it, directly or relayed, for a whole timeout: evidence it is
            # silent (the fleet needs two such witnesses; a cut link has one).
            self._report_silent(peer, "link dead, nothing heard", now)

    def _heal(self, peer: int) -> None:
        """A round trip with ``peer`` worked: forget an earlier round's verdict on the link.
        A link declared dead in THIS round stays dead until the round ends."""
        was_dead = self.links.heal(peer)
        if peer in self.remembered_dead:
            self.remembered_dead.discard(peer)
            self.dead.discard(peer)
            self.book.healed(peer)
        if was_dead:
            self._note(NoteKind.LINK_HEALED, peer)

    def _flood(self, frame: Frame, exclude: int | None) -> None:
        for peer in self.neighbours:
            if peer != exclude and peer not in self.dead and peer not in self.down:
                self._send(peer, replace(frame, sender=self.node))

    def _ack(self, frame: Frame, how: str, now: float) -> None:
        if how == DIRECT and not self.over and self.result is None:
            # Batched (see the module docstring); frames on a link arrive in order.
            sender = frame.sender
            batch = self.ack_due.setdefault(sender, {}).setdefault(
                (frame.flags & Flag.BROADCAST, frame.contributors), [])
            if frame.chunk_index not in batch:
                batch.append(frame.chunk_index)
            if (frame.chunk_index == self.n - 1 or len(batch) >= ACK_EVERY
                    or len(frame.payload) >= ACK_AT_ONCE_BYTES):
                self._send_acks(sender)
            elif sender not in self.ack_at:
                self.ack_at[sender] = now + min(ACK_DELAY, self._rto(sender) / 4)
            return
        flags = (frame.flags & Flag.BROADCAST) | (Flag.FLOOD if how == FLOOD else Flag.NONE)
        ack = Frame(Kind.ACK, self.cfg.job, self.round, self.node, frame.chunk_index, self.n,
                    Flag(flags), origin=self.node, target=frame.origin,
                    contributors=frame.contributors)
        if how == FLOOD:
            self.seen_floods.add(self._flood_key(ack))
            self._flood(ack, exclude=None)
        else:
            self._send(frame.sender, ack)

    def _send_acks(self, sender: int | None = None) -> None:
        """Send the batched ACKs of ``sender`` (everybody's when None)."""
        for peer in [sender] if sender is not None else list(self.ack_due):
            self.ack_at.pop(peer, None)
            for (flags, ids), indices in self.ack_due.pop(peer, {}).items():
                ack = Frame(Kind.ACK, self.cfg.job, self.round, self.node, max(indices), self.n,
                            flags, origin=self.node, target=peer, contributors=ids)
                self._send(peer, ack.with_indices(sorted(indices)) if len(indices) > 1 else ack)

    def _nack_gaps(self, frame: Frame, have: object) -> None:
        broadcast = frame.is_broadcast
        missing = [i for i in range(frame.chunk_index)
                   if not have(i) and (frame.sender, broadcast, i) not in self.nacked]  # type: ignore[operator]
        if not missing:
            return
        self.nacked.update((frame.sender, broadcast, i) for i in missing)
        self.stats.nacks += 1
        self.book.mark(frame.sender, "suspected")
        self._note(NoteKind.NACK, frame.sender, f"{len(missing)} chunks")
        flags = Flag.BROADCAST if broadcast else Flag.NONE
        nack = Frame(Kind.NACK, self.cfg.job, self.round, self.node, 0, self.n, flags)
        self._send(frame.sender, nack.with_indices(missing))

    def _check_reduce_done(self, now: float) -> None:
        if self.reduce_done or not all(ch.first_sent for ch in self.chunks):
            return
        if any(not p.broadcast for p in self.pending.values()):
            return
        self.reduce_done = True
        if self.parent is None or self.pull_at is None:
            return
        clean = 2 * (self.links.round_time or 0.0)
        self.pull_at = min(self.pull_at, now + max(self.cfg.pull_timeouts * self._rto(self.parent), clean))

    def _pull_chain(self) -> list[int]:
        if self.parent is None:
            return []
        chain = [*self.tree.backups(self.node), *self.tree.ancestors(self.node)[1:], self.parent]
        return list(dict.fromkeys(chain))

    def _pull(self, now: float) -> None:
        missing = [j for j, ch in enumerate(self.chunks) if ch.final is None]
        live = [p for p in self.pull_chain if p not in self.down]
        if self.parent in self.down:
            # Our siblings wait for the same parent: its parent has the result (a sibling is
            # first only for a cut link of ours, with the parent alive).
            ancestors = self.tree.ancestors(self.node)
            live.sort(key=lambda p: p not in ancestors)
        if not missing or not live:
            self.pull_at = None
            return
        peer = live[self.pull_i % len(live)]
        self.pull_i += 1
        self._note(NoteKind.PULL, peer, f"{len(missing)} chunks")
        self._send_pull(peer, now)

    def _send_pull(self, peer: int, now: float) -> None:
        """Ask ``peer`` for the chunks whose result we lack; ask again after its RTO."""
        missing = [j for j, ch in enumerate(self.chunks) if ch.final is None]
        pull = Frame(Kind.PULL, self.cfg.job, self.round, self.node, 0, self.n, Flag.BROADCAST)
        self._send(peer, pull.with_indices([] if len(missing) == self.n else missing))
        self.stats.pulls += 1
        # A sibling's link carries nothing in a healthy round, so it is never measured: count
        # on our parent's (the same broker's round trip), not the initial timeout. Half a
        # second per sibling asked kept the children of a frozen parent waiting (issue 12).
        measured = self.links.is_measured(peer) or self.parent is None
        self.pull_at = now + self._rto(peer if measured else self.parent)

    # ------------------------------------------------------------------ helpers

    def _rto(self, peer: int | None) -> float:
        if self.cfg.timeout_mode == "fixed":
            return self.cfg.fixed_timeout
        return self.links.rto(-1 if peer is None else peer)

    def _frame(self, kind: Kind, j: int, flags: Flag, ids: frozenset[int], target: int = 0xFFFF) -> Frame:
        return Frame(kind, self.cfg.job, self.round, self.node, j, self.n, flags,
                     origin=self.node, target=target, model_hash=self.root_hash or 0,
                     contributors=ids)

    @staticmethod
    def _flood_key(frame: Frame) -> tuple[object, ...]:
        return (frame.kind, frame.is_broadcast, frame.origin, frame.target, frame.chunk_index,
                frame.contributors)

    def _finish(self, now: float, skip_missing: bool = False) -> None:
        values = np.empty(len(self.grad), dtype=np.float32)
        contributors: list[frozenset[int]] = []
        missing: list[int] = []
        for j, ch in enumerate(self.chunks):
            if ch.final is None and skip_missing:
                values[ch.lo : ch.hi] = 0.0
                contributors.append(frozenset())
            elif ch.final is not None:
                # Also when the root's mean lacks us (the fleet routed around us: our Will
                # came, our data never made it): the fleet's mean as it is, so our model stays
                # the fleet's. Adding our own value made it drift, and every flap of a
                # connection cost a state transfer the round after.
                values[ch.lo : ch.hi] = ch.final
                contributors.append(ch.final_ids)
            else:
                values[ch.lo : ch.hi] = self.grad[ch.lo : ch.hi]
                contributors.append(frozenset({self.node}))
                missing.append(j)
        # Members known down (a Will, or silent by the fleet's witnesses) are not waited for:
        # a round without them is complete, not degraded.
        # Nor are we, when the fleet went on without us (the root's report says what it missed).
        everyone = frozenset(self.tree.members) - self.down - {self.node}
        # (A result may count a member that went down after it sent its data: complete.)
        degraded = bool(missing) or any(not everyone <= c for c in contributors)
        if degraded:
            self._note(NoteKind.DEGRADED, None, f"{len(missing)} chunks missing")
        elif self.stats.timeouts == 0:
            self.links.observe_round(now - self.start_time)
        if self.root_hash is not None and self.root_hash != self.model_hash:
            self._note(NoteKind.DRIFT, self.tree.root, f"root {self.root_hash:#x} mine {self.model_hash:#x}")
        self.result = RoundResult(
            round=self.round, values=values, contributors=tuple(contributors),
            missing_chunks=tuple(missing), degraded=degraded, root_model_hash=self.root_hash,
            stats=self.stats, link_states=dict(self.book.states), finished_at=now,
        )
        self._send_acks()  # done here: nobody waits for our timer any more
        if skip_missing:
            # Who asked us for a chunk we now skip is told at once (it waits for nothing).
            for j, waiters in self.pull_waiters.items():
                if not contributors[j]:
                    for peer in waiters:
                        self.no_result_for.setdefault(peer, []).append(j)
            self._send_no_result()
