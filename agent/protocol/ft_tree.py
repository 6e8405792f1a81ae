"""The fault-tolerant tree allreduce (FT-tree) of one round, on one node: the round machine.

Reduce: every node sends, chunk by chunk, the mean and contributor set of its subtree to its
parent as soon as chunk j of every child subtree is covered; later arrivals follow as separate
disjoint units ("supplements"). Broadcast: the root sends the final mean down, relayed down the
tree or fanned out; a chunk a member misses is pulled.

The machine holds the round's state (ft_state.py: two enums and their transition table) and
hands each event to the piece whose job it is. Every piece reads the round's context from one
``RoundScope`` (ft_scope.py) and writes its frames and notes to that scope's outbox:

- ``ChunkReducer`` (ft_reducer.py): contributor sets, merge, plausibility; ``Uplink``
  (ft_uplink.py): what goes up to the parent, in which format, by which routes;
- ``Courier`` (ft_courier.py): reliable delivery of units (ACKs in, resends, reroutes, dead
  links), reporting Delivered / Undeliverable / PeerSilent events; ``Receipts``
  (ft_receipts.py): ACKs and NACKs of what we receive; ``Relay`` (ft_relay.py): frames
  passing through;
- ``PeerWatch`` (ft_watch.py): silence detection and busy links; ``ContributionWait``
  (ft_wait.py): how long to wait for the subtree;
- ``ResultFlow`` (ft_result.py): the result's arrival and what to apply; ``ResultBook`` and the
  tree and fan-out ``BroadcastStrategy`` (ft_broadcast.py); ``ResultPull`` (ft_pull.py).

Wire formats (``wire_auto``, agent option ``wire_dtype = "auto"``): a unit going up is sent in
the narrowest of the format its link fits (``wire_choice.choose`` from the link's typical rate
and the round's budget), the format our own link fits (``choose_for_own_link``, from our
downlink's arrival rate) and the formats of the units of that chunk it merged (its
children's), so a slow link anywhere below narrows every frame above it. The root quantizes
each chunk of the result once, in the narrowest format that went into that chunk, and
everybody passes exactly those bytes on. The root's own links to its children do not narrow
the result: their rates come from the broadcast's ACKs, and the root sends each result chunk
to all its children at once, so each child's sample shows a share of the root's uplink (on a
loaded host's loopback that alone made the result float16 in 13 of 30 rounds); a slow link of
the root shows in its children's units, which cross the same connection. Without
``wire_auto`` every frame is in ``wire_dtype``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from agent.protocol.allreduce import (
    DEADLINE_STRETCH,
    DOWNLINK_BUSY_HOLD,
    ROOT_RETURN_MARGIN,
    ROOT_WILL_GRACE,
    Action,
    AllreduceConfig,
    RoundContext,
    RoundResult,
    RoundStats,
    frame_size,
)
from agent.protocol.answer_budget import asked_indices
from agent.protocol.ft_audit import UnitAuditor
from agent.protocol.ft_broadcast import BroadcastStrategy, FanoutBroadcast, ResultBook, ResultChunk
from agent.protocol.ft_courier import Courier, CourierEvent, Delivered, PeerSilent, Undeliverable
from agent.protocol.ft_pull import PullAnswer, ResultPull
from agent.protocol.ft_receipts import Receipts
from agent.protocol.ft_reducer import ChunkReducer, Offer, peak
from agent.protocol.ft_relay import Relay
from agent.protocol.ft_result import ResultFlow
from agent.protocol.ft_scope import Hop, RoundScope, UnitSource, unit_source
from agent.protocol.ft_state import Gather, RoundState, Trigger
from agent.protocol.ft_uplink import Uplink
from agent.protocol.ft_wait import ContributionWait
from agent.protocol.ft_watch import PeerWatch
from agent.protocol.influence import Influence, bound_unit
from agent.protocol.notes import NoteKind
from agent.protocol.plausibility import Evidence
from agent.protocol.wire import Flag, Frame, Kind, RejectReason

_T = TypeVar("_T")


def weak_method(method: Callable[..., _T]) -> Callable[..., _T | None]:
    """``method`` called through a weak reference to its object (None once it is gone)."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> _T | None:
        bound = ref()
        return None if bound is None else bound(*args)

    return call


def weak_check(method: Callable[[np.ndarray, int], bool]) -> Callable[[np.ndarray, int], bool]:
    """``weak_method`` for a check: False once the object is gone."""
    call = weak_method(method)

    def check(values: np.ndarray, sender: int) -> bool:
        return bool(call(values, sender))

    return check


class FtTreeRound:
    def __init__(self, ctx: RoundContext) -> None:
        self.scope = scope = RoundScope(ctx)
        self.tree = ctx.tree
        self.state = RoundState()
        self.result: RoundResult | None = None
        self.watch = PeerWatch(scope)
        self.relay = Relay(scope, self.watch)
        self.receipts = Receipts(scope, self.relay)
        # Weak callbacks: the parts must not hold the machine in a cycle. A dropped round's
        # machine is then freed at once, not at the next full collection (its vectors were
        # ~3 MB a round kept alive on a coordinator).
        self.courier = Courier(scope, self.watch, self.relay, weak_method(self._on_courier_event))
        self.reducer = ChunkReducer(scope.n, peak(ctx.gradient), passes_up=scope.parent is not None)
        self.uplink = Uplink(scope, self.reducer, self.courier)
        self.auditor = UnitAuditor(scope)
        self.wait = ContributionWait(scope, self.watch, self.reducer)
        self.results = ResultBook(scope, self.courier)
        self.pull = ResultPull(scope, self.results, self.courier)
        self.flow = ResultFlow(scope, self.results, FanoutBroadcast(scope, self.results, self.courier, self.receipts),
                               self.pull, self.receipts, self.reducer, weak_check(self._plausible))
        self.deadline = ctx.now + ctx.config.round_deadline
        self.deadline_limit = ctx.now + ctx.config.round_deadline * DEADLINE_STRETCH  # while links drain

    # ------------------------------------------------------------------ what the core reads

    @property
    def cfg(self) -> AllreduceConfig:
        return self.scope.cfg

    @cfg.setter
    def cfg(self, config: AllreduceConfig) -> None:
        self.scope.cfg = config

    @property
    def n(self) -> int:
        return self.scope.n

    @property
    def stats(self) -> RoundStats:
        return self.scope.stats

    @property
    def chunks(self) -> list[ResultChunk]:
        return self.results.chunks

    @property
    def own_link_rate(self) -> float | None:
        return self.scope.ctx.own_link_rate

    @property
    def down(self) -> set[int]:
        return self.scope.down

    @property
    def down_busy_at(self) -> float | None:
        return self.watch.down_busy_at

    @property
    def last_heard(self) -> dict[int, float]:
        return self.watch.last_heard

    @property
    def progress_from(self) -> dict[int, float]:
        return self.watch.progress_from

    @property
    def broadcast(self) -> BroadcastStrategy:
        return self.flow.broadcast

    # ------------------------------------------------------------------ events in

    def start(self, now: float) -> list[Action]:
        self.courier.probe_remembered_dead()
        self.uplink.start_beats(now)
        for j, (lo, hi) in enumerate(self.scope.bounds):
            self.reducer.accept(j, frozenset({self.scope.node}), self.scope.grad[lo:hi])
            self._try_forward(j, now)
        return self.scope.out.flush()

    def on_frame(self, frame: Frame, now: float) -> list[Action]:
        scope, courier = self.scope, self.courier
        scope.stats.frames_received += 1
        scope.stats.bytes_received += frame_size(frame)
        # The root's fan-out shows it is alive, not that its link to us works (a one-way cut of
        # it hid behind the fan-out: no verdict, and the drift resync leaned on it).
        # An audit copy is no word of its sender in this round: it leaves a grandchild with its
        # unit to its parent, and one cut off after it is to be watched as an orphan all the same.
        audit_copy = frame.is_audit_copy
        first = not audit_copy and self.watch.heard(frame, now, shows_link=not self.broadcast.fanned(frame))
        if courier.held_for and not courier.held_for.isdisjoint((frame.sender, frame.origin)):
            courier.release_held(frame.sender, now)
            courier.release_held(frame.origin, now)
        if frame.round != scope.round or frame.job != scope.cfg.job:
            scope.stats.dropped += 1
            return scope.out.flush()  # (floods released above)
        if not audit_copy:  # nor do its bytes pay for answers to its pulls (honest asks are padded)
            self.watch.paced(frame.sender, frame_size(frame), now)
            self.pull.earned(frame)
        if first:
            self.watch.first_frame(frame.sender, now)
        handler = _HANDLERS.get(frame.kind)
        if handler is None:
            scope.stats.dropped += 1
        else:
            handler(self, frame, now)
        return scope.out.flush()

    def on_timer(self, now: float) -> list[Action]:
        if self.state.over:
            return []
        if self._deadline_passed(now):
            return self.scope.out.flush()
        self.receipts.on_timer(now)
        if self.state.waiting and now >= self.wait.at:
            self.wait.at = self.wait.draining_until(now)
        if self.state.waiting and now >= self.wait.at:
            self._wait_over(now)
        self.watch.check_children(now, self._may_be_silent)
        if self.state.waiting and self.result is None:
            self.watch.check_quiet_children(now, self.wait.owes)
        self.watch.check_relay_targets(now)
        self.courier.expire(now)
        self.uplink.beat(now, self.result is not None)
        self.broadcast.on_timer(now)
        # Once the result is in (it may skip chunks), nothing is pulled: next_timer agrees.
        if self.result is None and self.pull.at is not None and now >= self.pull.at:
            hold = self.watch.drain_end()
            if hold is not None and hold > now:
                self.pull.at = hold  # the broadcast is under way: a pull would only add a copy
            elif self.pull.root_gone_at is not None:
                self._root_went_down(now)  # the parent did not answer: skip as the others did
            else:
                self.pull.pull(now)
        return self.scope.out.flush()

    def _deadline_passed(self, now: float) -> bool:
        """The hard deadline, put off while links drain (up to DEADLINE_STRETCH x the
        configured one); past it the round ends here with what it has."""
        configured = self.scope.start_time + self.scope.cfg.round_deadline
        if now >= self.deadline and self.watch.draining(now) and now < self.deadline_limit:
            if self.deadline <= configured:
                self.scope.out.note(NoteKind.DEADLINE_PUT_OFF, None, "links still draining")
            self.deadline = min(self.deadline_limit, now + DOWNLINK_BUSY_HOLD)
        if now < self.deadline:
            return False
        if self.state.waiting and self.deadline > configured:
            # A slow round whose wait for contributions went on while its links drained, and
            # they went quiet just now: what we have goes on (the root's result), not nothing.
            self._wait_over(now)
        self.courier.clear()
        if self.result is None:
            self._finish(now)
        self.state.fire(Trigger.DEADLINE)
        self.receipts.send_acks()
        return True

    def _wait_over(self, now: float) -> None:
        self.state.fire(Trigger.WAIT_OVER)
        for j in range(self.n):
            self._try_forward(j, now)

    def next_timer(self) -> float | None:
        """When ``on_timer`` has something to do: every check it runs is scheduled here, so
        the round does the same whatever else wakes it (the driver calls ``on_timer`` for any
        timer of the core)."""
        if self.state.over:
            return None
        times = [self.deadline]
        if self.state.waiting and not self._all_forwarded():
            times.append(self.wait.at)
        times.extend(at for c, at in self.watch.silence_at.items() if self._may_be_silent(c))
        if self.state.waiting and self.result is None:
            times.extend(self.watch.quiet_timers(self.wait.owes))
        if self.pull.at is not None and self.result is None:
            times.append(self.pull.at)
        if (due := self.courier.next_due()) is not None:
            times.append(due)
        times.extend(self.watch.relay_timers())
        if self.uplink.beat_at is not None and self.result is None:
            times.append(self.uplink.beat_at)
        times.extend(self.receipts.timers())
        times.extend(self.broadcast.timers())
        return min(times)

    def arriving(self, sender: int | None, now: float) -> list[Action]:
        if self.state.over or not self.scope.adaptive:
            return []
        self.watch.arriving(sender, now)
        return self.scope.out.flush()

    def peer_down(self, peer: int, now: float) -> list[Action]:
        """Membership says ``peer`` is offline: stop waiting for it, route around it."""
        scope = self.scope
        if peer == scope.node or peer in scope.down:
            return []
        scope.away.discard(peer)
        scope.down.add(peer)
        was_expected = peer in scope.expected
        scope.expected.discard(peer)
        if was_expected:
            self.watch.orphaned(peer, now)
        self.courier.peer_down(peer, now)
        for j in range(self.n):
            self._try_forward(j, now)
        if peer == scope.parent and self.result is None:
            self.uplink.resend_custody(now)
            if self.pull.at is not None:
                self.pull.at = now  # a silent parent will not broadcast: ask the others at once
        if peer == scope.tree.root and self.result is None:
            self._root_went_down(now)
        return scope.out.flush()

    def _root_went_down(self, now: float) -> None:
        if self.pull.root_down(now):
            self._finish(now, skip_missing=True)

    def reconnected(self, now: float, away: float = float("inf")) -> list[Action]:
        """Back after a dropped connection: send every unACKed unit again now, and ask for the
        round's result at once: the peers got our Will and may have finished without us (a
        peer that has the result answers, one that has not yet answers when it has it). The
        root, ``away`` long, goes on when the members still wait for it (they give a root's
        Will ``ROOT_WILL_GRACE``); else it ends the round, as they did on its Will."""
        scope = self.scope
        if self.state.over:
            return []
        self.courier.resend_all(now)
        self.broadcast.reconnected()
        if scope.parent is None and self.result is None and away <= ROOT_WILL_GRACE - ROOT_RETURN_MARGIN:
            scope.out.note(NoteKind.RECONNECTED, scope.node, f"back after {away * 1000:.0f} ms: the round goes on")
            self.uplink.ask_children_again()
        elif scope.parent is None and self.result is None:
            # Our Will ended this round on every other member (see peer_down), with the chunks
            # they lack skipped. Do the same rather than wait for children that went on.
            scope.out.note(NoteKind.ROOT_DOWN, scope.node, "our connection dropped")
            self._finish(now, skip_missing=True)
        elif self.result is None:
            for _ in range(min(2, len(self.pull.chain))):  # two: a peer ahead is one witness
                self.pull.pull(now)
            # A child that saw our Will sent around us: what it sent us before is no sign that
            # more is on its way (see ContributionWait.draining_until), and we wait for it only
            # as long as a first frame usually takes.
            self.wait.back_at = now
            self._stop_waiting_soon(now)
        return scope.out.flush()

    def peer_away(self, peer: int, now: float) -> list[Action]:
        self.scope.away.add(peer)
        return []

    def peer_back(self, peer: int, now: float) -> list[Action]:
        self.scope.away.discard(peer)
        if self.state.over or peer in self.scope.down:
            return []
        self.courier.resend_involving(peer, now)
        if peer == self.scope.parent and self.result is None:
            # Units its silence made us give up as undeliverable meanwhile, and what it had
            # ACKed if it lost them: once more (what it has is ACKed, not counted again).
            self.uplink.resend_custody(now)
        return self.scope.out.flush()

    def peer_spoke(self, peer: int, now: float) -> list[Action]:
        self.watch.refuted.add(peer)
        if not self.state.over:
            self.courier.release_held(peer, now)
        return self.scope.out.flush()

    def went_on(self, now: float) -> list[Action]:
        scope, parent = self.scope, self.scope.parent
        if self.state.over or self.result is not None or parent is None or parent in scope.down:
            return []
        if not scope.stats.pulls:
            # The parent only: it answers at once if it has the result, and sends it once if
            # we are one of its broadcast peers anyway (see ResultFlow).
            scope.out.note(NoteKind.PULL, parent, "the fleet may have gone on without us")
            self.pull.send_pull(parent, now)
        self.uplink.ask_children_again()
        self._stop_waiting_soon(now)
        return scope.out.flush()

    def excuse(self, peer: int, now: float, reported: float | None = None) -> list[Action]:
        """``reported``: when the first report of its silence came (the nodes under it are
        watched from then on, see ``orphan_start``)."""
        scope = self.scope
        heard = self.watch.heard_of.get(peer)
        if peer == scope.node or peer not in scope.expected or (
                heard is not None and (reported is None or heard >= reported)):
            return []  # it spoke since the fleet's first report: it lives
        scope.expected.discard(peer)
        self.watch.orphaned(peer, now, reported)
        for j in range(self.n):
            self._try_forward(j, now)
        return scope.out.flush()

    def _stop_waiting_soon(self, now: float) -> None:
        if self.state.waiting:
            self.wait.stop_soon(now)

    def _on_courier_event(self, event: CourierEvent) -> None:
        match event:
            case Delivered():
                pass  # the reduce's completion is checked once per ACK frame (see _on_ack)
            case Undeliverable(unit=p):
                self.scope.out.note(NoteKind.UNDELIVERABLE, p.peer, f"chunk {p.chunk}")
            case PeerSilent(peer=peer, why=why, at=at):
                self.watch.report_silent(peer, why, at)

    def _may_be_silent(self, child: int) -> bool:
        """Its silence time still matters: nothing heard of it, still waited for, and not
        counted in the result we have (its unit went around us: it is alive, only its link
        to us may not be)."""
        if child in self.watch.heard_of or child in self.scope.down or child not in self.scope.expected:
            return False
        counted = self.result is not None and all(child in c for c in self.result.contributors)
        return not counted

    # ------------------------------------------------------------------ reduce

    def _all_forwarded(self) -> bool:
        if self.scope.parent is None:
            return self.results.complete()
        return self.reducer.all_first_sent()

    def _try_forward(self, j: int, now: float) -> None:
        ready = not self.state.waiting or self.reducer.ready(j, self.scope.expected)
        if self.scope.parent is not None:
            self.uplink.forward(j, now, ready)
        elif not self.results.has(j) and ready and self.flow.finalize(j, now):
            self._complete(now)

    def _complete(self, now: float) -> None:
        """Every chunk has its result here."""
        if self.result is None:
            self.broadcast.completed(now)
            self._finish(now)

    def _on_contribution(self, frame: Frame, now: float, how: Hop) -> None:
        scope, j, ids = self.scope, frame.chunk_index, frame.contributors
        source = unit_source(scope.tree, scope.node, frame, how)
        if source is not UnitSource.BELOW:
            scope.stats.dropped += 1
            if source is UnitSource.OUTSIDE_SUBTREE:
                scope.stats.refused[RejectReason.CONTRIBUTORS_OUTSIDE_SUBTREE] += 1
            elif source is UnitSource.RELAY_NOT_A_BACKUP:
                scope.stats.refused[RejectReason.RELAY_NOT_A_BACKUP] += 1
            return
        self.receipts.ack(frame, how, now, batch=self.result is None)
        if how == Hop.DIRECT and (frame.origin in scope.down or self._skipped(j)):
            # Routed around (its Will came, say after a dropped connection) but running this
            # round: it does not know it was left out and would wait a timeout for a
            # broadcast that skips it. Or the round ended here without a result (root
            # down) before its data came. Its data is a pull: the result is the answer.
            self._answer(j, frame.origin, now)
            self.pull.send_no_result()
        self.results.learn_route(frame.origin, frame.sender, how)
        if scope.cfg.nack and how == Hop.DIRECT:
            self.receipts.nack_gaps(frame, lambda i: frame.origin in self.reducer.covered(i))
        if scope.parent is None and self.results.has(j):
            return  # too late for the final mean
        offer = self.reducer.classify(j, ids)
        if offer is Offer.OVERLAP:
            scope.stats.overlaps += 1
        if offer is not Offer.NEW:
            return  # a duplicate (lost ACK, resend) is ACKed, not counted
        values = self._bounded(j, frame.values(), frame.sender, frame.origin, ids)
        if values is not None:
            self.reducer.accept(j, ids, values, frame.dtype)
            self._try_forward(j, now)

    def _bounded(self, j: int, values: np.ndarray, sender: int, origin: int, ids: frozenset[int]) -> np.ndarray | None:
        """The values to count for a unit of chunk ``j``, held to the round's influence bound
        (counted and noted when beyond it). An implausible unit is refused; under a bound it
        counts with zero values, so nobody waits for its contributors (a device sending such
        units in every round made each round wait out its subtree: 150 degraded rounds). An
        inner child's own part beyond a member's bound leaves the bounded pieces, and a child
        found lying in several rounds is left out (ft_audit.py)."""
        bound, stats = self.scope.ctx.influence, self.scope.stats
        if not self._plausible(values, sender):
            if bound is not None and origin in ids:
                self.auditor.off(origin, Evidence.FAR)
            return None if bound is None else np.zeros(len(values), np.float32)
        if bound is None:
            return values
        audited = self.auditor.check(j, origin, ids, values)
        if audited is not None:
            return audited
        verdict, kept = bound_unit(values, j, bound)
        if verdict is not Influence.WITHIN:
            if origin in ids:  # its own values: on its record (a supplement holds its children's)
                self.auditor.off(origin, Evidence.FAR if verdict is Influence.REFUSED else Evidence.BEYOND)
            stats.refused[RejectReason.NORM_CLIPPED if verdict is Influence.CLIPPED else RejectReason.NORM_REFUSED] += 1
            self.scope.out.note(NoteKind.INFLUENCE_BOUNDED, sender, f"chunk {j} {verdict.value}: beyond {bound.limit(j):.3g}")
        return kept

    def _plausible(self, values: np.ndarray, sender: int) -> bool:
        """Implausible values (see ChunkReducer.plausible) are refused, counted and noted."""
        if self.reducer.plausible(values):
            return True
        self.scope.stats.implausible += 1
        self.scope.out.note(NoteKind.IMPLAUSIBLE, sender, f"values beyond {self.reducer.value_limit:.3g}")
        return False

    def _check_reduce_done(self, now: float) -> None:
        scope = self.scope
        if scope.parent is None or self.state.gather is Gather.DELIVERED or not self.uplink.delivered():
            return
        self.state.fire(Trigger.UP_DELIVERED)
        clean = 2 * (scope.links.round_time or 0.0)
        self.pull.soon(now + max(scope.cfg.pull_timeouts * scope.rto(scope.parent), clean))

    # ------------------------------------------------------------------ result

    def _skipped(self, j: int) -> bool:
        """The round ended here without a result for chunk ``j``."""
        return self.result is not None and not self.result.contributors[j]

    def _answer(self, j: int, peer: int, now: float) -> None:
        self.pull.answer(j, peer, now, skipped=self._skipped(j), over=self.state.over)

    def _finish(self, now: float, skip_missing: bool = False) -> None:
        self.result = result = self.flow.conclude(now, skip_missing)
        self.state.fire(Trigger.RESULT)
        self.receipts.send_acks()  # done here: nobody waits for our timer any more
        if skip_missing:
            self.pull.tell_skipped([j for j, c in enumerate(result.contributors) if not c])

    # ------------------------------------------------------------------ frames in

    def _on_data(self, frame: Frame, now: float, how: Hop) -> None:
        j = frame.chunk_index
        if j >= self.n or frame.chunk_count != self.n or frame.n_values != self.chunks[j].hi - self.chunks[j].lo:
            self.scope.stats.dropped += 1
            return
        if frame.is_audit_copy:
            self.auditor.on_copy(frame)
        elif frame.is_broadcast:
            if self.flow.on_final(frame, now, how, running=self.result is None):
                self._complete(now)
        else:
            self._on_contribution(frame, now, how)

    def _on_relay(self, frame: Frame, now: float) -> None:
        how = self.relay.on_relay(frame, now)
        if how is not None:
            self._on_data(frame, now, how)

    def _on_ack(self, frame: Frame, now: float) -> None:
        if frame.target != self.scope.node:
            self.relay.pass_ack(frame)
            return
        indices = frame.indices() if frame.payload else [frame.chunk_index]
        if len(indices) > self.n:
            self.scope.stats.dropped += 1
            return
        if frame.flags & Flag.AROUND:
            self._went_around(frame, set(indices), now)
            return
        self.broadcast.child_acked(frame, indices, now)
        self.courier.on_ack(frame, now)
        self._check_reduce_done(now)

    def _went_around(self, frame: Frame, said: set[int], now: float) -> None:
        """A child says what we asked it for went to another aggregator: when that is every
        chunk we lack of its units, we wait for them no more."""
        scope, child, ids = self.scope, frame.sender, frame.contributors
        if frame.origin != child or child not in scope.children or not ids or not ids <= scope.tree.subtree(child):
            scope.stats.dropped += 1
            return
        if {j for j in range(self.n) if not ids <= self.reducer.covered(j)} <= said:
            scope.expected -= ids
            for j in range(self.n):
                self._try_forward(j, now)

    def _on_nack(self, frame: Frame, now: float) -> None:
        if not frame.flags & Flag.FINAL:
            if not self.courier.resend_asked(frame, now):
                self.scope.stats.refused[RejectReason.NACK_BUDGET] += 1  # once per NACK
            self.uplink.tell_around(frame)
        elif self.pull.no_result_said(frame, running=self.result is None):
            self._finish(now, skip_missing=True)

    def _on_pull(self, frame: Frame, now: float) -> None:
        self.scope.out.note(NoteKind.PULL, frame.sender, "served")
        verdicts = {self.pull.answer(j, frame.sender, now, skipped=self._skipped(j), over=self.state.over, asked=True)
                    for j in asked_indices(frame) or range(self.n) if 0 <= j < self.n}
        for verdict, reason in _REFUSED_PULL.items():
            if verdict in verdicts:
                self.scope.stats.refused[reason] += 1  # once per pull
        self.pull.send_no_result()



_REFUSED_PULL = {PullAnswer.OVER_BUDGET: RejectReason.PULL_BUDGET, PullAnswer.UNPAID: RejectReason.PULL_UNPAID}


def _on_data_frame(machine: FtTreeRound, frame: Frame, now: float) -> None:
    machine._on_data(frame, now, Hop.DIRECT if frame.sender == frame.origin else Hop.RELAY)


_HANDLERS: dict[Kind, Callable[[FtTreeRound, Frame, float], None]] = {
    Kind.DATA: _on_data_frame, Kind.RELAY: FtTreeRound._on_relay, Kind.ACK: FtTreeRound._on_ack,
    Kind.NACK: FtTreeRound._on_nack, Kind.PULL: FtTreeRound._on_pull,
    Kind.PROBE: lambda machine, frame, now: machine.courier.on_probe(frame, now),
}
