"""The steps of an agent core between its phases: what it does next as far as the facts allow.

``AgentCore`` (agent_core.py) hands each event to its handlers; after each event
``Steps.advance`` moves it through the phases, the first step of ``ADVANCE`` whose phase and
condition hold, every change of phase by the transition table (progress.py). The steps:
connecting, joining and rejoining, starting a round when a view covers it, finishing it (the
apply / abandon / resync decision: ``round_end``), the final sync and the linger after the
last round.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from agent.core.actions import (
    AnnounceState,
    ApplyUpdate,
    ComputeGradient,
    CoreAction,
    FleetFinished,
    LoadState,
    Publish,
    ReportRound,
    SaveCheckpoint,
)
from agent.core.events import GradientReady
from agent.core.parts import CoreParts
from agent.core.progress import Phase, Progress, Trigger
from agent.core.report import RoundInProgress, RoundReport
from agent.core.rounds import ANSWERING_ROUNDS
from agent.core.state_fetch import site_first
from agent.protocol.allreduce import RoundContext, RoundResult, chunk_bounds, take_refused
from agent.protocol.membership import LIVE_STATES, SUSPICION_RTTS, view_tree
from agent.protocol.messages import NodeState, View
from agent.protocol.notes import NoteKind
from agent.protocol.rounds import new_round
from agent.protocol.schedule import scheduled_lr
from agent.protocol.state_transfer import resync_reason


class RoundEnd(enum.Enum):
    """How the round under way ends, decided in one place (``round_end``)."""

    ABANDON = "abandon"  # the fleet is ahead and its state of a later round is here: give it up
    UNFINISHED = "unfinished"  # no result yet (a newer view may restart it on its tree)
    RESYNC = "resync"  # a fetched state of this round or before: install it, replay, then apply
    APPLY_AND_FETCH = "apply_and_fetch"  # our model differs from the fleet's: apply, fetch its state
    APPLY = "apply"


def round_end(round: int, received: int | None, result: RoundResult | None,
              own_hash: int) -> tuple[RoundEnd, str | None]:
    """How round ``round`` ends, with a fetched state of round ``received`` here (None: none)
    and the machine's ``result`` (None: not yet); with APPLY_AND_FETCH, why we differ."""
    if received is not None and received > round:
        return RoundEnd.ABANDON, None
    if result is None:
        return RoundEnd.UNFINISHED, None
    if received is not None:
        return RoundEnd.RESYNC, None
    why = resync_reason(result, own_hash)
    return (RoundEnd.APPLY, None) if why is None else (RoundEnd.APPLY_AND_FETCH, why)


class Steps:
    """The steps between the phases of an agent core, as far as the facts allow."""

    def __init__(self, parts: CoreParts, progress: Progress) -> None:
        self.parts = parts
        self.progress = progress

    # -- what next --------------------------------------------------------------------------

    def gradient_ready(self, event: GradientReady, now: float) -> list[CoreAction]:
        current, counters = self.progress.current, self.parts.counters
        if self.progress.phase != Phase.COMPUTING or current is None or event.round != self.progress.round:
            return []  # a gradient for a round given up meanwhile
        if event.compute_seconds is not None:
            current.started = now - event.compute_seconds
        current.computed, current.loss, current.own_hash = now, event.loss, event.model_hash
        current.gradient = event.gradient
        current.bytes_sent, current.bytes_received = counters.bytes_sent, counters.bytes_received
        return self.start_machine(current, now, Trigger.GRADIENT_READY) + self.advance(now)

    def start_machine(self, current: RoundInProgress, now: float, trigger: Trigger) -> list[CoreAction]:
        assert current.gradient is not None
        tree = view_tree(current.view)
        config = self.parts.chunks.config_for(current.view)
        influence = self.parts.norms.observe(self.progress.round, current.gradient,
                                       chunk_bounds(len(current.gradient), config.chunk_size))
        machine = new_round(RoundContext(config, tree, self.parts.node, self.progress.round,
                                         current.gradient, current.own_hash, self.parts.links, now,
                                         irregular_start=self._irregular_start(current.view),
                                         own_link_rate=self.parts.downlink.rate(), influence=influence,
                                         ledger=self.parts.ledger, plausibility=self.parts.plausibility))
        self.progress.go(trigger)
        # A refutation crosses the broker twice, like a frame and its ACK: on a slow broker
        # (a loaded gateway, the embedded one) give the suspect twice the round trip our
        # links show, with fixed timeouts too (1.5 s late refutations on a loaded host
        # evicted five healthy agents). Their RTO (the variance of 1 MB units' round trips
        # in it) and the initial guess for links never used (most of a root's) added
        # 0.1-0.2 s to every silent round at 15 agents: a refutation is one small message.
        rtt = max((r for p in tree.members if p != self.parts.node
                   and (r := self.parts.links.measured_rtt(p)) is not None), default=0.0)
        self.parts.membership.witnesses.grace = max(self.parts.config.suspicion_grace, SUSPICION_RTTS * rtt)
        away: list[tuple[int, bool]] = []
        for peer in tree.members:
            absent, later = self.parts.book.peer_absent_in(peer, self.progress.round), self._joins_later(peer)
            if peer != self.parts.node and (self.parts.membership.is_down(peer) or absent or later):
                away.append((peer, not (absent or later)))
        return self.parts.rounds.start(self.progress.round, machine, away, now)

    def _joins_later(self, peer: int) -> bool:
        """A member restarted before its Will removed it: it has no state to run our round
        with until the view that takes it in again (none yet, or one starting later).
        Waited for, it cost this round its whole deadline."""
        latest, membership = self.parts.membership.views.latest, self.parts.membership
        if peer == self.parts.node or membership.states.get(peer) not in LIVE_STATES:
            return False
        return peer in membership.admission.new_lives or (
            membership.states.get(peer) == "joining" and latest is not None and self.progress.round < latest.from_round)

    def advance(self, now: float) -> list[CoreAction]:
        """Move through the phases as far as the facts allow: the first step of ``ADVANCE``
        whose phase and condition hold, again while the phase changes."""
        if self.parts.membership.admission.refused is not None and self.progress.phase != Phase.DONE:
            self.progress.go(Trigger.REFUSED)
            return [self.parts.membership.admission.refused]
        out: list[CoreAction] = []
        for _ in range(8):  # every step changes the phase or returns; bounded to be safe
            before = self.progress.phase
            step = next((step for phases, holds, step in ADVANCE if before in phases and holds(self)), None)
            if step is not None:
                out += step(self, now)
            if self.progress.phase == before:
                break
        return out

    def connected(self, now: float) -> list[CoreAction]:
        latest = self.parts.membership.views.latest
        fresh_fleet = latest is None or (
            self.parts.node in latest.members and latest.from_round == self.progress.round == 0 and not self.progress.resumed)
        self.progress.deadline = None
        if fresh_fleet:
            self.progress.go(Trigger.FLEET_IS_NEW)
            return []
        self.progress.go(Trigger.FLEET_RUNS)
        return [self.my_status()]

    def phase_expired(self, now: float) -> list[CoreAction]:
        self.progress.deadline = None
        if self.progress.phase == Phase.CONNECTING:
            return self.connected(now)
        if self.progress.phase == Phase.FINAL_SYNC:
            self.parts.fetch.transfer = None
            return self._end_final_sync(now)
        if self.progress.phase == Phase.LINGERING:
            self.progress.go(Trigger.LINGER_OVER)
        elif self.progress.phase == Phase.JOINING and self.progress.done:
            # Rejoining after the fleet's last round and no peer answered: we are done too.
            self.parts.outbox.note(NoteKind.STATE_PULL_FAILED, None, f"final state of round {self.progress.round}")
            self.progress.go(Trigger.JOIN_GAVE_UP)
        return []

    def _step_joining(self, now: float) -> list[CoreAction]:
        latest = self.parts.membership.views.latest
        if latest is None or self.parts.node not in latest.members:
            return []
        # The view takes us from its from_round: a state of an earlier round (fetched before
        # this view came) would have us run rounds the fleet already finished, alone.
        self.progress.round = max(self.progress.round, latest.from_round)
        if self.parts.config.rounds > 0 and self.progress.round >= self.parts.config.rounds:
            # Taken back only after the fleet's last round (evicted near the end): no round is
            # left to run; take the fleet's final state from lingering peers, then finish.
            self.progress.round = self.parts.config.rounds
            if self.progress.deadline is None:
                # They linger only so long: without their state we finish with our own.
                self.progress.deadline = now + self.parts.config.allreduce.round_deadline
        if self.parts.fetch.received is not None:
            rnd, state = self.parts.fetch.received
            self.parts.fetch.received = None
            if rnd >= self.progress.round:
                self.progress.round = rnd
                self.parts.rounds.skip_to(rnd)
                self.parts.outbox.note(NoteKind.REJOIN, None, f"state of round {rnd}")
                self.progress.go(Trigger.STATE_INSTALLED)
                return [LoadState(rnd, state), self.my_status(), *self.serve_pulls()]
        peers = site_first(self.parts.node, self.parts.config.site, self.parts.membership.state_holders(), self.parts.membership)
        transfer = self.parts.fetch.transfer
        if peers and self.parts.fetch.retry is None and (transfer is None or transfer.round < self.progress.round
                                                   or not set(transfer.peers) & set(peers)):
            # None yet, one for a round before the view's, or its peers are all gone.
            return self.parts.fetch.fetch(self.progress.round, peers, now, self.progress.round, since=self.progress.round_known_at)
        return []

    def _fleet_is_over(self) -> bool:
        """Every other member of the newest view ran the last round, and we are short of
        it by more than the round under way (whose end the final sync covers): cut off or
        hung while the fleet finished, nothing is left for us to run or to fetch."""
        latest = self.parts.membership.views.latest
        return (latest is not None and self.progress.round < self.parts.config.rounds - 1
                and self.parts.membership.finished(self.parts.config.rounds, latest.members))

    def _fleet_finished(self, now: float) -> list[CoreAction]:
        """The fleet ended while we were away: no state will come, no view will take us."""
        latest = self.parts.membership.views.latest
        members = latest.members if latest is not None else []
        self.parts.outbox.note(NoteKind.STATE_PULL_FAILED, None, f"the fleet finished its {self.parts.config.rounds} rounds")
        self.parts.fetch.transfer = None
        self.progress.current = None
        self.progress.go(Trigger.FLEET_FINISHED)
        return [FleetFinished(self.parts.config.rounds, tuple(members), self.progress.round)]

    def _step_waiting(self, now: float) -> list[CoreAction]:
        out: list[CoreAction] = self._install_fleet_state()
        if self.progress.done:
            return out + self._start_linger(now)
        view = self.parts.membership.views.view_for(self.progress.round)
        root_down = self.parts.gate.dead_root_blocks(view, now)
        if not root_down:
            # Not while a dead root blocks this round: nobody can have run it on that tree,
            # so the coordinator's view without the root may still apply from it (it counts
            # from the rounds we ran); before, that view came for the round after and this
            # one waited the whole root wait (5 s) on every member.
            out += self.parts.outbox.views(self.parts.membership.round_started(self.progress.round, now))
            out += self._choose_chunks()
            out += self._choose_period()
            if (newer := self.parts.membership.views.view_for(self.progress.round)) is not view:
                view, root_down = newer, self.parts.gate.dead_root_blocks(newer, now)
        if view is None:
            return out
        if self.parts.node not in view.members:
            return out + self._rejoin()
        if root_down or not self.parts.broker.connected or self.parts.rounds.settling(now) or self.parts.gate.mostly_down(view):
            self.parts.gate.hold(self.progress.round, now)
            return out
        self.progress.current = RoundInProgress(view=view, started=now, waited=self.parts.gate.open(self.progress.round, now))
        self.progress.go(Trigger.ROUND_STARTS)
        self._forget_old_rounds()
        # The coordinator announces every round's state digest: what a joiner checks a
        # fetched state against (one peer's word, or its stripe's header, is not enough).
        announce = [AnnounceState(self.progress.round)] if self.parts.membership.coordinator() == self.parts.node else []
        steps = self.parts.period.started(self.progress.round, view)
        if self.parts.period.since == self.progress.round:
            self.parts.norms.forget()  # a new period's deltas are another size: bounds from old ones refused them
        return [*out, *announce, *self.serve_pulls(), ComputeGradient(self.progress.round, tuple(view.members), steps)]

    def _forget_old_rounds(self) -> None:
        self.parts.rounds.forget_before(self.progress.round)
        self.parts.server.forget_before(self.progress.round)
        # What was reported, excused or refuted for rounds long gone is kept no longer.
        self.parts.book.forget_before(self.progress.round - ANSWERING_ROUNDS - 2)
        self.parts.fetch.forget_before(self.progress.round)

    def _choose_chunks(self) -> list[CoreAction]:
        views, note = self.parts.chunks.choose(self.parts.node, self.parts.membership, self.parts.downlink)
        if note is not None:
            self.parts.outbox.notes.append(note)
        return self.parts.outbox.views(views)

    def _choose_period(self) -> list[CoreAction]:
        views, note = self.parts.period.choose(self.parts.node, self.parts.membership, self.progress.round)
        if note is not None:
            self.parts.outbox.notes.append(note)
        return self.parts.outbox.views(views)

    def _evicted(self) -> bool:
        """The fleet went on without us (we hung and were taken for silent, or the Will
        took us out): whatever round we were in, it is not ours any more."""
        latest = self.parts.membership.views.latest
        return not self.progress.joining and latest is not None and self.parts.node not in latest.members

    def _leave_and_rejoin(self, now: float) -> list[CoreAction]:
        out: list[CoreAction] = []
        if self.progress.phase == Phase.RUNNING and self.progress.current is not None:
            self.parts.outbox.note(NoteKind.ABANDONED, None, "the fleet took us for silent")
            del self.parts.rounds.machines[self.progress.round]
            out.append(ReportRound(self._report(None, now)))
        self.progress.current = None
        return out + self._rejoin()

    def _rejoin(self) -> list[CoreAction]:
        """The fleet went on without us (we hung, or were taken for silent): join it again
        through the join path, with its state, instead of running rounds nobody expects."""
        self.parts.outbox.note(NoteKind.REJOIN_NEEDED, None, f"not in the view of round {self.progress.round}")
        self.progress.go(Trigger.LEFT_OUT)
        latest = self.parts.membership.views.latest
        # Views before the one without us may still list us: nobody should wait for us there.
        absent = self.parts.outbox.absence(latest.from_round - 1, self.progress.round) if latest is not None else []
        return [self.my_status(), *absent]

    def _install_fleet_state(self) -> list[CoreAction]:
        """Between rounds: a state fetched because we fell behind replaces ours."""
        received = self.parts.fetch.take(self.progress.round)
        if received is None:
            return []
        rnd, state = received
        self.parts.outbox.note(NoteKind.RESYNC, None, f"caught up from round {self.progress.round} to {rnd}")
        self.progress.round = rnd
        self.parts.rounds.skip_to(rnd)
        # Our status at the fleet's round: a report of our silence we answered while far
        # behind was refuted by a status the membership ignores, and stood (we were routed
        # around, and the rounds waited on it, for the rest of the run: 1.8 s instead of 0.06 s
        # after a site cut healed).
        return [LoadState(rnd, state), self.my_status(), *self.serve_pulls()]

    def _step_running(self, now: float) -> list[CoreAction]:
        result = self.parts.rounds.machines[self.progress.round].result
        current, received = self.progress.current, self.parts.fetch.received
        end, why = round_end(self.progress.round, received[0] if received is not None else None, result,
                             current.own_hash if current is not None else 0)
        if end is RoundEnd.ABANDON:
            return self._abandon(now)
        if end is RoundEnd.UNFINISHED or result is None:
            return self._restart_on_new_view(now)
        return self._finish_round(result, end, why, now)

    def _restart_on_new_view(self, now: float) -> list[CoreAction]:
        """A newer view for the round under way (the old tree lost its root): run the round
        again on the new tree with the same gradient."""
        current = self.progress.current
        view = self.parts.membership.views.view_for(self.progress.round)
        if current is None or view is None or view.epoch <= current.view.epoch or self.parts.node not in view.members:
            return []
        self.parts.outbox.note(NoteKind.RESTARTED, None, f"view epoch {view.epoch} for round {self.progress.round}")
        current.view = view
        del self.parts.rounds.machines[self.progress.round]
        return self.start_machine(current, now, Trigger.VIEW_RESTARTS_ROUND)

    def _abandon(self, now: float) -> list[CoreAction]:
        """Give the round up: the fleet is ahead and its state is here. Still reported."""
        assert self.progress.current is not None and self.parts.fetch.received is not None
        self.parts.outbox.note(NoteKind.ABANDONED, None, f"the fleet is at round {self.parts.fetch.received[0]}")
        del self.parts.rounds.machines[self.progress.round]  # its timers must not pull or retry for it any more
        report = self._report(None, now)
        self.progress.go(Trigger.ROUND_ABANDONED)
        return [ReportRound(report)]

    def _finish_round(self, result: RoundResult, end: RoundEnd, why: str | None, now: float) -> list[CoreAction]:
        out: list[CoreAction] = []
        if end is RoundEnd.RESYNC and self.parts.fetch.received is not None:
            # The peer's state at the start of its round, the updates since again (none when
            # it is this round's), then this round's update.
            rnd, state = self.parts.fetch.received
            out += [LoadState(rnd, state), *self.parts.fetch.replay(rnd, self.progress.round)]
            self.parts.outbox.note(NoteKind.RESYNC, None, f"state of round {rnd}")
            self.parts.fetch.received = None
        elif end is RoundEnd.APPLY_AND_FETCH and why is not None:
            # Fetch the fleet's state for the next round, first from peers whose link worked
            # this round (a cut link would cost a pull timeout).
            broken = {p for p, s in result.link_states.items() if s in ("failed", "rerouted")}
            out += self.request_resync(why, broken, now)
        cfg = self.parts.config
        rate = scheduled_lr(cfg.lr, self.progress.round, cfg.rounds, cfg.lr_schedule, cfg.lr_final)
        out.append(ApplyUpdate(self.progress.round, result.values, rate))
        self.parts.fetch.record(self.progress.round, result.values, rate, fleets=not result.missing_chunks)
        report = self._report(result, now)
        self.progress.round += 1
        out += self.serve_pulls()
        if self.progress.done and self.parts.fetch.transfer is not None:
            self.progress.pending_report = report
            self.progress.go(Trigger.LAST_ROUND_NEEDS_STATE)
            self.progress.deadline = now + cfg.allreduce.round_deadline
            return out
        self.progress.go(Trigger.ROUND_FINISHED)
        return out + self._close_round(report)

    def _end_final_sync(self, now: float) -> list[CoreAction]:
        """The last round fell back to our own gradient: the fleet's final state, fetched from
        lingering peers, replaces ours (or the wait ran out)."""
        self.progress.deadline = None
        out = self._install_fleet_state()
        report, self.progress.pending_report = self.progress.pending_report, None
        self.progress.go(Trigger.FINAL_SYNC_ENDED)
        return out + (self._close_round(report) if report is not None else [])

    def _close_round(self, report: RoundReport) -> list[CoreAction]:
        out: list[CoreAction] = []
        every = self.parts.config.checkpoint_every
        if every > 0 and (self.progress.round % every == 0 or self.progress.done):
            out.append(SaveCheckpoint(self.progress.round, report.epoch))
        report.evaluate = self._evaluated(self.progress.round) or (self.parts.config.eval_every > 0 and self.progress.done)
        if self.parts.period.announce_due(self.progress.round):
            out.append(self.my_status())  # our step and sync times, for the coordinator's period
        return [*out, ReportRound(report)]

    def _irregular_start(self, view: View) -> bool:
        """Peers may start this round later than usual (see RoundContext.irregular_start)."""
        return self._evaluated(self.progress.round - 1) or self.progress.steady_round != (self.progress.round - 1, view.epoch)

    def _evaluated(self, round: int) -> bool:
        """Round ``round`` is followed by an evaluation of the test set (the fleet's agents
        share eval_every, so they all evaluate then)."""
        return self.parts.config.eval_every > 0 and round >= 0 and round % self.parts.config.eval_every == 0

    def _report(self, result: RoundResult | None, now: float) -> RoundReport:
        current = self.progress.current
        assert current is not None
        steps = self.parts.period.local_steps(current.view) or 1
        if (result is not None and current.computed and not self._evaluated(self.progress.round - 1)
                and current.view.from_round < self.progress.round):
            # Not after an evaluation or in a new view's first round: the members start apart
            # then, and the wait for the last of them is not the sync's time. Degraded rounds
            # count (with a straggler left out, every round is).
            self.parts.period.measured(current.computed - current.started, now - current.computed, steps)
        if result is not None and result.stats.implausible:
            self.parts.counters.rejected["implausible_values"] += result.stats.implausible
        if result is not None:
            self.parts.counters.rejected.update(take_refused(result.stats))  # those not taken per frame
        if result is not None and not result.degraded:
            self.progress.steady_round = (self.progress.round, current.view.epoch)
        self.progress.current = None
        report = current.report(self.progress.round, result, self.parts.outbox.take_notes(), self.parts.counters, now)
        report.local_steps = steps
        return report

    def _start_linger(self, now: float) -> list[CoreAction]:
        """After the last round, keep answering pulls and NACKs for a while: a peer whose
        broadcast got lost must not find the fleet gone and end its last round degraded."""
        self.progress.go(Trigger.RUN_OVER)
        self.progress.deadline = now + self.parts.config.linger
        return []

    def request_resync(self, why: str, avoid: set[int], now: float) -> list[CoreAction]:
        started = self.progress.current.started if self.progress.current is not None else float("inf")
        return self.parts.fetch.resync(why, avoid, now, self.progress.round, started)

    def serve_pulls(self) -> list[CoreAction]:
        """The states due to pullers, each after our digest of its round (announced once a
        round): its puller installs it only once the coordinator or a majority announced it."""
        out: list[CoreAction] = []
        for send in self.parts.server.due(self.progress.round, self.parts.membership, lingering=self.progress.phase == Phase.LINGERING,
                                    can_serve=self.progress.phase not in (Phase.JOINING, Phase.CONNECTING)):
            if send.round > self.parts.server.announced_round:
                out.append(AnnounceState(send.round))
            self.parts.ledger.settle(send.request.sender)
            out.append(send)
        return out

    def my_status(self) -> Publish:
        state: NodeState = "joining" if self.progress.joining else "online"
        return Publish.status_of(self.parts.status(state, self.progress.round))


def _always(steps: Steps) -> bool:
    return True


def _final_state_settled(steps: Steps) -> bool:
    """No transfer of the fleet's final state is under way any more (it came or failed)."""
    return steps.parts.fetch.transfer is None


Step = Callable[[Steps, float], list[CoreAction]]
P = Phase
# The steps in order, each with the phases it is taken in and the condition that picks it;
# the first that holds runs. Which trigger each fires is its own (a fact it finds).
ADVANCE: tuple[tuple[frozenset[Phase], Callable[[Steps], bool], Step], ...] = (
    (frozenset({P.JOINING, P.WAITING, P.COMPUTING, P.RUNNING, P.FINAL_SYNC}), Steps._fleet_is_over,
     Steps._fleet_finished),  # FLEET_FINISHED
    (frozenset({P.WAITING, P.COMPUTING, P.RUNNING}), Steps._evicted, Steps._leave_and_rejoin),  # LEFT_OUT
    (frozenset({P.JOINING}), _always, Steps._step_joining),  # STATE_INSTALLED
    (frozenset({P.WAITING}), _always, Steps._step_waiting),  # ROUND_STARTS, RUN_OVER, LEFT_OUT
    # ROUND_FINISHED, LAST_ROUND_NEEDS_STATE, ROUND_ABANDONED, VIEW_RESTARTS_ROUND (``round_end``)
    (frozenset({P.RUNNING}), _always, Steps._step_running),
    (frozenset({P.FINAL_SYNC}), _final_state_settled, Steps._end_final_sync),  # FINAL_SYNC_ENDED
)
del P
