"""The steps of an agent core between its phases: what it does next as far as the facts allow.

``AgentCore`` (agent/core.py) takes events in and hands each to its parts; after each event
``_advance`` moves it through the phases, every change of phase by the transition table
(core_phase.py). This half of the core holds those steps: connecting, joining and rejoining,
starting a round when a view covers it, finishing it (resync, update, report, checkpoint), the
final sync and the linger after the last round.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent.core_actions import (
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
from agent.core_chunks import ChunkPolicy
from agent.core_gate import RoundGate
from agent.core_outbox import CoreOutbox
from agent.core_period import PeriodPolicy
from agent.core_phase import Phase, Trigger, next_phase
from agent.core_report import Counters, RoundInProgress, RoundReport
from agent.core_rounds import ANSWERING_ROUNDS, Rounds
from agent.protocol.allreduce import RoundContext, RoundResult, chunk_bounds, take_refused
from agent.protocol.chunking import DownlinkRate
from agent.protocol.influence import NormHistory
from agent.protocol.membership import LIVE_STATES, SUSPICION_RTTS, Membership, view_tree
from agent.protocol.messages import NodeState, Status, View
from agent.protocol.notes import NoteKind
from agent.protocol.ps_ledger import ServerLedger
from agent.protocol.rounds import new_round
from agent.protocol.rto import LinkEstimators
from agent.protocol.schedule import scheduled_lr
from agent.protocol.state_transfer import resync_reason
from agent.state_fetch import StateFetch, site_first
from agent.state_server import StateServer
from agent.suspicion import SuspicionBook

if TYPE_CHECKING:
    from agent.core import CoreConfig


class RoundSteps:
    """The phase progression of ``AgentCore``; the attributes are the core's (set in its
    ``__init__``)."""

    config: CoreConfig
    node: int
    incarnation: int
    pid: int
    round: int
    phase: Phase
    phase_deadline: float | None
    joining: bool
    announced_round: int
    resumed: bool
    round_known_at: float  # when our first round was the fleet's (a checkpoint's: when written)
    connected: bool
    current: RoundInProgress | None
    pending_report: RoundReport | None
    steady_round: tuple[int, int] | None
    links: LinkEstimators
    norms: NormHistory
    ledger: ServerLedger
    downlink: DownlinkRate
    membership: Membership
    counters: Counters
    book: SuspicionBook
    outbox: CoreOutbox
    server: StateServer
    fetch: StateFetch
    chunks: ChunkPolicy
    period: PeriodPolicy
    rounds: Rounds
    gate: RoundGate

    @property
    def done(self) -> bool:
        return self.config.rounds > 0 and self.round >= self.config.rounds

    def status(self, state: NodeState) -> Status:
        model, timing = self.config.model, self.period.announced()
        return Status(node=self.node, state=state, round=self.round, pid=self.pid,
                      incarnation=self.incarnation, fingerprint=model.fingerprint, model=model.name,
                      params=model.params, labels=list(self.config.labels),
                      site=self.config.site, step_s=timing.step_s, sync_s=timing.sync_s)

    # -- what next --------------------------------------------------------------------------

    def _go(self, trigger: Trigger) -> None:
        """The one place the phase changes: as the transition table says."""
        self.phase = next_phase(self.phase, trigger)


    def _start_machine(self, current: RoundInProgress, now: float, trigger: Trigger) -> list[CoreAction]:
        assert current.gradient is not None
        tree = view_tree(current.view)
        config = self.chunks.config_for(current.view)
        influence = self.norms.observe(self.round, current.gradient,
                                       chunk_bounds(len(current.gradient), config.chunk_size))
        machine = new_round(RoundContext(config, tree, self.node, self.round,
                                         current.gradient, current.own_hash, self.links, now,
                                         irregular_start=self._irregular_start(current.view),
                                         own_link_rate=self.downlink.rate(), influence=influence,
                                         ledger=self.ledger))
        self._go(trigger)
        # A refutation crosses the broker twice, like a frame and its ACK: on a slow broker
        # (a loaded gateway, the embedded one) give the suspect twice the round trip our
        # links show, with fixed timeouts too (1.5 s late refutations on a loaded host
        # evicted five healthy agents). Their RTO (the variance of 1 MB units' round trips
        # in it) and the initial guess for links never used (most of a root's) added
        # 0.1-0.2 s to every silent round at 15 agents: a refutation is one small message.
        rtt = max((r for p in tree.members if p != self.node
                   and (r := self.links.measured_rtt(p)) is not None), default=0.0)
        self.membership.grace = max(self.config.suspicion_grace, SUSPICION_RTTS * rtt)
        away: list[tuple[int, bool]] = []
        for peer in tree.members:
            absent, later = self.book.peer_absent_in(peer, self.round), self._joins_later(peer)
            if peer != self.node and (self.membership.is_down(peer) or absent or later):
                away.append((peer, not (absent or later)))
        return self.rounds.start(self.round, machine, away, now)


    def _joins_later(self, peer: int) -> bool:
        """A member restarted before its Will removed it: it has no state to run our round
        with until the view that takes it in again (none yet, or one starting later).
        Waited for, it cost this round its whole deadline."""
        latest, membership = self.membership.latest, self.membership
        if peer == self.node or membership.states.get(peer) not in LIVE_STATES:
            return False
        return peer in membership.new_lives or (
            membership.states.get(peer) == "joining" and latest is not None and self.round < latest.from_round)


    def _advance(self, now: float) -> list[CoreAction]:
        """Move through the phases as far as the facts allow (each step is one decision)."""
        if self.membership.refused is not None and self.phase != Phase.DONE:
            self._go(Trigger.REFUSED)
            return [self.membership.refused]
        out: list[CoreAction] = []
        for _ in range(8):  # every step changes the phase or returns; bounded to be safe
            before = self.phase
            if self._fleet_is_over():
                out += self._fleet_finished()
            elif self.phase in (Phase.WAITING, Phase.COMPUTING, Phase.RUNNING) and self._evicted():
                out += self._leave_and_rejoin(now)
            elif self.phase == Phase.JOINING:
                out += self._step_joining(now)
            elif self.phase == Phase.WAITING:
                out += self._step_waiting(now)
            elif self.phase == Phase.RUNNING:
                out += self._step_running(now)
            elif self.phase == Phase.FINAL_SYNC and self.fetch.transfer is None:
                out += self._end_final_sync(now)
            if self.phase == before:
                break
        return out


    def _connected(self, now: float) -> list[CoreAction]:
        latest = self.membership.latest
        fresh_fleet = latest is None or (
            self.node in latest.members and latest.from_round == self.round == 0 and not self.resumed)
        self.phase_deadline = None
        if fresh_fleet:
            self._go(Trigger.FLEET_IS_NEW)
            return []
        self.joining = True
        self._go(Trigger.FLEET_RUNS)
        return [Publish.status_of(self.status("joining"))]


    def _phase_expired(self, now: float) -> list[CoreAction]:
        self.phase_deadline = None
        if self.phase == Phase.CONNECTING:
            return self._connected(now)
        if self.phase == Phase.FINAL_SYNC:
            self.fetch.transfer = None
            return self._end_final_sync(now)
        if self.phase == Phase.LINGERING:
            self._go(Trigger.LINGER_OVER)
        elif self.phase == Phase.JOINING and self.done:
            # Rejoining after the fleet's last round and no peer answered: we are done too.
            self.outbox.note(NoteKind.STATE_PULL_FAILED, None, f"final state of round {self.round}")
            self.joining = False
            self._go(Trigger.JOIN_GAVE_UP)
        return []


    def _step_joining(self, now: float) -> list[CoreAction]:
        latest = self.membership.latest
        if latest is None or self.node not in latest.members:
            return []
        # The view takes us from its from_round: a state of an earlier round (fetched before
        # this view came) would have us run rounds the fleet already finished, alone.
        self.round = max(self.round, latest.from_round)
        if self.config.rounds > 0 and self.round >= self.config.rounds:
            # Taken back only after the fleet's last round (evicted near the end): no round is
            # left to run; take the fleet's final state from lingering peers, then finish.
            self.round = self.config.rounds
            if self.phase_deadline is None:
                # They linger only so long: without their state we finish with our own.
                self.phase_deadline = now + self.config.allreduce.round_deadline
        if self.fetch.received is not None:
            rnd, state = self.fetch.received
            self.fetch.received = None
            if rnd >= self.round:
                self.round, self.joining = rnd, False
                self.rounds.skip_to(rnd)
                self.outbox.note(NoteKind.REJOIN, None, f"state of round {rnd}")
                self._go(Trigger.STATE_INSTALLED)
                return [LoadState(rnd, state), Publish.status_of(self.status("online")), *self._serve_pulls()]
        peers = site_first(self.node, self.config.site, self.membership.state_holders(), self.membership)
        transfer = self.fetch.transfer
        if peers and self.fetch.retry is None and (transfer is None or transfer.round < self.round
                                                   or not set(transfer.peers) & set(peers)):
            # None yet, one for a round before the view's, or its peers are all gone.
            return self.fetch.fetch(self.round, peers, now, self.round, since=self.round_known_at)
        return []


    def _fleet_is_over(self) -> bool:
        """Every other member of the newest view ran the last round, and we are short of
        it by more than the round under way (whose end the final sync covers): cut off or
        hung while the fleet finished, nothing is left for us to run or to fetch."""
        latest = self.membership.latest
        return (self.phase in (Phase.JOINING, Phase.WAITING, Phase.COMPUTING, Phase.RUNNING, Phase.FINAL_SYNC)
                and latest is not None and self.round < self.config.rounds - 1
                and self.membership.finished(self.config.rounds, latest.members))

    def _fleet_finished(self) -> list[CoreAction]:
        """The fleet ended while we were away: no state will come, no view will take us."""
        members = self.membership.latest.members if self.membership.latest is not None else []
        self.outbox.note(NoteKind.STATE_PULL_FAILED, None, f"the fleet finished its {self.config.rounds} rounds")
        self.joining = False
        self.fetch.transfer = None
        self.current = None
        self._go(Trigger.FLEET_FINISHED)
        return [FleetFinished(self.config.rounds, tuple(members), self.round)]


    def _step_waiting(self, now: float) -> list[CoreAction]:
        out: list[CoreAction] = self._install_fleet_state()
        if self.done:
            return out + self._start_linger(now)
        view = self.membership.view_for(self.round)
        root_down = self.gate.dead_root_blocks(view, now)
        if not root_down:
            # Not while a dead root blocks this round: nobody can have run it on that tree,
            # so the coordinator's view without the root may still apply from it (it counts
            # from the rounds we ran); before, that view came for the round after and this
            # one waited the whole root wait (5 s) on every member.
            out += self.outbox.views(self.membership.round_started(self.round, now))
            out += self._choose_chunks()
            out += self._choose_period()
            if (newer := self.membership.view_for(self.round)) is not view:
                view, root_down = newer, self.gate.dead_root_blocks(newer, now)
        if view is None:
            return out
        if self.node not in view.members:
            return out + self._rejoin()
        if root_down or not self.connected or self.rounds.settling(now) or self.gate.mostly_down(view):
            self.gate.hold(self.round, now)
            return out
        self.current = RoundInProgress(view=view, started=now, waited=self.gate.open(self.round, now))
        self._go(Trigger.ROUND_STARTS)
        self._forget_old_rounds()
        # The coordinator announces every round's state digest: what a joiner checks a
        # fetched state against (one peer's word, or its stripe's header, is not enough).
        announce = [AnnounceState(self.round)] if self.membership.coordinator() == self.node else []
        steps = self.period.started(self.round, view)
        if self.period.since == self.round:
            self.norms.forget()  # a new period's deltas are another size: bounds from old ones refused them
        return [*out, *announce, *self._serve_pulls(), ComputeGradient(self.round, tuple(view.members), steps)]


    def _forget_old_rounds(self) -> None:
        self.rounds.forget_before(self.round)
        self.server.forget_before(self.round)
        # What was reported, excused or refuted for rounds long gone is kept no longer.
        self.book.forget_before(self.round - ANSWERING_ROUNDS - 2)
        self.fetch.forget_before(self.round)


    def _choose_chunks(self) -> list[CoreAction]:
        views, note = self.chunks.choose(self.node, self.membership, self.downlink)
        if note is not None:
            self.outbox.notes.append(note)
        return self.outbox.views(views)


    def _choose_period(self) -> list[CoreAction]:
        views, note = self.period.choose(self.node, self.membership, self.round)
        if note is not None:
            self.outbox.notes.append(note)
        return self.outbox.views(views)


    def _evicted(self) -> bool:
        """The fleet went on without us (we hung and were taken for silent, or the Will
        took us out): whatever round we were in, it is not ours any more."""
        latest = self.membership.latest
        return not self.joining and latest is not None and self.node not in latest.members


    def _leave_and_rejoin(self, now: float) -> list[CoreAction]:
        out: list[CoreAction] = []
        if self.phase == Phase.RUNNING and self.current is not None:
            self.outbox.note(NoteKind.ABANDONED, None, "the fleet took us for silent")
            del self.rounds.machines[self.round]
            out.append(ReportRound(self._report(None, now)))
        self.current = None
        return out + self._rejoin()


    def _rejoin(self) -> list[CoreAction]:
        """The fleet went on without us (we hung, or were taken for silent): join it again
        through the join path, with its state, instead of running rounds nobody expects."""
        self.outbox.note(NoteKind.REJOIN_NEEDED, None, f"not in the view of round {self.round}")
        self.joining = True
        self._go(Trigger.LEFT_OUT)
        latest = self.membership.latest
        # Views before the one without us may still list us: nobody should wait for us there.
        absent = self.outbox.absence(latest.from_round - 1, self.round) if latest is not None else []
        return [Publish.status_of(self.status("joining")), *absent]


    def _install_fleet_state(self) -> list[CoreAction]:
        """Between rounds: a state fetched because we fell behind replaces ours."""
        received = self.fetch.take(self.round)
        if received is None:
            return []
        rnd, state = received
        self.outbox.note(NoteKind.RESYNC, None, f"caught up from round {self.round} to {rnd}")
        self.round = rnd
        self.rounds.skip_to(rnd)
        return [LoadState(rnd, state), *self._serve_pulls()]


    def _step_running(self, now: float) -> list[CoreAction]:
        machine = self.rounds.machines[self.round]
        if self.fetch.received is not None and self.fetch.received[0] > self.round:
            return self._abandon(now)
        if machine.result is None:
            return self._restart_on_new_view(now)
        return self._finish_round(machine.result, now)


    def _restart_on_new_view(self, now: float) -> list[CoreAction]:
        """A newer view for the round under way (the old tree lost its root): run the round
        again on the new tree with the same gradient."""
        current = self.current
        view = self.membership.view_for(self.round)
        if current is None or view is None or view.epoch <= current.view.epoch or self.node not in view.members:
            return []
        self.outbox.note(NoteKind.RESTARTED, None, f"view epoch {view.epoch} for round {self.round}")
        current.view = view
        del self.rounds.machines[self.round]
        return self._start_machine(current, now, Trigger.VIEW_RESTARTS_ROUND)


    def _abandon(self, now: float) -> list[CoreAction]:
        """Give the round up: the fleet is ahead and its state is here. Still reported."""
        assert self.current is not None and self.fetch.received is not None
        self.outbox.note(NoteKind.ABANDONED, None, f"the fleet is at round {self.fetch.received[0]}")
        del self.rounds.machines[self.round]  # its timers must not pull or retry for it any more
        report = self._report(None, now)
        self._go(Trigger.ROUND_ABANDONED)
        return [ReportRound(report)]


    def _finish_round(self, result: RoundResult, now: float) -> list[CoreAction]:
        current = self.current
        assert current is not None
        out: list[CoreAction] = []
        if self.fetch.received is not None and self.fetch.received[0] <= self.round:
            # A resync: the peer's state at the start of its round, the updates since again
            # (none when it is this round's), then this round's update.
            rnd, state = self.fetch.received
            out += [LoadState(rnd, state), *self.fetch.replay(rnd, self.round)]
            self.outbox.note(NoteKind.RESYNC, None, f"state of round {rnd}")
            self.fetch.received = None
        elif (why := resync_reason(result, current.own_hash)) is not None:
            # Our model now differs from the fleet's: fetch its state for the next round, first
            # from peers whose link worked this round (a cut link would cost a pull timeout).
            broken = {p for p, s in result.link_states.items() if s in ("failed", "rerouted")}
            out += self._request_resync(why, broken, now)
        cfg = self.config
        rate = scheduled_lr(cfg.lr, self.round, cfg.rounds, cfg.lr_schedule, cfg.lr_final)
        out.append(ApplyUpdate(self.round, result.values, rate))
        self.fetch.record(self.round, result.values, rate, fleets=not result.missing_chunks)
        report = self._report(result, now)
        self.round += 1
        out += self._serve_pulls()
        if self.done and self.fetch.transfer is not None:
            self.pending_report = report
            self._go(Trigger.LAST_ROUND_NEEDS_STATE)
            self.phase_deadline = now + cfg.allreduce.round_deadline
            return out
        self._go(Trigger.ROUND_FINISHED)
        return out + self._close_round(report)


    def _end_final_sync(self, now: float) -> list[CoreAction]:
        """The last round fell back to our own gradient: the fleet's final state, fetched from
        lingering peers, replaces ours (or the wait ran out)."""
        self.phase_deadline = None
        out = self._install_fleet_state()
        report, self.pending_report = self.pending_report, None
        self._go(Trigger.FINAL_SYNC_ENDED)
        return out + (self._close_round(report) if report is not None else [])


    def _close_round(self, report: RoundReport) -> list[CoreAction]:
        out: list[CoreAction] = []
        every = self.config.checkpoint_every
        if every > 0 and (self.round % every == 0 or self.done):
            out.append(SaveCheckpoint(self.round, report.epoch))
        report.evaluate = self._evaluated(self.round) or (self.config.eval_every > 0 and self.done)
        if self.period.announce_due(self.round):
            out.append(self._my_status())  # our step and sync times, for the coordinator's period
        return [*out, ReportRound(report)]


    def _irregular_start(self, view: View) -> bool:
        """Peers may start this round later than usual (see RoundContext.irregular_start)."""
        return self._evaluated(self.round - 1) or self.steady_round != (self.round - 1, view.epoch)


    def _evaluated(self, round: int) -> bool:
        """Round ``round`` is followed by an evaluation of the test set (the fleet's agents
        share eval_every, so they all evaluate then)."""
        return self.config.eval_every > 0 and round >= 0 and round % self.config.eval_every == 0


    def _report(self, result: RoundResult | None, now: float) -> RoundReport:
        current = self.current
        assert current is not None
        steps = self.period.local_steps(current.view) or 1
        if (result is not None and current.computed and not self._evaluated(self.round - 1)
                and current.view.from_round < self.round):
            # Not after an evaluation or in a new view's first round: the members start apart
            # then, and the wait for the last of them is not the sync's time. Degraded rounds
            # count (with a straggler left out, every round is).
            self.period.measured(current.computed - current.started, now - current.computed, steps)
        if result is not None and result.stats.implausible:
            self.counters.rejected["implausible_values"] += result.stats.implausible
        if result is not None:
            self.counters.rejected.update(take_refused(result.stats))  # those not taken per frame
        if result is not None and not result.degraded:
            self.steady_round = (self.round, current.view.epoch)
        self.current = None
        report = current.report(self.round, result, self.outbox.take_notes(), self.counters, now)
        report.local_steps = steps
        return report


    def _start_linger(self, now: float) -> list[CoreAction]:
        """After the last round, keep answering pulls and NACKs for a while: a peer whose
        broadcast got lost must not find the fleet gone and end its last round degraded."""
        self._go(Trigger.RUN_OVER)
        self.phase_deadline = now + self.config.linger
        return []


    def _request_resync(self, why: str, avoid: set[int], now: float) -> list[CoreAction]:
        started = self.current.started if self.current is not None else float("inf")
        return self.fetch.resync(why, avoid, now, self.round, started)


    def _serve_pulls(self) -> list[CoreAction]:
        """The states due to pullers, each after our digest of its round (announced once a
        round): its puller installs it only once the coordinator or a majority announced it."""
        out: list[CoreAction] = []
        for send in self.server.due(self.round, self.membership, lingering=self.phase == Phase.LINGERING,
                                    can_serve=not (self.joining or self.phase == Phase.CONNECTING)):
            if send.round > self.announced_round:
                out.append(AnnounceState(send.round))
            self.ledger.settle(send.request.sender)
            out.append(send)
        return out

    def _my_status(self) -> Publish:
        return Publish.status_of(self.status("joining" if self.joining else "online"))

