"""The agent core: everything one agent decides, written once, with no IO (sans-IO, like h11).

``AgentCore`` owns the per-node logic: the round machines keyed by round number (the current
one and the finished ones that still answer ACKs, NACKs and pulls), the bounded buffer of frames
of rounds not started yet, fetching the fleet's state (join, drift resync, catch-up, final
sync), membership and views, Last Wills fanned out to every live round machine, the linger
after the last round. Its parts, each with its own tests: the phases and their one transition
table (core_phase.py), what comes in (core_events.py, decoded by core_inbox.py), what goes out
(core_actions.py: every message as one ``Publish``), serving our state (state_server.py), the
suspicion book (suspicion.py), the chunk size and broadcast of a round (core_chunks.py) and
the round's report (core_report.py).

One entry point: ``handle(event, now) -> actions``. ``next_deadline()`` says when the core next
needs a ``Tick``. Every call takes ``now``; the core never reads a clock.

Two drivers execute the actions: ``agent/runtime.py`` (the agent users run: MQTT, the
monotonic clock, the model backend, checkpoint files) and ``simulate/virtual_fleet.py`` (N
cores on the in-memory bus in fake time, for tests and ``analyze fault-cost``). Neither makes a
protocol decision of its own.

State contract with the driver: between the ``ApplyUpdate`` of round r - 1 and the one of round
r, the driver's training state is the state at the start of round r. ``SendState`` is always
answered with that state, so it is executed in order with the other actions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import assert_never

import numpy as np

from agent.core_actions import (
    ApplyControl,
    ApplyUpdate,
    Channel,
    ComputeGradient,
    CoreAction,
    Displaced,
    LoadState,
    Publish,
    ReportRound,
    SaveCheckpoint,
    SendState,
)
from agent.core_chunks import ChunkPolicy
from agent.core_events import (
    Arriving,
    ControlSeen,
    CoreEvent,
    Disconnected,
    FaultInjected,
    FrameArrived,
    GradientReady,
    MessageArrived,
    PublishFailed,
    Reconnected,
    Sending,
    StatusSeen,
    SuspectSeen,
    Tick,
    ViewSeen,
)
from agent.core_gate import RoundGate
from agent.core_inbox import Inbox, LinkFrame
from agent.core_outbox import CoreOutbox
from agent.core_phase import Phase, Trigger, next_phase
from agent.core_report import Counters, RoundInProgress, RoundReport, telemetry_for
from agent.core_rounds import ANSWERING_ROUNDS, Rounds
from agent.protocol.allreduce import (
    AllreduceConfig,
    Fanout,
    Note,
    RoundContext,
    RoundMachine,
    RoundResult,
    Send,
    frame_size,
)
from agent.protocol.chunking import DownlinkRate
from agent.protocol.membership import (
    SUSPICION_RTTS,
    Membership,
    PublishView,
    StartupGate,
    view_tree,
)
from agent.protocol.messages import NodeState, Status, Suspect, View
from agent.protocol.notes import NoteKind
from agent.protocol.rounds import new_round
from agent.protocol.schedule import scheduled_lr
from agent.protocol.state_transfer import STATE_CHUNK_VALUES, resync_reason
from agent.protocol.topics import Topics
from agent.protocol.wire import Flag, Frame, Kind, RejectReason
from agent.state_fetch import StateFetch
from agent.state_server import StateServer
from agent.suspicion import SuspicionBook

__all__ = [
    "AgentCore", "ApplyControl", "ApplyUpdate", "Channel", "ComputeGradient", "CoreAction",
    "CoreConfig", "CoreEvent", "Counters", "Displaced", "LoadState", "Phase", "Publish",
    "ReportRound", "RoundReport", "SaveCheckpoint", "SendState", "telemetry_for",
]

CONNECT_WAIT = 10.0  # seconds to wait for our own retained status to come back from the broker


@dataclass(frozen=True)
class CoreConfig:
    node: int
    job: str = "default"
    arity: int = 2
    rounds: int = 0  # 0: until stopped
    allreduce: AllreduceConfig = field(default_factory=AllreduceConfig)
    state_size: int | None = None  # length of the training state (params + optimizer)
    expected_members: int = 0
    join_grace: float = 0.0
    lr: float = 0.001
    lr_schedule: str = "constant"
    lr_final: float = 0.1
    eval_every: int = 0
    checkpoint_every: int = 0  # 0: no checkpoints
    state_pull_timeout: float = 3.0  # a peer silent this long during a state transfer: next one
    suspicion_grace: float = 0.4  # a report about a silent node counts if unrefuted this long
    reconnect_hold: float = 3.0  # after a reconnect, statuses come back for this long: no verdicts
    offline_settle: float = 1.0  # a Will changes views this long after it came (broker shutdowns)
    linger: float = 0.0  # seconds to keep answering after the last round
    state_chunk_values: int = STATE_CHUNK_VALUES
    # As coordinator, cut the vector into smaller chunks for the fleet while our downlink is
    # slow (agent/protocol/chunking.py); off: every round uses allreduce.chunk_size.
    adapt_chunks: bool = True
    adapt_broadcast: bool = True


# A frame this many rounds ahead of ours means the fleet went on without us.
FUTURE_ROUNDS = 2


def _asks_for_what_we_sent(frame: Frame) -> bool:
    """A NACK asks for units we sent (not a FINAL one: that says a round has no result)."""
    return frame.kind == Kind.NACK and not frame.flags & Flag.FINAL


class AgentCore:
    def __init__(self, config: CoreConfig, incarnation: int, *, resumed_round: int | None = None,
                 pid: int = 0, now: float = 0.0) -> None:
        self.config = config
        self.node = config.node
        self.incarnation = incarnation
        self.pid = pid
        self.topics = Topics(config.job)
        self.job = config.allreduce.job
        self.links = config.allreduce.new_links()
        self.downlink = DownlinkRate()
        self.membership = Membership(config.node, config.arity, gate=StartupGate(
            config.expected_members, config.join_grace, now), grace=config.suspicion_grace,
            offline_settle=config.offline_settle)
        self.counters = Counters()
        self.book = SuspicionBook(config.node, incarnation)
        self.outbox = CoreOutbox(config.node, self.counters, self.book)
        self.inbox = Inbox(config.node, self.job, self.topics, self.counters, self.downlink)
        self.server = StateServer(config.node, self.job, config.state_size, config.state_chunk_values,
                                  self.counters.rejected)
        self.fetch = StateFetch(config.node, self.job, self.membership, self.outbox,
                                timeout=config.state_pull_timeout, size=config.state_size,
                                chunk_values=config.state_chunk_values)
        self.chunks = ChunkPolicy(config.allreduce, config.adapt_chunks, config.adapt_broadcast)
        self.rounds = Rounds(config.node, config.allreduce.algorithm, self.outbox)
        self.resumed = resumed_round is not None
        self.round = resumed_round or 0
        self.phase = Phase.CONNECTING
        self.phase_deadline: float | None = now + CONNECT_WAIT
        self.joining = False
        self.current: RoundInProgress | None = None
        self.pending_report: RoundReport | None = None  # held during FINAL_SYNC
        self.disconnected_at = -1e9
        self.connected = True  # to the broker (the transport tells us when it drops)
        self.steady_round: tuple[int, int] | None = None  # (round, epoch) last run cleanly here
        self.gate = RoundGate(config.node, self.membership, config.allreduce.round_deadline)

    # -- queries ----------------------------------------------------------------------------

    @property
    def machines(self) -> dict[int, RoundMachine]:
        return self.rounds.machines

    @property
    def done(self) -> bool:
        return self.config.rounds > 0 and self.round >= self.config.rounds

    def status(self, state: NodeState) -> Status:
        return Status(node=self.node, state=state, round=self.round, pid=self.pid,
                      incarnation=self.incarnation)

    def subscriptions(self) -> list[str]:
        fanout = [self.topics.all_fanout()] if self.chunks.listens_to_fanout() else []
        return [self.topics.links_to(self.node), self.topics.all_status(), self.topics.all_views(),
                self.topics.control, self.topics.all_suspect(), *fanout]

    def next_deadline(self) -> float | None:
        times = self.rounds.deadlines()
        if (transfer := self.fetch.transfer) is not None and (t := transfer.next_timer()) is not None:
            times.append(t)
        if self.phase_deadline is not None:
            times.append(self.phase_deadline)
        if self.phase == Phase.WAITING and self.membership.latest is None:
            gate = self.membership.gate
            times.append(gate.started_at + gate.join_grace)  # the start-up gate opens by time
        if self.phase == Phase.WAITING and self.gate.root_wait_until is not None:
            times.append(self.gate.root_wait_until)
        if (t := self.membership.next_check()) is not None:
            times.append(t)
        return min(times) if times else None

    def state_frames(self, action: SendState, state: np.ndarray) -> list[Publish]:
        """The MODEL frames answering ``action`` with ``state`` (the driver's current state)."""
        return [self.outbox.frame(send.dst, send.frame) for send in self.server.frames(action, state)]

    # -- the one entry point ----------------------------------------------------------------

    def handle(self, event: CoreEvent, now: float) -> list[CoreAction]:
        """Everything that happens to the agent comes in here; what it decides comes out."""
        match event:
            case MessageArrived(topic, payload, arrival):
                return self._on_message(topic, payload, now, arrival)
            case FrameArrived(frame):
                self.counters.bytes_received += frame_size(frame)
                return self._on_frame(frame, now)
            case StatusSeen(status):
                return self._on_status(status, now)
            case ViewSeen(view, publisher):
                return self._on_view(view, now, publisher)
            case SuspectSeen(report):
                return self._on_suspect(report, now)
            case ControlSeen(control):
                return [ApplyControl(control)] if control.node == self.node else []
            case GradientReady():
                return self._on_gradient(event, now)
            case Tick():
                return self._on_tick(now)
            case Disconnected():
                return self._on_disconnect(now)
            case Reconnected():
                return self._on_reconnect(now)
            case Arriving(topic):
                sender = self.inbox.busy_sender(topic)
                return [] if sender is None else self._on_busy_link(sender, now)
            case Sending():
                return self._on_busy_link(None, now)
            case FaultInjected(peer, action):
                self.outbox.note(NoteKind.FAULT_INJECTED, peer, action)
                return []
            case PublishFailed():
                self.counters.rejected["publish_failed"] += 1
                return []
            case _:
                assert_never(event)

    def _go(self, trigger: Trigger) -> None:
        """The one place the phase changes: as the transition table says."""
        self.phase = next_phase(self.phase, trigger)

    # -- events -----------------------------------------------------------------------------

    def _on_message(self, topic: str, payload: bytes, now: float, arrival: float) -> list[CoreAction]:
        read = self.inbox.read(topic, payload, arrival)
        if read is None:
            return []
        if not isinstance(read, LinkFrame):
            return self.handle(read, now)
        if read.fanned and self.chunks.broadcast_in(self.membership.view_for(read.frame.round)) != "fanout":
            # A round whose result is relayed down the tree takes none from a fan-out.
            self.counters.rejected["fanout_in_tree_round"] += 1
            return []
        return self._on_frame(read.frame, now)

    def _on_frame(self, frame: Frame, now: float) -> list[CoreAction]:
        out: list[CoreAction] = []
        machine = self.rounds.get(frame.round)
        progress = frame.kind == Kind.PROBE and bool(frame.flags & Flag.PROGRESS)
        if progress:
            self.membership.peer_busy(frame.sender, now)  # a report about it waits behind that
        if frame.kind == Kind.MODEL_PULL:
            self.server.asked(frame)
            out += self._serve_pulls()
        elif frame.kind == Kind.MODEL:
            out += self.fetch.on_frame(frame, now, self.round)
        elif machine is not None:
            out += self.outbox.run(machine.on_frame(frame, now), frame.round)
        elif progress:
            out += self.rounds.progress(frame, now)
        elif frame.round >= self.round + FUTURE_ROUNDS:
            out += self.fetch.fell_behind(frame, now, self.round, not (self.joining or self.done))
        elif frame.round >= self.round and _asks_for_what_we_sent(frame):
            pass  # a round we have not started: we sent nothing of it (see _start_machine)
        elif frame.round >= self.round:
            if not self.rounds.buffer(frame):
                self.counters.rejected["buffer_full"] += 1
            out += self.rounds.fleet_went_on(frame, self.round, self.current.view if self.current else None, now)
        else:
            self.counters.rejected[RejectReason.STALE_ROUND.value] += 1
            probe = self.server.hint(frame, self.round, self.current is not None)
            out += [self.outbox.frame(frame.sender, probe)] if probe is not None else []
        return out + self._advance(now)

    def _on_busy_link(self, sender: int | None, now: float) -> list[CoreAction]:
        """A large message from ``sender`` is still arriving, piece by piece (our downlink is
        slow), or (None) what we published is still waiting to leave (our uplink is): the
        rounds under way hold their verdicts on silence (issue 19); the last round's
        broadcast may still drain."""
        self.membership.links_busy(now)
        return self.rounds.each(lambda m: m.arriving(sender, now))

    def _on_status(self, status: Status, now: float) -> list[CoreAction]:
        # A newer life of this node (even its Will: mosquitto publishes it when our own
        # reconnect takes the session from it) means we are the obsolete one.
        if status.node == self.node and status.incarnation > self.incarnation and self.phase != Phase.DONE:
            self._go(Trigger.DISPLACED)
            self.outbox.note(NoteKind.DISPLACED, self.node, f"by incarnation {status.incarnation}")
            return [Displaced(status.incarnation, status.pid)]
        peer = status.node
        was_down = self.membership.is_down(peer)
        was_reported = peer in self.membership.reports
        out: list[CoreAction] = self.outbox.views(self.membership.on_status(status, now))
        if was_reported and peer not in self.membership.reports:
            # It refuted a report of silence: what the machines held for the verdict goes.
            out += self.rounds.each(lambda m: m.peer_spoke(peer, now))
        back = was_down and not self.membership.is_down(peer)
        if back:
            # Back (restarted, resumed, rejoining): links found dead while it was away are
            # not evidence about the new life; do not route around it from the start.
            self.links.heal(peer)
        if self.phase == Phase.CONNECTING and self.membership.knows_incarnation(self.node, self.incarnation):
            out += self._connected(now)
        if status.state == "offline" and peer != self.node and self.membership.states.get(peer) == "offline":
            out += self.rounds.will(peer, status.incarnation, now)  # the broker's Last Will
        elif back:
            out += self.rounds.root_back(peer, status.incarnation, now)
        return out + self._advance(now)

    def _on_view(self, view: View, now: float, publisher: int | None) -> list[CoreAction]:
        if publisher is None:
            self.membership.on_view(view)
        elif why := self.membership.offer_view(view, publisher):
            self.counters.rejected[why] += 1
        return self._advance(now)

    def _on_disconnect(self, now: float) -> list[CoreAction]:
        """The broker is away: the round under way ends by its deadline, and no new round
        starts until we are back (alone, a node would race through rounds nobody else runs)."""
        self.connected = False
        self.disconnected_at = now
        # The broker may have published everybody's Will as it went down: none of that is
        # news about the peers until it is back and they could say otherwise.
        self.membership.hold(float("inf"))
        self.outbox.note(NoteKind.DISCONNECTED, None, "no new round until the broker is back")
        return []

    def _on_reconnect(self, now: float) -> list[CoreAction]:
        """The connection to the broker came back; the broker may have restarted and lost
        every retained status and the view. Say again who we are (the transport's birth
        message is the status of our start), the coordinator republishes its view, and
        nobody decides views or evictions from the partial picture for a while."""
        self.outbox.note(NoteKind.RECONNECTED, None, "statuses and view published again")
        self.connected = True
        self.membership.hold(now + self.config.reconnect_hold)
        out: list[CoreAction] = []
        if self.phase not in (Phase.CONNECTING, Phase.DONE):
            out.append(self._my_status())
        out += self.rounds.reconnected(self.round, now - self.disconnected_at, now)
        out += self.fetch.retry_now(now, self.round)
        latest = self.membership.latest
        if latest is not None and latest.coordinator == self.node and self.membership.coordinator() == self.node:
            out += self.outbox.views([PublishView(latest)])
        return out

    def _my_status(self) -> Publish:
        return Publish.status_of(self.status("joining" if self.joining else "online"))

    def _on_suspect(self, report: Suspect, now: float) -> list[CoreAction]:
        """A member reports a peer silent. Unrefuted for the grace, the report excuses the
        peer in that round; with enough witnesses the fleet routes around it at once, in
        every round machine still running, and the coordinator drops it."""
        if report.is_self_report:
            return self._on_absent(report.node, report.round, now)
        out: list[CoreAction] = self.outbox.views(self.membership.on_suspect(report, now))
        if report.peer == self.node:
            out += self._answer_suspicion(report)
        return out + self._apply_suspicions(now) + self._advance(now)

    def _answer_suspicion(self, report: Suspect) -> list[CoreAction]:
        """A report about us: we are alive, so refute it; absent from its round, say that too."""
        out: list[CoreAction] = []
        if self.phase == Phase.JOINING:
            # Joining, we run no round yet: nobody should wait for us in a view that lists us.
            out += self.outbox.absence(max(report.round, self.round), self.round)
        elif self.book.absent_in(report.round):
            # We take no part in that round (alive, catching up): say so again (that report
            # may have been lost), and refute the suspicion below all the same.
            out.append(Publish.suspect(self.book.absence_again()))
        if self.phase not in (Phase.CONNECTING, Phase.DONE) and self.book.refute_once(report.node, report.round):
            # We are not silent (cut links around us, a slow moment, or rejoining): say so at
            # once, also while lingering after our last round (the others may still be in it:
            # an unrefuted root there ends it for everybody). Membership ignores an "online"
            # from a node far behind the fleet.
            out.append(self._my_status())
        return out

    def _on_absent(self, peer: int, through: int, now: float) -> list[CoreAction]:
        """``peer`` takes no part in the rounds up to ``through`` (its self-report): route
        around it there at once, as for a Will, instead of waiting a timeout and a grace for
        a node that is alive (and would refute a suspicion) but not in those rounds."""
        if not self.book.peer_absent(peer, through):
            return []
        self.outbox.note(NoteKind.ABSENT, peer, f"takes no part in rounds up to {through}")
        return self.rounds.absent(peer, through, now) + self._advance(now)

    def _apply_suspicions(self, now: float) -> list[CoreAction]:
        out: list[CoreAction] = []
        for peer, rnd in self.book.to_excuse(self.membership.unrefuted(now), self.machines):
            out += self.outbox.run(self.machines[rnd].excuse(peer, now), rnd)
        for peer in self.book.newly_suspected(self.membership.suspected()):
            self.outbox.note(NoteKind.SUSPECTED, peer, "silent by the fleet's witnesses")
            out += self.rounds.each(partial(_peer_down, peer=peer, now=now))
        return out

    def _on_gradient(self, event: GradientReady, now: float) -> list[CoreAction]:
        current = self.current
        if self.phase != Phase.COMPUTING or current is None or event.round != self.round:
            return []  # a gradient for a round given up meanwhile
        if event.compute_seconds is not None:
            current.started = now - event.compute_seconds
        current.computed, current.loss, current.own_hash = now, event.loss, event.model_hash
        current.gradient = event.gradient
        current.bytes_sent, current.bytes_received = self.counters.bytes_sent, self.counters.bytes_received
        return self._start_machine(current, now, Trigger.GRADIENT_READY) + self._advance(now)

    def _start_machine(self, current: RoundInProgress, now: float, trigger: Trigger) -> list[CoreAction]:
        assert current.gradient is not None
        tree = view_tree(current.view)
        machine = new_round(RoundContext(self.chunks.config_for(current.view), tree, self.node, self.round,
                                         current.gradient, current.own_hash, self.links, now,
                                         irregular_start=self._irregular_start(current.view),
                                         own_link_rate=self.downlink.rate()))
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
        away = [(peer, not self.book.peer_absent_in(peer, self.round)) for peer in tree.members
                if peer != self.node and (self.membership.is_down(peer)
                                          or self.book.peer_absent_in(peer, self.round))]
        return self.rounds.start(self.round, machine, away, now)

    def _on_tick(self, now: float) -> list[CoreAction]:
        out = self.rounds.timers(now)
        out += self.fetch.tick(now, self.round)
        out += self.outbox.views(self.membership.check(now))
        out += self._apply_suspicions(now)
        if self.phase_deadline is not None and now >= self.phase_deadline:
            out += self._phase_expired(now)
        return out + self._advance(now)

    # -- what next --------------------------------------------------------------------------

    def _advance(self, now: float) -> list[CoreAction]:
        """Move through the phases as far as the facts allow (each step is one decision)."""
        out: list[CoreAction] = []
        for _ in range(8):  # every step changes the phase or returns; bounded to be safe
            before = self.phase
            if self.phase in (Phase.WAITING, Phase.COMPUTING, Phase.RUNNING) and self._evicted():
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
        peers = self.membership.online_peers(self.membership.live())
        transfer = self.fetch.transfer
        if peers and (transfer is None or transfer.round < self.round
                      or not set(transfer.peers) & set(peers)):
            # None yet, one for a round before the view's, or its peers are all gone.
            return self.fetch.fetch(self.round, peers, now, self.round)
        return []

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
            if (newer := self.membership.view_for(self.round)) is not view:
                view, root_down = newer, self.gate.dead_root_blocks(newer, now)
        if view is None:
            return out
        if self.node not in view.members:
            return out + self._rejoin()
        if root_down or not self.connected or self.gate.mostly_down(view):
            self.gate.hold(self.round, now)
            return out
        self.current = RoundInProgress(view=view, started=now, waited=self.gate.open(self.round, now))
        self._go(Trigger.ROUND_STARTS)
        self._forget_old_rounds()
        return [*out, *self._serve_pulls(), ComputeGradient(self.round, tuple(view.members))]

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

    def _evicted(self) -> bool:
        """The fleet went on without us (we hung and were taken for silent, or the Will
        took us out): whatever round we were in, it is not ours any more."""
        latest = self.membership.latest
        return not self.joining and latest is not None and self.node not in latest.members

    def _leave_and_rejoin(self, now: float) -> list[CoreAction]:
        out: list[CoreAction] = []
        if self.phase == Phase.RUNNING and self.current is not None:
            self.outbox.note(NoteKind.ABANDONED, None, "the fleet took us for silent")
            del self.machines[self.round]
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
        machine = self.machines[self.round]
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
        del self.machines[self.round]
        return self._start_machine(current, now, Trigger.VIEW_RESTARTS_ROUND)

    def _abandon(self, now: float) -> list[CoreAction]:
        """Give the round up: the fleet is ahead and its state is here. Still reported."""
        assert self.current is not None and self.fetch.received is not None
        self.outbox.note(NoteKind.ABANDONED, None, f"the fleet is at round {self.fetch.received[0]}")
        del self.machines[self.round]  # its timers must not pull or retry for it any more
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
        if result is not None and result.stats.implausible:
            self.counters.rejected["implausible_values"] += result.stats.implausible
        if result is not None and not result.degraded:
            self.steady_round = (self.round, current.view.epoch)
        self.current = None
        return current.report(self.round, result, self.outbox.take_notes(), self.counters, now)

    def _start_linger(self, now: float) -> list[CoreAction]:
        """After the last round, keep answering pulls and NACKs for a while: a peer whose
        broadcast got lost must not find the fleet gone and end its last round degraded."""
        self._go(Trigger.RUN_OVER)
        self.phase_deadline = now + self.config.linger
        return []

    # -- state ------------------------------------------------------------------------------

    def _request_resync(self, why: str, avoid: set[int], now: float) -> list[CoreAction]:
        started = self.current.started if self.current is not None else float("inf")
        return self.fetch.resync(why, avoid, now, self.round, started)

    def _serve_pulls(self) -> list[CoreAction]:
        return list(self.server.due(self.round, self.membership, lingering=self.phase == Phase.LINGERING,
                                    can_serve=not (self.joining or self.phase == Phase.CONNECTING)))


def _peer_down(machine: RoundMachine, *, peer: int, now: float) -> list[Send | Fanout | Note]:
    return machine.peer_down(peer, now)
