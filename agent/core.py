"""The agent core: everything one agent decides, written once, with no IO (sans-IO, like h11).

``AgentCore`` takes every event in and hands it to its parts, each in its own module:

- core_events.py: what comes in, a closed union; core_inbox.py decodes and checks bytes;
- core_actions.py: what goes out; every message is one ``Publish`` (topic, retain, QoS);
- core_phase.py: the phases and their one transition table; core_steps.py: the steps between
  them (connect, join, start and finish a round, final sync, linger);
- core_rounds.py: the round machines in flight and the frames of rounds not started yet;
  core_wills.py: the grace a round gives its root's Will; core_gate.py: whether a round may
  start; core_chunks.py: a round's chunk size and broadcast; core_period.py: its local steps;
- state_server.py: serving our state; state_fetch.py: fetching the fleet's;
- suspicion.py: the suspicion book; core_outbox.py: frames, notes and reports of silence out;
- core_report.py: a round's report and telemetry.

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
    AnnounceState,
    ApplyControl,
    ApplyUpdate,
    Channel,
    ComputeGradient,
    CoreAction,
    Displaced,
    FleetFinished,
    LoadState,
    Publish,
    ReportRound,
    SaveCheckpoint,
    SendState,
)
from agent.core_chunks import ChunkPolicy
from agent.core_events import (
    Arriving,
    BridgeSeen,
    ControlSeen,
    CoreEvent,
    DigestSeen,
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
from agent.core_period import PeriodPolicy
from agent.core_phase import Phase, Trigger
from agent.core_report import Counters, RoundInProgress, RoundReport, telemetry_for
from agent.core_rounds import Rounds
from agent.core_steps import RoundSteps
from agent.protocol.allreduce import (
    AllreduceConfig,
    Fanout,
    Note,
    RoundMachine,
    Send,
    frame_size,
    take_refused,
)
from agent.protocol.chunking import DownlinkRate
from agent.protocol.influence import NormHistory
from agent.protocol.membership import (
    LIVE_STATES,
    Membership,
    ModelIdentity,
    PublishView,
    StartupGate,
    cut_off,
)
from agent.protocol.messages import StateDigest, Status, Suspect, View
from agent.protocol.notes import NoteKind
from agent.protocol.ps_ledger import ServerLedger
from agent.protocol.rounds import root_finishes_first, server_holds_the_state
from agent.protocol.state_transfer import STATE_CHUNK_VALUES, state_digest
from agent.protocol.sync_period import PeriodRule
from agent.protocol.topics import Topics
from agent.protocol.wire import Flag, Frame, Kind, RejectReason
from agent.state_fetch import StateFetch
from agent.state_server import StateServer
from agent.suspicion import SuspicionBook, first_report_at

__all__ = [
    "AgentCore", "AnnounceState", "ApplyControl", "ApplyUpdate", "Channel", "ComputeGradient", "CoreAction",
    "CoreConfig", "CoreEvent", "Counters", "Displaced", "FleetFinished", "LoadState", "Phase", "Publish",
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
    model: ModelIdentity = field(default_factory=ModelIdentity)  # announced; the fleet's must match
    labels: tuple[int, ...] = ()  # training samples per label in our shard, announced too
    # Periodic averaging: local optimizer steps per round, the round averaging their model
    # delta (agent/model/periodic.py); None: the round averages one step's gradient.
    sync_every: int | None = None
    # sync-every auto: the coordinator picks the period from the members' timings by this
    # rule and publishes it in the view (agent/protocol/sync_period.py); sync_every is the start.
    sync_auto: PeriodRule | None = None
    site: str = ""  # our site, announced in our status: the coordinator's views place us by it


# A frame this many rounds ahead of ours means the fleet went on without us.
FUTURE_ROUNDS = 2


def _asks_for_what_we_sent(frame: Frame) -> bool:
    """A NACK asks for units we sent (not a FINAL one: that says a round has no result)."""
    return frame.kind == Kind.NACK and not frame.flags & Flag.FINAL


class AgentCore(RoundSteps):
    """One agent's decisions: ``handle`` takes every event in and hands it to the parts;
    the steps between phases that follow are ``RoundSteps``' (agent/core_steps.py)."""

    def __init__(self, config: CoreConfig, incarnation: int, *, resumed_round: int | None = None,
                 resumed_age: float = 0.0, pid: int = 0, now: float = 0.0) -> None:
        self.config = config
        self.node = config.node
        self.incarnation = incarnation
        self.pid = pid
        self.topics = Topics(config.job)
        self.job = config.allreduce.job
        self.links = config.allreduce.new_links()
        self.norms = NormHistory(factor=config.allreduce.influence_factor)
        self.ledger = ServerLedger()  # ps-async: what this node, as the server, owes each worker
        self.downlink = DownlinkRate()
        self.membership = Membership(config.node, config.arity, gate=StartupGate(
            config.expected_members, config.join_grace, now), grace=config.suspicion_grace,
            offline_settle=config.offline_settle, identity=config.model,
            root_finishes_first=root_finishes_first(config.allreduce.algorithm))
        self.counters = Counters()
        self.book = SuspicionBook(config.node, incarnation)
        self.outbox = CoreOutbox(config.node, self.counters, self.book)
        self.inbox = Inbox(config.node, self.job, self.topics, self.counters, self.downlink)
        sole_source = server_holds_the_state(config.allreduce.algorithm)
        self.server = StateServer(config.node, self.job, config.state_size, config.state_chunk_values,
                                  self.counters.rejected, sole_source=sole_source)
        self.fetch = StateFetch(config.node, self.job, self.membership, self.outbox,
                                timeout=config.state_pull_timeout, size=config.state_size,
                                chunk_values=config.state_chunk_values, from_coordinator=sole_source,
                                site=config.site)
        self.chunks = ChunkPolicy(config.allreduce, config.adapt_chunks, config.adapt_broadcast)
        self.period = PeriodPolicy(config.sync_every, config.sync_auto)
        self.rounds = Rounds(config.node, config.allreduce.algorithm, self.outbox)
        self.resumed = resumed_round is not None
        self.round = resumed_round or 0
        # A restart before the Will removed us keeps us in the view, and no new view says
        # the fleet's round: the states served are of rounds past our checkpoint's by as
        # many as the fleet ran since it was written (``resumed_age`` seconds ago).
        self.round_known_at = now - resumed_age
        self.phase = Phase.CONNECTING
        self.phase_deadline: float | None = now + CONNECT_WAIT
        self.joining = False
        self.announced_round = -1  # the last round whose state digest we announced
        self.current: RoundInProgress | None = None
        self.pending_report: RoundReport | None = None  # held during FINAL_SYNC
        self.disconnected_at = -1e9
        self.connected = True  # to the broker (the transport tells us when it drops)
        self.steady_round: tuple[int, int] | None = None  # (round, epoch) last run cleanly here
        self.gate = RoundGate(config.node, self.membership, config.allreduce.round_deadline,
                              config.allreduce.algorithm)

    # -- queries ----------------------------------------------------------------------------

    @property
    def machines(self) -> dict[int, RoundMachine]:
        return self.rounds.machines

    def subscriptions(self) -> list[str]:
        fanout = [self.topics.all_fanout()] if self.chunks.listens_to_fanout() else []
        bridges = [self.topics.all_bridges()] if self.config.site else []
        return [self.topics.links_to(self.node), self.topics.all_status(), self.topics.all_views(),
                self.topics.control, self.topics.all_suspect(), self.topics.all_states(), *fanout,
                *bridges]

    def next_deadline(self) -> float | None:
        times = self.rounds.deadlines()
        if (t := self.fetch.next_timer()) is not None:
            times.append(t)
        if self.phase_deadline is not None:
            times.append(self.phase_deadline)
        if self.phase == Phase.WAITING and self.membership.latest is None:
            gate = self.membership.gate
            times.append(gate.started_at + gate.join_grace)  # the start-up gate opens by time
        if self.phase == Phase.WAITING and self.gate.root_wait_until is not None:
            times.append(self.gate.root_wait_until)
        if self.phase == Phase.WAITING and self.rounds.settle_until > self.membership.now:
            times.append(self.rounds.settle_until)  # the round start a long absence held
        if (t := self.membership.next_check()) is not None:
            times.append(t)
        return min(times) if times else None

    def state_frames(self, action: SendState, state: np.ndarray) -> list[Publish]:
        """The MODEL frames answering ``action`` with ``state`` (the driver's current state)."""
        return [self.outbox.frame(send.dst, send.frame) for send in self.server.frames(action, state)]

    def announcement(self, action: AnnounceState, state: np.ndarray) -> Publish | None:
        """The digest of ``state`` (ours at the start of ``action.round``) announced on our own
        state topic; None when that round's was announced already."""
        if action.round <= self.announced_round:
            return None
        self.announced_round = action.round
        return Publish.state_digest(StateDigest(self.node, action.round, state_digest(state)))

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
            case BridgeSeen(site, up):
                return [] if up else self._cut_off(site, now)
            case ViewSeen(view, publisher):
                return self._on_view(view, now, publisher)
            case SuspectSeen(report):
                return self._on_suspect(report, now)
            case DigestSeen(digest):
                return self.fetch.announced(digest, now, self.round) + self._advance(now)
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
            self.counters.rejected.update(take_refused(machine.stats))
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

    def _cut_off(self, site: str, now: float) -> list[CoreAction]:
        """A bridge went down: the nodes on its far side are gone for us, as if their Wills
        came (their own come back when it heals: the brokers resend the retained statuses)."""
        out: list[CoreAction] = []
        if site == self.config.site:
            self.membership.cut_off()
        for peer in cut_off(self.membership.sites, self.config.site, site):
            if peer != self.node and self.membership.states.get(peer) in LIVE_STATES:
                out += self._on_status(self.membership.will_of(peer), now)
        return out

    def _on_status(self, status: Status, now: float) -> list[CoreAction]:
        # A newer life of this node (even its Will: mosquitto publishes it when our own
        # reconnect takes the session from it) means we are the obsolete one.
        if status.node == self.node and status.incarnation > self.incarnation and self.phase != Phase.DONE:
            self._go(Trigger.DISPLACED)
            self.outbox.note(NoteKind.DISPLACED, self.node, f"by incarnation {status.incarnation}")
            return [Displaced(status.incarnation, status.pid)]
        peer = status.node
        self.period.heard(status)
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
        elif (why := self.membership.offer_view(view, publisher)) is not None:
            self.counters.rejected[why] += 1
        return self._advance(now)

    def _on_disconnect(self, now: float) -> list[CoreAction]:
        """The broker is away: the round under way ends by its deadline, and no new round
        starts until we are back (alone, a node would race through rounds nobody else runs)."""
        self.connected = False
        self.disconnected_at = now
        # The broker may have published everybody's Will as it went down: none of that is
        # news about the peers until it is back and they could say otherwise. The fleet may
        # have had ours, or lost our site: its view without us is news when we are back.
        self.membership.hold(float("inf"))
        self.membership.cut_off()
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

    def _on_suspect(self, report: Suspect, now: float) -> list[CoreAction]:
        """A member reports a peer silent. Unrefuted for the grace, the report excuses the
        peer in that round; with enough witnesses the fleet routes around it at once, in
        every round machine still running, and the coordinator drops it."""
        if report.is_self_report:
            return self._on_absent(report.node, report.round, now)
        if (why := self.membership.judge_suspect(report)) is not None:
            self.counters.rejected[why] += 1
            return []
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
            out += self.rounds.excuse(rnd, peer, now, first_report_at(self.membership.reports, peer))
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

    def _on_tick(self, now: float) -> list[CoreAction]:
        out = self.rounds.timers(now)
        out += self.fetch.tick(now, self.round, joining=self.phase is Phase.JOINING)
        out += self.outbox.views(self.membership.check(now))
        out += self._apply_suspicions(now)
        if self.phase_deadline is not None and now >= self.phase_deadline:
            out += self._phase_expired(now)
        return out + self._advance(now)


def _peer_down(machine: RoundMachine, *, peer: int, now: float) -> list[Send | Fanout | Note]:
    return machine.peer_down(peer, now)
