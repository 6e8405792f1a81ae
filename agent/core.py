"""The agent core: everything one agent decides, written once, with no IO (sans-IO, like h11).

``AgentCore`` owns the per-node logic: the round machines keyed by round number (the current
one and the finished ones that still answer ACKs, NACKs and pulls), the bounded buffer of frames
of rounds not started yet, state transfer (serve, fetch, drift resync, catch-up, final sync),
membership and views, Last Wills fanned out to every live round machine, the linger after the
last round, telemetry notes and counters.

Events in: ``on_message`` (topic + bytes, as MQTT delivers them) or the typed ``on_frame``,
``on_status``, ``on_view``; ``on_gradient`` (the gradient the driver computed when asked);
``on_tick(now)``. Actions out: the closed set ``CoreAction``. ``next_deadline()`` says when the
core next needs ``on_tick``. Every call takes ``now``; the core never reads a clock.

Two drivers execute the actions: ``agent/runtime.py`` (the agent users run: MQTT, the
monotonic clock, the model backend, checkpoint files) and ``simulate/virtual_fleet.py`` (N
cores on the in-memory bus in fake time, for tests and ``analyze fault-cost``). Neither makes a
protocol decision of its own.

State contract with the driver: between the ``ApplyUpdate`` of round r - 1 and the one of round
r, the driver's training state is the state at the start of round r. ``SendState`` is always
answered with that state, so it is executed in order with the other actions.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from agent.model.optim import scheduled_lr
from agent.protocol.allreduce import (
    ROOT_WILL_GRACE,
    AllreduceConfig,
    Broadcast,
    Fanout,
    Note,
    RoundContext,
    RoundMachine,
    RoundResult,
    Send,
    frame_size,
)
from agent.protocol.chunking import DownlinkRate, broadcast_for, chunk_values_for
from agent.protocol.membership import (
    SUSPICION_RTTS,
    Membership,
    ModelIdentity,
    PublishView,
    Refusal,
    StartupGate,
    view_root,
    view_tree,
)
from agent.protocol.messages import (
    Control,
    MessageError,
    NodeState,
    Status,
    Suspect,
    Telemetry,
    View,
)
from agent.protocol.notes import REJECTED_STATE, NoteKind
from agent.protocol.rounds import new_round
from agent.protocol.state_transfer import (
    STATE_CHUNK_VALUES,
    STATE_STRIPES,
    StateTransfer,
    resync_reason,
    serve_model_pull,
    state_chunk_count,
)
from agent.protocol.topics import Topics
from agent.protocol.wire import NO_NODE, Flag, Frame, Kind, Rejection, RejectReason, decode
from agent.transport.base import ARRIVING, DISCONNECTED, RECONNECTED, SENDING

# Frames of rounds not yet started are kept (bounded) until the round starts; a frame this many
# rounds ahead means the fleet went on without us.
FUTURE_ROUNDS = 2
MAX_BUFFERED_FRAMES = 4096
# A finished round's machine answers late ACKs, NACKs and pulls until this many rounds later.
ANSWERING_ROUNDS = 1
PULL_TRIES_PER_PEER = 2  # then a state transfer is given up (a new one starts when still needed)
# A drift resync's state may come this many rounds late (a loaded host serves 4.9 MB slowly):
# it is installed and the rounds' updates since are applied again. Started afresh every round
# instead, two members that drifted at once never resynced under load (broker restart test).
REPLAY_ROUNDS = 3
CONNECT_WAIT = 10.0  # seconds to wait for our own retained status to come back from the broker
# A drop of our broker connection this short is our link flapping (the broker stayed); a longer
# one may be the broker's own restart (paho reconnects in 20-140 ms here; a restart takes secs).
FLAP_MAX_AWAY = 1.0


class Phase(enum.Enum):
    CONNECTING = "connecting"  # waiting for our own status: does a fleet (a view) exist?
    JOINING = "joining"  # a fleet runs without us: wait to be in a view, fetch its state
    WAITING = "waiting"  # between rounds: waiting for a view that covers our round
    COMPUTING = "computing"  # asked the driver for this round's gradient
    RUNNING = "running"  # the round's machine is reducing and broadcasting
    FINAL_SYNC = "final_sync"  # the last round fell back: waiting (bounded) for the fleet's state
    LINGERING = "lingering"  # done: still answering late pulls, NACKs and ACKs for a while
    DONE = "done"


def _is_fanned_result(frame: Frame) -> bool:
    """What a root publishes on its fan-out topic: a result chunk addressed to nobody."""
    return (frame.kind == Kind.DATA and frame.target == NO_NODE
            and frame.flags & (Flag.BROADCAST | Flag.FINAL) == Flag.BROADCAST | Flag.FINAL)


def _asks_for_what_we_sent(frame: Frame) -> bool:
    """A NACK asks for units we sent (not a FINAL one: that says a round has no result)."""
    return frame.kind == Kind.NACK and not frame.flags & Flag.FINAL


class Recovery(enum.Enum):
    """What a round's machine does as it starts after our connection came back."""

    RECONNECTED = "reconnected"  # the drop came between rounds: its children may have gone around us
    ASK_RESULT = "ask_result"  # a short drop within the round before: the fleet may have gone on


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


# -- actions ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PublishStatus:
    status: Status


@dataclass(frozen=True)
class PublishSuspect:
    """Tell the fleet we heard nothing at all from ``report.peer`` for a whole timeout."""

    report: Suspect


@dataclass(frozen=True)
class ComputeGradient:
    """Compute round ``round``'s gradient on the current state; answer with ``on_gradient``."""

    round: int
    members: tuple[int, ...]


@dataclass(frozen=True)
class ApplyUpdate:
    round: int
    values: np.ndarray
    learning_rate: float


@dataclass(frozen=True)
class LoadState:
    """Replace the training state with the fleet's state at the start of ``round``."""

    round: int
    state: np.ndarray


@dataclass(frozen=True)
class SendState:
    """Answer ``request`` (a MODEL_PULL) with the current state: ``state_frames`` builds it."""

    request: Frame
    round: int
    chunks: tuple[int, ...] | None = None  # the chunks to send (None: what the request asks)


@dataclass(frozen=True)
class SaveCheckpoint:
    round: int
    epoch: int


@dataclass(frozen=True)
class ApplyControl:
    """A fault-injection command for this node's transport (simulator only)."""

    control: Control


@dataclass
class RoundReport:
    round: int
    epoch: int
    members: int
    loss: float
    result: RoundResult | None  # None: abandoned (the fleet was ahead)
    phase_seconds: dict[str, float]
    notes: list[Note]
    evaluate: bool = False
    accuracy: float | None = None
    bytes_sent: int = 0
    bytes_received: int = 0
    # The core clock's time when the round's allreduce ended (0: not said); the runtime turns
    # it into the wall-clock ``Telemetry.reduced_at``.
    ended_at: float = 0.0

    @property
    def degraded(self) -> bool:
        return self.result is None or self.result.degraded


@dataclass(frozen=True)
class ReportRound:
    report: RoundReport


@dataclass(frozen=True)
class Displaced:
    """A newer process runs as this node (same id and credentials): stop, without fighting
    for the session and without taking it offline (no offline status, no checkpoint)."""

    by_incarnation: int
    pid: int | None


CoreAction = (Send | Fanout | PublishView | PublishStatus | PublishSuspect | ComputeGradient | ApplyUpdate | LoadState
              | SendState | SaveCheckpoint | ApplyControl | ReportRound | Displaced | Refusal)


@dataclass
class Counters:
    bytes_sent: int = 0
    bytes_received: int = 0
    rejected: Counter[str] = field(default_factory=Counter)


@dataclass
class _RoundInProgress:
    view: View
    started: float
    waited: float = 0.0  # blocked before it could start (a dead root's tree, no connection)
    computed: float = 0.0
    loss: float = 0.0
    own_hash: int = 0
    gradient: np.ndarray | None = None  # kept: a newer view for this round restarts it
    bytes_sent: int = 0
    bytes_received: int = 0


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
            offline_settle=config.offline_settle, identity=config.model)
        self.resumed = resumed_round is not None
        self.round = resumed_round or 0
        self.phase = Phase.CONNECTING
        self.phase_deadline: float | None = now + CONNECT_WAIT
        self.joining = False
        self.machines: dict[int, RoundMachine] = {}
        self.current: _RoundInProgress | None = None
        self.future: list[Frame] = []
        self.transfer: StateTransfer | None = None
        self.received_state: tuple[int, np.ndarray] | None = None  # (round, state) fetched
        # round -> (values, learning rate) applied, the last REPLAY_ROUNDS (see _finish_round).
        self.applied: dict[int, tuple[np.ndarray, float]] = {}
        self.pending_pulls: dict[int, Frame] = {}  # puller -> its MODEL_PULL
        self.served: dict[tuple[int, int], set[int]] = {}  # (puller, round) -> state chunks sent
        self.ahead: dict[int, set[int]] = {}  # round -> members whose frames show it (catch-up)
        self.pending_report: RoundReport | None = None  # held during FINAL_SYNC
        self.notes: list[Note] = []
        self.counters = Counters()
        self.reported: set[tuple[int, int]] = set()  # (peer, round) suspicions published
        # Self-reports: peer -> the last round it said it takes no part in; and our own.
        self.absent: dict[int, int] = {}
        self.absent_through = -1
        self.hinted: dict[int, int] = {}  # puller -> our round when we told it it is behind
        self.asked_went_on = -1  # the last round we asked for the result the fleet went on with
        self.wills: dict[int, tuple[float, int]] = {}  # peer -> (when, incarnation) of its last Will
        self.root_grace: set[int] = set()  # rounds whose root's Will came: waiting for it to come back
        self.recovery: tuple[int, Recovery] | None = None  # for that round's start (on_reconnect)
        self.disconnected_at = -1e9
        self.excused: set[tuple[int, int]] = set()  # (peer, round) no longer waited for
        self.down_seen: frozenset[int] = frozenset()  # suspected peers already routed around
        self.refuted: set[tuple[int, int]] = set()  # (reporter, round) reports answered
        self.connected = True  # to the broker (the transport tells us when it drops)
        self.root_wait_until: float | None = None  # waiting for a view without a dead root
        self.steady_round: tuple[int, int] | None = None  # (round, epoch) last run cleanly here
        self.blocked: tuple[int, float] | None = None  # (round, since when) it could not start

    # -- queries ----------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self.config.rounds > 0 and self.round >= self.config.rounds

    def status(self, state: NodeState) -> Status:
        model = self.config.model
        return Status(node=self.node, state=state, round=self.round, pid=self.pid,
                      incarnation=self.incarnation, fingerprint=model.fingerprint, model=model.name,
                      params=model.params, labels=list(self.config.labels))

    def subscriptions(self) -> list[str]:
        # A fleet may switch to the fan-out (adapt_broadcast): we listen there from the start.
        listen = self.config.allreduce.broadcast == "fanout" or self.config.adapt_broadcast
        fanout = [self.topics.all_fanout()] if listen else []
        return [self.topics.links_to(self.node), self.topics.all_status(), self.topics.all_views(),
                self.topics.control, self.topics.all_suspect(), *fanout]

    def next_deadline(self) -> float | None:
        times = [t for m in self.machines.values() if (t := m.next_timer()) is not None]
        if self.transfer is not None and (t := self.transfer.next_timer()) is not None:
            times.append(t)
        if self.phase_deadline is not None:
            times.append(self.phase_deadline)
        if self.phase == Phase.WAITING and self.membership.latest is None:
            gate = self.membership.gate
            times.append(gate.started_at + gate.join_grace)  # the start-up gate opens by time
        if self.phase == Phase.WAITING and self.root_wait_until is not None:
            times.append(self.root_wait_until)
        if (t := self.membership.next_check()) is not None:
            times.append(t)
        times.extend(self._grace_ends(self.machines[rnd]) for rnd in self.root_grace if rnd in self.machines)
        return min(times) if times else None

    def state_frames(self, action: SendState, state: np.ndarray) -> list[Send]:
        """The MODEL frames answering ``action`` with ``state`` (the driver's current state)."""
        chunks = list(action.chunks) if action.chunks is not None else None
        sends = serve_model_pull(action.request, self.node, self.job, state, action.round,
                                 self.config.state_chunk_values, chunks)
        for send in sends:
            self.counters.bytes_sent += frame_size(send.frame)
        return sends

    # -- events -----------------------------------------------------------------------------

    def on_message(self, topic: str, payload: bytes, now: float, arrival: float = 0.0) -> list[CoreAction]:
        """One message as the broker delivered it (bytes crossing the boundary are checked here).
        ``arrival``: seconds a large one took to arrive, first byte to last (0: untimed, as
        if at once), what the coordinator picks the fleet's chunk size from."""
        if topic == RECONNECTED:
            return self.on_reconnect(now)
        if topic == DISCONNECTED:
            return self.on_disconnect(now)
        if topic == ARRIVING:
            return self.on_arriving(payload.decode(errors="replace"), now)
        if topic == SENDING:
            return self.on_arriving(None, now)
        link = self.topics.parse_link(topic)
        publisher = self.topics.parse_fanout(topic) if link is None else None
        fanned = publisher is not None
        if publisher is not None:
            if publisher == self.node:
                return []  # our own fan-out, back from the broker
            link = (publisher, self.node)  # its publisher is the sender, as on a link topic
        if link is not None:
            self.counters.bytes_received += len(payload)
            frame = decode(payload, expected_sender=link[0], job=self.job)
            if isinstance(frame, Rejection):
                self.counters.rejected[frame.reason.value] += 1
                return []
            self.downlink.observe(len(payload), arrival)  # large ones only
            if fanned and not _is_fanned_result(frame):
                # A fan-out reaches every member: only a result for all (the round machine
                # takes it from the round's root only), never a frame meant for one of them.
                self.counters.rejected["fanout_not_a_result"] += 1
                return []
            if fanned and self._broadcast_of(frame.round) != "fanout":
                # A round whose result is relayed down the tree takes none from a fan-out.
                self.counters.rejected["fanout_in_tree_round"] += 1
                return []
            return self.on_frame(frame, now, counted=True)
        try:
            if self.topics.parse_status(topic) is not None:
                return self.on_status(Status.decode(payload), now)
            if (publisher := self.topics.parse_view(topic)) is not None:
                return self.on_view(View.decode(payload), now, publisher)
            if (reporter := self.topics.parse_suspect(topic)) is not None:
                report = Suspect.decode(payload)
                if report.node != reporter:
                    # The ACL lets a device write only its own topic: a report in another's
                    # name (or an absence claimed for another) is a forgery.
                    self.counters.rejected["suspect_forged"] += 1
                    return []
                return self.on_suspect(report, now)
            if topic == self.topics.control:
                control = Control.decode(payload)
                return [ApplyControl(control)] if control.node == self.node else []
        except MessageError as exc:
            self.counters.rejected[f"json_{exc.reason}"] += 1
        return []

    def on_frame(self, frame: Frame, now: float, counted: bool = False) -> list[CoreAction]:
        if not counted:
            self.counters.bytes_received += frame_size(frame)
        out: list[CoreAction] = []
        machine = self.machines.get(frame.round)
        if frame.kind == Kind.PROBE and frame.flags & Flag.PROGRESS:
            self.membership.peer_busy(frame.sender, now)  # a report about it waits behind that
        if frame.kind == Kind.MODEL_PULL:
            self.pending_pulls[frame.sender] = frame
            out += self._serve_pulls()
        elif frame.kind == Kind.MODEL:
            out += self._on_state_frame(frame, now)
        elif machine is not None:
            out += self._run(machine.on_frame(frame, now), frame.round)
        elif frame.kind == Kind.PROBE and frame.flags & Flag.PROGRESS:
            # A busy link of a peer still in another round (the limit came while it finished
            # the last one): what we sent it in ours is queued behind, not lost.
            for rnd, other in list(self.machines.items()):
                out += self._run(other.on_frame(replace(frame, round=rnd), now), rnd)
        elif frame.round >= self.round + FUTURE_ROUNDS:
            out += self._fell_behind(frame, now)
        elif frame.round >= self.round and _asks_for_what_we_sent(frame):
            pass  # a round we have not started: we sent nothing of it (see _start_machine)
        elif frame.round >= self.round:
            if len(self.future) < MAX_BUFFERED_FRAMES:
                self.future.append(frame)
            else:
                self.counters.rejected["buffer_full"] += 1
            out += self._fleet_went_on(frame, now)
        else:
            self.counters.rejected[RejectReason.STALE_ROUND.value] += 1
            out += self._hint_behind(frame)
        return out + self._advance(now)

    def on_arriving(self, topic: str | None, now: float) -> list[CoreAction]:
        """A large message on ``topic`` is still arriving, piece by piece (our downlink is
        slow), or (None) what we published is still waiting to leave (our uplink is): the
        round under way holds its verdicts on silence (issue 19)."""
        link = None if topic is None else self.topics.parse_link(topic)
        if topic is not None and link is None and (publisher := self.topics.parse_fanout(topic)) is not None:
            link = (publisher, self.node)  # a result chunk of the fan-out, from its publisher
        if topic is not None and link is None:
            return []
        self.membership.links_busy(now)
        out: list[CoreAction] = []
        for rnd, machine in list(self.machines.items()):  # the last round's broadcast may still drain
            out += self._run(machine.arriving(None if link is None else link[0], now), rnd)
        return out

    def _choose_chunks(self) -> list[CoreAction]:
        """As coordinator: the chunk size and the broadcast the fleet's next rounds use, from
        our downlink."""
        view = self.membership.latest
        adapt = self.config.adapt_chunks or self.config.adapt_broadcast
        if not adapt or view is None or self.membership.coordinator() != self.node:
            return []
        rate = self.downlink.rate()
        chunks, broadcast = view.chunk_values, view.broadcast
        if self.config.adapt_chunks:
            chunks = chunk_values_for(rate, chunks, self.config.allreduce.chunk_size)
        if self.config.adapt_broadcast and self.config.allreduce.algorithm == "ft-tree":
            broadcast = broadcast_for(rate, broadcast)
        out = self.membership.change_chunks(chunks, broadcast)
        if out and rate is not None:
            size = chunks or self.config.allreduce.chunk_size
            how = broadcast or self.config.allreduce.broadcast
            self.notes.append(Note(NoteKind.CHUNKS, None, f"{size:,} values per chunk, broadcast {how}, from round "
                                   f"{self.membership.newest.from_round}: downlink {rate / 1e6:.1f} MB/s"))
        return list(out)

    def _allreduce_config(self, view: View) -> AllreduceConfig:
        base = self.config.allreduce
        chunks = view.chunk_values or base.chunk_size
        broadcast = self._broadcast_in(view)
        if (chunks, broadcast) == (base.chunk_size, base.broadcast):
            return base
        return replace(base, chunk_size=chunks, broadcast=broadcast)  # once a round

    def _broadcast_of(self, round: int) -> Broadcast:
        """How round ``round``'s result reaches us (see _broadcast_in)."""
        return self._broadcast_in(self.membership.view_for(round))

    def _broadcast_in(self, view: View | None) -> Broadcast:
        """The one rule for a round's broadcast: as its view says, else as configured."""
        chosen = (view.broadcast if view is not None else "") or self.config.allreduce.broadcast
        return "fanout" if chosen == "fanout" else "tree"

    def _fleet_went_on(self, frame: Frame, now: float) -> list[CoreAction]:
        """A member's contribution to the next round while ours still waits: it has our
        round's result, and not from us, so the fleet ended the round around us (our Will
        came while the connection was down; the round started before we were back). Ask for
        the result now, once a round, instead of waiting a whole wait for children that will
        not send this round again, and keeping the fleet's next round waiting for us."""
        machine = self.machines.get(self.round)
        if (machine is None or machine.result is not None or self.asked_went_on >= self.round
                or not self._shows_fleet_went_on(frame)):
            return []
        self.asked_went_on = self.round
        self.notes.append(Note(NoteKind.BEHIND, frame.sender, f"in round {frame.round}: asking for our round's result"))
        return self._run(machine.went_on(now), self.round)

    def _shows_fleet_went_on(self, frame: Frame) -> bool:
        """A member's reduce data of the round after ours, and we are not our round's root
        (nobody else can end it)."""
        current = self.current
        return (frame.round == self.round + 1 and frame.kind == Kind.DATA and not frame.is_broadcast
                and current is not None and frame.sender in current.view.members
                and view_root(current.view) != self.node)

    def _hint_behind(self, frame: Frame) -> list[CoreAction]:
        """A peer pulls a round we no longer answer (it reconnected after the fleet went on
        without it): a probe of our round tells it how far behind it is, so it fetches the
        fleet's state now instead of waiting out that round's deadline. Once per round."""
        if frame.kind != Kind.PULL or self.hinted.get(frame.sender, -1) >= self.round or self.current is None:
            return []
        self.hinted[frame.sender] = self.round
        probe = Frame(Kind.PROBE, self.job, self.round, self.node, 0, 1, Flag.NONE, target=frame.sender)
        return self._run([Send(frame.sender, probe)], self.round)

    def on_status(self, status: Status, now: float) -> list[CoreAction]:
        # A newer life of this node (even its Will: mosquitto publishes it when our own
        # reconnect takes the session from it) means we are the obsolete one.
        if status.node == self.node and status.incarnation > self.incarnation and self.phase != Phase.DONE:
            self.phase = Phase.DONE
            self.notes.append(Note(NoteKind.DISPLACED, self.node, f"by incarnation {status.incarnation}"))
            return [Displaced(status.incarnation, status.pid)]
        was_down = self.membership.is_down(status.node)
        was_reported = status.node in self.membership.reports
        out: list[CoreAction] = list(self.membership.on_status(status, now))
        if was_reported and status.node not in self.membership.reports:
            # It refuted a report of silence: what the machines held for the verdict goes.
            for rnd, machine in list(self.machines.items()):
                out += self._run(machine.peer_spoke(status.node, now), rnd)
        if was_down and not self.membership.is_down(status.node):
            # Back (restarted, resumed, rejoining): links found dead while it was away are
            # not evidence about the new life; do not route around it from the start.
            self.links.heal(status.node)
        if self.phase == Phase.CONNECTING and self.membership.knows_incarnation(self.node, self.incarnation):
            out += self._connected(now)
        is_will = (status.state == "offline" and status.node != self.node
                   and self.membership.states.get(status.node) == "offline")
        if is_will:
            # The broker's Last Will: no machine needs to wait a timeout for this peer; but
            # nobody can average a round without its root: that one waits a moment for it.
            self.wills[status.node] = (now, status.incarnation)
            for rnd, machine in list(self.machines.items()):
                if self._grants_root_grace(machine, status.node):
                    self.root_grace.add(rnd)
                    out += self._run(machine.peer_away(status.node, now), rnd)
                else:
                    out += self._run(machine.peer_down(status.node, now), rnd)
        elif was_down and not self.membership.is_down(status.node):
            out += self._root_back(status, now)
        return out + self._advance(now)

    def _grants_root_grace(self, machine: RoundMachine, peer: int) -> bool:
        return (machine.tree.root == peer != self.node and machine.result is None
                and self.config.allreduce.algorithm != "rps")

    def _grace_ends(self, machine: RoundMachine) -> float:
        return self.wills[machine.tree.root][0] + ROOT_WILL_GRACE

    def _end_root_grace(self, ends: Callable[[RoundMachine], bool]) -> list[tuple[int, RoundMachine]]:
        """The rounds waiting for their root for which ``ends`` holds (rounds gone are dropped)."""
        self.root_grace &= set(self.machines)
        done = [(rnd, self.machines[rnd]) for rnd in sorted(self.root_grace) if ends(self.machines[rnd])]
        self.root_grace -= {rnd for rnd, _ in done}
        return done

    def _root_back(self, status: Status, now: float) -> list[CoreAction]:
        """The root of a round that waits out its Will is online again: the same life (its
        connection dropped) goes on with the round; a new one (restarted) has lost it."""
        same_life = self.wills.get(status.node, (0.0, -1))[1] == status.incarnation
        out: list[CoreAction] = []
        for rnd, machine in self._end_root_grace(lambda m: m.tree.root == status.node):
            out += self._run(machine.peer_back(status.node, now) if same_life
                             else machine.peer_down(status.node, now), rnd)
        return out

    def _root_grace_over(self, now: float) -> list[CoreAction]:
        out: list[CoreAction] = []
        for rnd, machine in self._end_root_grace(lambda m: now >= self._grace_ends(m)):
            out += self._run(machine.peer_down(machine.tree.root, now), rnd)
        return out

    def on_view(self, view: View, now: float, publisher: int | None = None) -> list[CoreAction]:
        """A view; ``publisher`` is the id its topic names (None: given locally, trusted)."""
        if publisher is None:
            self.membership.on_view(view)
        elif why := self.membership.offer_view(view, publisher):
            self.counters.rejected[why] += 1
        return self._advance(now)

    def on_disconnect(self, now: float) -> list[CoreAction]:
        """The broker is away: the round under way ends by its deadline, and no new round
        starts until we are back (alone, a node would race through rounds nobody else runs)."""
        self.connected = False
        self.disconnected_at = now
        # The broker may have published everybody's Will as it went down: none of that is
        # news about the peers until it is back and they could say otherwise.
        self.membership.hold(float("inf"))
        self.notes.append(Note(NoteKind.DISCONNECTED, None, "no new round until the broker is back"))
        return []

    def on_reconnect(self, now: float) -> list[CoreAction]:
        """The connection to the broker came back; the broker may have restarted and lost
        every retained status and the view. Say again who we are (the transport's birth
        message is the status of our start), the coordinator republishes its view, and
        nobody decides views or evictions from the partial picture for a while."""
        self.notes.append(Note(NoteKind.RECONNECTED, None, "statuses and view published again"))
        self.connected = True
        self.membership.hold(now + self.config.reconnect_hold)
        out: list[CoreAction] = []
        if self.phase not in (Phase.CONNECTING, Phase.DONE):
            out.append(PublishStatus(self.status("joining" if self.joining else "online")))
        running = [rnd for rnd, machine in self.machines.items() if machine.result is None]
        # A short drop is our connection flapping: the broker stayed, and the peers routed
        # around us on our Will at once. After a long one the broker itself may have been
        # away (restarted: everybody was), and the round under way ends by its deadline.
        flapped = now - self.disconnected_at <= FLAP_MAX_AWAY
        for rnd in running:
            out += self._run(self.machines[rnd].reconnected(now, now - self.disconnected_at), rnd)
            if flapped:
                out += self._run(self.machines[rnd].went_on(now), rnd)
        # Between rounds: the peers may run the next one without us (our Will), so that
        # round's machine recovers as it starts (see _start_machine). After a drop within a
        # round they may have started the next one while we were away: its machine asks its
        # parent for the result as it starts (answered once: free when it was not needed).
        if self.round not in running:
            self.recovery = (self.round, Recovery.RECONNECTED)
        else:
            self.recovery = (self.round + 1, Recovery.ASK_RESULT) if flapped else None
        if self.transfer is not None:
            # What was asked or sent while the connection was down is lost: ask again now.
            out += self._run(self.transfer.retry_now(now), self.round)
        latest = self.membership.latest
        if latest is not None and latest.coordinator == self.node and self.membership.coordinator() == self.node:
            out.append(PublishView(latest))
        return out

    def on_suspect(self, report: Suspect, now: float) -> list[CoreAction]:
        """A member reports a peer silent. Unrefuted for the grace, the report excuses the
        peer in that round; with enough witnesses the fleet routes around it at once, in
        every round machine still running, and the coordinator drops it."""
        if report.is_self_report:
            return self._on_absent(report.node, report.round, now)
        out: list[CoreAction] = list(self.membership.on_suspect(report, now))
        if report.peer == self.node:
            out += self._answer_suspicion(report)
        return out + self._apply_suspicions(now) + self._advance(now)

    def _answer_suspicion(self, report: Suspect) -> list[CoreAction]:
        """A report about us: we are alive, so refute it; absent from its round, say that too."""
        out: list[CoreAction] = []
        if self.phase == Phase.JOINING:
            # Joining, we run no round yet: nobody should wait for us in a view that lists us.
            out += self._announce_absence(max(report.round, self.round))
        elif report.round <= self.absent_through:
            # We take no part in that round (alive, catching up): say so again (that report
            # may have been lost), and refute the suspicion below all the same.
            out.append(PublishSuspect(Suspect(self.node, self.absent_through, self.node, self.incarnation)))
        if (report.node, report.round) not in self.refuted and self.phase not in (Phase.CONNECTING, Phase.DONE):
            # We are not silent (cut links around us, a slow moment, or rejoining): say so at
            # once, also while lingering after our last round (the others may still be in it:
            # an unrefuted root there ends it for everybody). Membership ignores an "online"
            # from a node far behind the fleet.
            self.refuted.add((report.node, report.round))
            out.append(PublishStatus(self.status("joining" if self.joining else "online")))
        return out

    def _on_absent(self, peer: int, through: int, now: float) -> list[CoreAction]:
        """``peer`` takes no part in the rounds up to ``through`` (its self-report): route
        around it there at once, as for a Will, instead of waiting a timeout and a grace for
        a node that is alive (and would refute a suspicion) but not in those rounds."""
        if peer == self.node or through <= self.absent.get(peer, -1):
            return []
        self.absent[peer] = through
        self.notes.append(Note(NoteKind.ABSENT, peer, f"takes no part in rounds up to {through}"))
        out: list[CoreAction] = []
        for rnd, machine in list(self.machines.items()):
            if rnd <= through and machine.result is None:
                out += self._run(machine.peer_down(peer, now), rnd)
        return out + self._advance(now)

    def _announce_absence(self, through: int) -> list[CoreAction]:
        """We take no part in the rounds up to ``through`` that list us: tell the fleet."""
        if through < self.round or through <= self.absent_through:
            return []
        self.absent_through = through
        return [PublishSuspect(Suspect(self.node, through, self.node, self.incarnation))]

    def _apply_suspicions(self, now: float) -> list[CoreAction]:
        out: list[CoreAction] = []
        for peer, rnd in self.membership.unrefuted(now):
            machine = self.machines.get(rnd)
            if peer != self.node and (peer, rnd) not in self.excused and machine is not None:
                self.excused.add((peer, rnd))
                out += self._run(machine.excuse(peer, now), rnd)
        suspected = self.membership.suspected()
        for peer in sorted(suspected - self.down_seen - {self.node}):
            self.notes.append(Note(NoteKind.SUSPECTED, peer, "silent by the fleet's witnesses"))
            for rnd, machine in list(self.machines.items()):
                out += self._run(machine.peer_down(peer, now), rnd)
        self.down_seen = suspected
        return out

    def on_gradient(self, round: int, loss: float, gradient: np.ndarray, model_hash: int,
                    now: float, compute_seconds: float | None = None) -> list[CoreAction]:
        """The gradient asked for; ``compute_seconds``, when the driver measured it, is the
        compute phase (else: since the request, which may include an evaluation run first)."""
        current = self.current
        if self.phase != Phase.COMPUTING or current is None or round != self.round:
            return []  # a gradient for a round given up meanwhile
        if compute_seconds is not None:
            current.started = now - compute_seconds
        current.computed, current.loss, current.own_hash = now, loss, model_hash
        current.gradient = gradient
        current.bytes_sent, current.bytes_received = self.counters.bytes_sent, self.counters.bytes_received
        return self._start_machine(current, now) + self._advance(now)

    def _start_machine(self, current: _RoundInProgress, now: float) -> list[CoreAction]:
        assert current.gradient is not None
        tree = view_tree(current.view)
        machine = new_round(RoundContext(self._allreduce_config(current.view), tree, self.node, self.round,
                                         current.gradient, current.own_hash, self.links, now,
                                         irregular_start=self._irregular_start(current.view),
                                         own_link_rate=self.downlink.rate()))
        self.machines[self.round] = machine
        self.phase = Phase.RUNNING
        # A refutation crosses the broker twice, like a frame and its ACK: on a slow broker
        # (a loaded gateway, the embedded one) give the suspect twice the round trip our
        # links show, with fixed timeouts too (1.5 s late refutations on a loaded host
        # evicted five healthy agents). Their RTO (the variance of 1 MB units' round trips
        # in it) and the initial guess for links never used (most of a root's) added
        # 0.1-0.2 s to every silent round at 15 agents: a refutation is one small message.
        rtt = max((r for p in tree.members if p != self.node
                   and (r := self.links.measured_rtt(p)) is not None), default=0.0)
        self.membership.grace = max(self.config.suspicion_grace, SUSPICION_RTTS * rtt)
        out: list[CoreAction] = []
        for peer in tree.members:
            if peer != self.node and (self.membership.is_down(peer) or self.absent.get(peer, -1) >= self.round):
                will = self.wills.get(peer)
                if (will is not None and now < will[0] + ROOT_WILL_GRACE and self.absent.get(peer, -1) < self.round
                        and self._grants_root_grace(machine, peer)):
                    self.root_grace.add(self.round)  # its Will came a moment ago
                    out += self._run(machine.peer_away(peer, now), self.round)
                else:
                    out += self._run(machine.peer_down(peer, now), self.round)  # nobody waits for it
        out += self._run(machine.start(now), self.round)
        for frame in self._take_future(self.round):
            out += self._run(machine.on_frame(frame, now), self.round)
        recovery, self.recovery = self.recovery, None
        if recovery == (self.round, Recovery.RECONNECTED) and tree.root != self.node:
            # Not the root: it cannot end a round the others may have gone on with. Our
            # children saw our Will: one that was ready sent around us, and a whole wait for
            # it kept the root waiting for our subtree (1.5-2.5 s rounds of a flapping inner
            # node). went_on waits for them only as long as their first frame usually takes
            # and asks those that sent to us while we were away (a NACK that a child which
            # has not started the round drops: it sent nothing of it).
            out += self._run(machine.reconnected(now), self.round)
            out += self._run(machine.went_on(now), self.round)
        elif recovery == (self.round, Recovery.ASK_RESULT):
            out += self._run(machine.went_on(now), self.round)
        return out

    def on_tick(self, now: float) -> list[CoreAction]:
        out: list[CoreAction] = []
        for rnd, machine in list(self.machines.items()):
            if (wake := machine.next_timer()) is not None and now >= wake:
                out += self._run(machine.on_timer(now), rnd)
        out += self._root_grace_over(now)
        out += self._tick_transfer(now)
        out += self.membership.check(now)
        out += self._apply_suspicions(now)
        if self.phase_deadline is not None and now >= self.phase_deadline:
            out += self._phase_expired(now)
        return out + self._advance(now)

    def record_note(self, note: Note) -> None:
        self.notes.append(note)

    def count_rejected(self, reason: str) -> None:
        self.counters.rejected[reason] += 1

    # -- what next --------------------------------------------------------------------------

    def _advance(self, now: float) -> list[CoreAction]:
        """Move through the phases as far as the facts allow (each step is one decision)."""
        if self.membership.refused is not None and self.phase != Phase.DONE:
            self.phase = Phase.DONE  # the fleet runs another model: we take no part, ever
            return [self.membership.refused]
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
            elif self.phase == Phase.FINAL_SYNC and self.transfer is None:
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
            self.phase = Phase.WAITING
            return []
        self.joining = True
        self.phase = Phase.JOINING
        return [PublishStatus(self.status("joining"))]

    def _phase_expired(self, now: float) -> list[CoreAction]:
        self.phase_deadline = None
        if self.phase == Phase.CONNECTING:
            return self._connected(now)
        if self.phase == Phase.FINAL_SYNC:
            self.transfer = None
            return self._end_final_sync(now)
        if self.phase == Phase.LINGERING:
            self.phase = Phase.DONE
        if self.phase == Phase.JOINING and self.done:
            # Rejoining after the fleet's last round and no peer answered: we are done too.
            self.notes.append(Note(NoteKind.STATE_PULL_FAILED, None, f"final state of round {self.round}"))
            self.joining = False
            self.phase = Phase.DONE
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
        if self.received_state is not None:
            rnd, state = self.received_state
            self.received_state = None
            if rnd >= self.round:
                self.round, self.joining = rnd, False
                self.future = [f for f in self.future if f.round >= rnd]
                self.notes.append(Note(NoteKind.REJOIN, None, f"state of round {rnd}"))
                self.phase = Phase.WAITING
                return [LoadState(rnd, state), PublishStatus(self.status("online")),
                        *self._serve_pulls()]
        peers = self.membership.online_peers(self.membership.live())
        transfer = self.transfer
        if peers and (transfer is None or transfer.round < self.round
                      or not set(transfer.peers) & set(peers)):
            # None yet, one for a round before the view's, or its peers are all gone.
            return self._fetch_state(self.round, peers, now)
        return []

    def _step_waiting(self, now: float) -> list[CoreAction]:
        out: list[CoreAction] = self._install_fleet_state()
        if self.done:
            return out + self._start_linger(now)
        view = self.membership.view_for(self.round)
        root_down = self._dead_root_blocks(view, now)
        if not root_down:
            # Not while a dead root blocks this round: nobody can have run it on that tree,
            # so the coordinator's view without the root may still apply from it (it counts
            # from the rounds we ran); before, that view came for the round after and this
            # one waited the whole root wait (5 s) on every member.
            out += self.membership.round_started(self.round, now)
            out += self._choose_chunks()
            if (newer := self.membership.view_for(self.round)) is not view:
                view, root_down = newer, self._dead_root_blocks(newer, now)
        if view is None:
            return out
        if self.node not in view.members:
            return out + self._rejoin()
        if root_down or not self.connected or self._mostly_down(view):
            if self.blocked is None or self.blocked[0] != self.round:
                self.blocked = (self.round, now)
            return out
        since = self.blocked[1] if self.blocked is not None and self.blocked[0] == self.round else now
        self.blocked = None
        self.current = _RoundInProgress(view=view, started=now, waited=now - since)
        self.phase = Phase.COMPUTING
        # Machines older than the last finished round have nothing left to answer.
        for r in [r for r in self.machines if r < self.round - ANSWERING_ROUNDS]:
            del self.machines[r]
        self.served = {k: v for k, v in self.served.items() if k[1] >= self.round - 1}
        # What was reported, excused or refuted for rounds long gone is kept no longer.
        old = self.round - ANSWERING_ROUNDS - 2
        self.reported = {(p, r) for p, r in self.reported if r >= old}
        self.excused = {(p, r) for p, r in self.excused if r >= old}
        self.refuted = {(n, r) for n, r in self.refuted if r >= old}
        self.ahead = {r: s for r, s in self.ahead.items() if r > self.round}
        return [*out, *self._serve_pulls(), ComputeGradient(self.round, tuple(view.members))]

    def _evicted(self) -> bool:
        """The fleet went on without us (we hung and were taken for silent, or the Will
        took us out): whatever round we were in, it is not ours any more."""
        latest = self.membership.latest
        return not self.joining and latest is not None and self.node not in latest.members

    def _leave_and_rejoin(self, now: float) -> list[CoreAction]:
        out: list[CoreAction] = []
        if self.phase == Phase.RUNNING and self.current is not None:
            self.notes.append(Note(NoteKind.ABANDONED, None, "the fleet took us for silent"))
            del self.machines[self.round]
            out.append(ReportRound(self._report(None, now)))
        self.current = None
        return out + self._rejoin()

    def _rejoin(self) -> list[CoreAction]:
        """The fleet went on without us (we hung, or were taken for silent): join it again
        through the join path, with its state, instead of running rounds nobody expects."""
        self.notes.append(Note(NoteKind.REJOIN_NEEDED, None, f"not in the view of round {self.round}"))
        self.joining = True
        self.phase = Phase.JOINING
        latest = self.membership.latest
        # Views before the one without us may still list us: nobody should wait for us there.
        absent = self._announce_absence(latest.from_round - 1) if latest is not None else []
        return [PublishStatus(self.status("joining")), *absent]

    def _mostly_down(self, view: View) -> bool:
        """Most of the view down at once (a broker that went away published every Will):
        alone we would race through rounds nobody else runs. Wait for the view to change."""
        up = [m for m in view.members if m == self.node or not self.membership.is_down(m)]
        return len(view.members) > 2 and len(up) * 2 <= len(view.members)

    def _dead_root_blocks(self, view: View | None, now: float) -> bool:
        return view is not None and self.node in view.members and self._root_is_down(view, now)

    def _root_is_down(self, view: View, now: float) -> bool:
        """No round of a tree whose root is offline or silent can finish: wait (bounded) for
        the coordinator's view without it rather than run to the deadline."""
        root = view_root(view)
        newest = self.membership.latest
        if (root == self.node or not self.membership.is_down(root) or len(view.members) == 1
                or (newest is not None and newest.epoch > view.epoch)):
            # A newer view (from a later round) says where the new tree starts: the rounds
            # before it end at once on this one, as they did for the members that got here
            # first (late ones waited the whole root wait here, 5 s, and the fleet for them).
            self.root_wait_until = None
            return False
        if self.root_wait_until is None:
            self.root_wait_until = now + self.config.allreduce.round_deadline
        if now >= self.root_wait_until:
            self.root_wait_until = None
            return False
        return True

    def _install_fleet_state(self) -> list[CoreAction]:
        """Between rounds: a state fetched because we fell behind replaces ours."""
        if self.received_state is None or self.received_state[0] < self.round:
            return []
        rnd, state = self.received_state
        self.received_state = None
        self.notes.append(Note(NoteKind.RESYNC, None, f"caught up from round {self.round} to {rnd}"))
        self.round = rnd
        self.future = [f for f in self.future if f.round >= rnd]
        return [LoadState(rnd, state), *self._serve_pulls()]

    def _step_running(self, now: float) -> list[CoreAction]:
        machine = self.machines[self.round]
        if self.received_state is not None and self.received_state[0] > self.round:
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
        self.notes.append(Note(NoteKind.RESTARTED, None, f"view epoch {view.epoch} for round {self.round}"))
        current.view = view
        del self.machines[self.round]
        return self._start_machine(current, now)

    def _abandon(self, now: float) -> list[CoreAction]:
        """Give the round up: the fleet is ahead and its state is here. Still reported."""
        current = self.current
        assert current is not None and self.received_state is not None
        self.notes.append(Note(NoteKind.ABANDONED, None, f"the fleet is at round {self.received_state[0]}"))
        del self.machines[self.round]  # its timers must not pull or retry for it any more
        report = self._report(None, now)
        self.phase = Phase.WAITING
        return [ReportRound(report)]

    def _finish_round(self, result: RoundResult, now: float) -> list[CoreAction]:
        current = self.current
        assert current is not None
        out: list[CoreAction] = []
        if self.received_state is not None and self.received_state[0] <= self.round:
            # A resync: the peer's state at the start of its round, the updates since again
            # (none when it is this round's), then this round's update.
            rnd, state = self.received_state
            out += [LoadState(rnd, state), *(ApplyUpdate(r, *self.applied[r]) for r in range(rnd, self.round))]
            self.notes.append(Note(NoteKind.RESYNC, None, f"state of round {rnd}"))
            self.received_state = None
        elif (why := resync_reason(result, current.own_hash)) is not None:
            # Our model now differs from the fleet's: fetch its state for the next round, first
            # from peers whose link worked this round (a cut link would cost a pull timeout).
            broken = {p for p, s in result.link_states.items() if s in ("failed", "rerouted")}
            out += self._request_resync(why, broken, now)
        cfg = self.config
        rate = scheduled_lr(cfg.lr, self.round, cfg.rounds, cfg.lr_schedule, cfg.lr_final)
        out.append(ApplyUpdate(self.round, result.values, rate))
        # Only the fleet's own update is replayed on its state: a fallback of ours to local
        # values (a one-way cut may make one every round) replayed on it made us drift again.
        self.applied = {r: u for r, u in self.applied.items() if self.round - REPLAY_ROUNDS < r < self.round}
        if not result.missing_chunks:
            self.applied[self.round] = (result.values, rate)
        report = self._report(result, now)
        self.round += 1
        out += self._serve_pulls()
        if self.done and self.transfer is not None:
            self.pending_report = report
            self.phase = Phase.FINAL_SYNC
            self.phase_deadline = now + cfg.allreduce.round_deadline
            return out
        self.phase = Phase.WAITING
        return out + self._close_round(report)

    def _end_final_sync(self, now: float) -> list[CoreAction]:
        """The last round fell back to our own gradient: the fleet's final state, fetched from
        lingering peers, replaces ours (or the wait ran out)."""
        self.phase_deadline = None
        out = self._install_fleet_state()
        report, self.pending_report = self.pending_report, None
        self.phase = Phase.WAITING
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
        computed = current.computed or now
        seconds = {"compute": computed - current.started, "allreduce": now - computed,
                   "wait": current.waited, "total": now - current.started + current.waited}
        report = RoundReport(
            round=self.round, epoch=current.view.epoch, members=len(current.view.members),
            loss=current.loss, result=result, phase_seconds=seconds, notes=self.notes,
            bytes_sent=self.counters.bytes_sent - current.bytes_sent,
            bytes_received=self.counters.bytes_received - current.bytes_received, ended_at=now)
        self.notes = []
        self.current = None
        return report

    def _start_linger(self, now: float) -> list[CoreAction]:
        """After the last round, keep answering pulls and NACKs for a while: a peer whose
        broadcast got lost must not find the fleet gone and end its last round degraded."""
        self.phase = Phase.LINGERING
        self.phase_deadline = now + self.config.linger
        return []

    # -- state transfer ---------------------------------------------------------------------

    def _request_resync(self, why: str, avoid: set[int], now: float) -> list[CoreAction]:
        self.notes.append(Note(NoteKind.DRIFT, None, why))
        view = self.membership.view_for(self.round)
        peers = self.membership.online_peers(view.members if view is not None else [])
        peers = sorted(peers, key=lambda p: p in avoid)  # stable: the usual order otherwise
        lean_on_coordinator = self.membership.coordinator() not in avoid
        if peers and not self._transfer_under_way(lean_on_coordinator):
            # Two peers a stripe each, as a joiner does (one peer's whole state every round
            # is what a flooder took), but in a dispute the coordinator's model is the
            # fleet's: several members may have drifted at once, and no two peers agree
            # until they took the coordinator's state, which it then serves whole. Not when
            # our link from the coordinator failed this round: its stripe would never come.
            return self._fetch_state(self.round + 1, peers, now, anchor_decides=lean_on_coordinator)
        return []

    def _transfer_under_way(self, lean_on_coordinator: bool) -> bool:
        """A resync transfer worth waiting for still: asked for fewer than REPLAY_ROUNDS
        rounds ago, and it moved on in this round (state came, or a dispute was taken to the
        anchor). One that got nothing all round is stuck (an anchor that gave its one stripe
        a round): a fresh pair is asked. So is one that does not lean on the coordinator
        when it could (a catch-up's, started while the broker was away, went on asking pairs
        of drifted peers)."""
        transfer, current = self.transfer, self.current
        return (transfer is not None and current is not None
                and (transfer.anchor_decides or not lean_on_coordinator)
                and transfer.round + REPLAY_ROUNDS > self.round
                and transfer.last_progress >= current.started)

    def _fell_behind(self, frame: Frame, now: float) -> list[CoreAction]:
        """Frames two rounds ahead of ours: the fleet went on without us (we ran a round to its
        deadline, or hung). Catching up round by round never ends; fetch the fleet's state."""
        self.counters.rejected["future_round"] += 1
        if (self.joining or self.transfer is not None or self.done
                or frame.sender not in self.membership.live()):
            return []  # a transfer under way takes any newer state than it asked for
        # One peer's word never makes us give our round up: two members must show it (or
        # the only other one, in a fleet that small).
        witnesses = self.ahead.setdefault(frame.round, set())
        witnesses.add(frame.sender)
        others = self.membership.online_peers(self.membership.live())
        if len(witnesses) < min(2, len(others)):
            return []
        self.notes.append(Note(NoteKind.BEHIND, frame.sender, f"at round {self.round}, peer at {frame.round}"))
        out = self._announce_absence(frame.round)  # we join again at frame.round + 1
        # Ask for the state of the round AFTER the peers': it is served as that round starts,
        # so we join it in step. Ask the coordinator first, then those who showed the round.
        first = [p for p in (self.membership.coordinator(),) if p is not None and p in others]
        order = list(dict.fromkeys([*first, *sorted(witnesses), *others]))
        return out + self._fetch_state(frame.round + 1, [p for p in order if p != self.node], now)

    def _fetch_state(self, round: int, peers: list[int], now: float,
                     anchor_decides: bool = False) -> list[CoreAction]:
        """Pull the fleet's state at the start of ``round`` (or later) from ``peers`` in turn;
        the coordinator, when among them, is the reference in a dispute."""
        coordinator = self.membership.coordinator()
        self.transfer = StateTransfer(self.node, self.job, round, peers, self.config.state_pull_timeout,
                                      now, size=self.config.state_size,
                                      chunk_values=self.config.state_chunk_values,
                                      anchor=coordinator if coordinator in peers else None,
                                      anchor_decides=anchor_decides)
        return self._run(self.transfer.start(now), self.round)

    def _on_state_frame(self, frame: Frame, now: float) -> list[CoreAction]:
        if self.transfer is None:
            # Nothing asked for it (or a late copy of a chunk a transfer no longer needs).
            self.counters.rejected[NoteKind.STATE_UNASKED] += 1
            return []
        actions = self.transfer.on_frame(frame, now)
        for note in actions:
            if isinstance(note, Note) and note.kind in REJECTED_STATE:
                self.counters.rejected[note.kind] += 1
        out = self._run(actions, self.round)
        if self.transfer.result is not None:
            rnd, state, _ = self.transfer.result
            if not np.all(np.isfinite(state)):
                # A peer's state with NaN or inf (buggy or hostile) is never installed: ask
                # the next peer for it.
                self.counters.rejected["state_not_finite"] += 1
                return out + self._run(self.transfer.reject("values not finite", now), self.round)
            self.transfer = None
            if rnd >= self.round or all(r in self.applied for r in range(rnd, self.round)):
                self.received_state = (rnd, state)
        return out

    def _tick_transfer(self, now: float) -> list[CoreAction]:
        transfer = self.transfer
        if transfer is None or (wake := transfer.next_timer()) is None or now < wake:
            return []
        if transfer.attempts >= PULL_TRIES_PER_PEER * len(transfer.peers):
            self.notes.append(Note(NoteKind.STATE_PULL_FAILED, transfer.peer, f"round {transfer.round}"))
            self.transfer = None
            return []
        return self._run(transfer.on_timer(now), self.round)

    def _serve_pulls(self) -> list[CoreAction]:
        """Answer pullers that asked for a round we are at (or before) with our state, which
        is always "the state at the start of self.round" (see the module's state contract)."""
        out: list[CoreAction] = []
        for puller, request in list(self.pending_pulls.items()):
            if request.round <= self.round:
                del self.pending_pulls[puller]
                if self.joining or self.phase == Phase.CONNECTING:
                    continue
                chunks = self._share_for(puller, request, self._stripe_limit(puller))
                if chunks == ():
                    continue  # nothing left for it this round (counted)
                out.append(SendState(request, self.round, chunks))
        return out

    def _stripe_limit(self, puller: int) -> int | None:
        """A puller (joining, behind or drifted) asks each peer for one stripe, two peers
        vouching for a state, so it gets at most one stripe of this round's state from us
        (None: no limit). Otherwise a device that keeps asking for everything took a whole
        state from us every round: 2.5x the root's normal round, for as long as it liked.
        Whole states go out only when we are its only source, when the run is over (the
        final sync) or when another member pulls from us in this round too: a fault that made
        several members drift at once (a broker restart, a root that dropped mid-round) may
        leave no two peers agreeing, and then the reference's word (the coordinator's) alone
        resyncs them (StateTransfer's ``anchor_decides``). One device cannot show that alone."""
        if self.config.state_size is None or self.phase == Phase.LINGERING or self._others_pull(puller):
            return None
        view = self.membership.view_for(self.round)
        sources = [m for m in (view.members if view is not None else [])
                   if m != puller and (m == self.node or self.membership.is_online(m))]
        if len(sources) < STATE_STRIPES:
            return None
        count = state_chunk_count(self.config.state_size, self.config.state_chunk_values)
        return -(-count // STATE_STRIPES)

    def _others_pull(self, puller: int) -> bool:
        """A member other than ``puller`` asked us for this round's state (served or due)."""
        due = {p for p, request in self.pending_pulls.items() if request.round <= self.round}
        served = {p for p, r in self.served if r == self.round}
        return bool((due | served) - {puller})

    def _share_for(self, puller: int, request: Frame, limit: int | None) -> tuple[int, ...] | None:
        """The state chunks ``puller`` gets of this round's state: what it asks for, less what
        it already got this round, so at most one state, and at most ``limit`` chunks in all
        (None: no state size to count with, the whole state once). () when nothing is left
        for it, counted: each chunk at most once per peer and round, so a pull flood costs
        the flooder, not us."""
        if self.config.state_size is None:
            first = (puller, self.round) not in self.served
            self.served.setdefault((puller, self.round), set())
            if not first:
                self.counters.rejected["model_pull_repeat"] += 1
            return None if first else ()
        count = state_chunk_count(self.config.state_size, self.config.state_chunk_values)
        sent = self.served.setdefault((puller, self.round), set())
        fresh = tuple(j for j in (request.indices() or range(count)) if 0 <= j < count and j not in sent)
        chunks = fresh if limit is None else fresh[: max(0, limit - len(sent))]
        if not chunks:
            self.counters.rejected["model_pull_budget" if fresh else "model_pull_repeat"] += 1
        sent.update(chunks)
        return chunks

    # -- plumbing ---------------------------------------------------------------------------

    def _run(self, actions: list[Send | Fanout | Note], round: int) -> list[CoreAction]:
        """A round machine's actions: notes are kept for the report, frames go out, and a
        peer found silent is reported to the fleet (once per round)."""
        out: list[CoreAction] = []
        for action in actions:
            if isinstance(action, Send | Fanout):
                self.counters.bytes_sent += frame_size(action.frame)
                out.append(action)
                continue
            self.notes.append(action)
            if action.kind == NoteKind.SILENT and action.peer is not None and (action.peer, round) not in self.reported:
                self.reported.add((action.peer, round))
                out.append(PublishSuspect(Suspect(self.node, round, action.peer, self.incarnation)))
        return out

    def _take_future(self, round: int) -> list[Frame]:
        now_round = [f for f in self.future if f.round == round]
        self.future = [f for f in self.future if f.round > round]
        return now_round


def telemetry_for(core: AgentCore, report: RoundReport, *, algorithm: str, model_hash: int,
                  wall_time: float, machine: str = "", reduced_at: float = 0.0) -> Telemetry:
    """The telemetry message of one reported round; ``reduced_at``: the wall-clock time the
    round's allreduce ended (0: not said)."""
    result = report.result
    stats = result.stats if result is not None else None
    contributors = set().union(*result.contributors) if result is not None and result.contributors else set()
    return Telemetry(
        node=core.node, round=report.round, epoch=report.epoch, algorithm=algorithm,
        wall_time=wall_time, loss=_finite(report.loss), accuracy=report.accuracy,
        phase_seconds={k: round(v, 6) for k, v in report.phase_seconds.items()},
        bytes_sent=report.bytes_sent, bytes_received=report.bytes_received,
        contributors=len(contributors), members=report.members,
        reroutes=stats.reroutes if stats else 0, timeouts=stats.timeouts if stats else 0,
        nacks=stats.nacks if stats else 0, pulls=stats.pulls if stats else 0,
        retransmits=stats.retransmits if stats else 0,
        wire_frames=dict(stats.wire_frames) if stats else {},
        degraded=report.degraded,
        missing_chunks=len(result.missing_chunks) if result is not None else 0,
        rejected=dict(core.counters.rejected),
        links={str(k): v for k, v in result.link_states.items()} if result is not None else {},
        model_hash=f"{model_hash:08x}",
        events=[{"kind": n.kind, "peer": n.peer, "detail": n.detail} for n in report.notes][:50],
        machine=machine, reduced_at=reduced_at,
    )


def _finite(value: float) -> float | None:
    """JSON has no NaN: a diverged loss travels as null."""
    return value if np.isfinite(value) else None
