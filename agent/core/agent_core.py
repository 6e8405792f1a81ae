"""The agent core: everything one agent decides, written once, with no IO (sans-IO, like h11).

``AgentCore.handle(event, now) -> actions`` is the one entry point; it only dispatches each
event to the part that handles it, then lets the steps move on:

- events.py: what comes in, a closed union; inbox.py decodes and checks bytes;
- actions.py: what goes out; every message is one ``Publish`` (topic, retain, QoS);
  dispatch.py: the one table both drivers execute actions by;
- progress.py: the phases, their one transition table, and ``Progress``, the owner of the
  phase, the round and the round under way; steps.py: the steps between the phases (connect,
  join, start and finish a round, final sync, linger) in one table, ``ADVANCE``;
- intake.py: frames in; presence.py: statuses, views and our broker connection;
  silence.py: reports of silence and absence; suspicion.py: what we did about them;
- rounds.py: the round machines in flight and the frames of rounds not started yet;
  wills.py: the grace a round gives its root's Will; gate.py: whether a round may start;
  chunks.py: a round's chunk size and broadcast; period.py: its local steps;
- state_server.py: serving our state; state_fetch.py: fetching the fleet's;
- outbox.py: frames, notes and reports of silence out; report.py: a round's report;
- parts.py: the parts above, built once and wired; config.py: the core's configuration.

``next_deadline()`` says when the core next needs a ``Tick``. Every call takes ``now``; the
core never reads a clock.

Two drivers execute the actions: ``agent/runtime.py`` (the agent users run: MQTT, the
monotonic clock, the model backend, checkpoint files) and ``simulate/virtual_fleet.py`` (N
cores on the in-memory bus in fake time, for tests and ``analyze fault-cost``), both through
dispatch.py. Neither makes a protocol decision of its own.

State contract with the driver: between the ``ApplyUpdate`` of round r - 1 and the one of round
r, the driver's training state is the state at the start of round r. ``SendState`` is always
answered with that state, so it is executed in order with the other actions.
"""

from __future__ import annotations

from typing import assert_never

import numpy as np

from agent.core.actions import AnnounceState, ApplyControl, CoreAction, Publish, SendState
from agent.core.config import CoreConfig
from agent.core.events import (
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
from agent.core.inbox import LinkFrame
from agent.core.intake import FrameIntake
from agent.core.parts import CoreParts
from agent.core.presence import Presence
from agent.core.progress import Phase, Progress
from agent.core.silence import SilenceReports
from agent.core.steps import Steps
from agent.protocol.allreduce import frame_size
from agent.protocol.messages import NodeState, Status
from agent.protocol.notes import NoteKind

CONNECT_WAIT = 10.0  # seconds to wait for our own retained status to come back from the broker


class AgentCore:
    """One agent's decisions: ``handle`` takes every event in and hands it to its handler."""

    def __init__(self, config: CoreConfig, incarnation: int, *, resumed_round: int | None = None,
                 resumed_age: float = 0.0, pid: int = 0, now: float = 0.0) -> None:
        self.parts = CoreParts(config, incarnation, pid, now)
        # A checkpoint's round was the fleet's when it was written, ``resumed_age`` s ago.
        self.progress = Progress(rounds=config.rounds, resumed_round=resumed_round,
                                 round_known_at=now - resumed_age, deadline=now + CONNECT_WAIT)
        self.steps = Steps(self.parts, self.progress)
        self.intake = FrameIntake(self.parts, self.progress, self.steps)
        self.presence = Presence(self.parts, self.progress, self.steps)
        self.silence = SilenceReports(self.parts, self.progress, self.steps)

    # -- queries ----------------------------------------------------------------------------

    @property
    def phase(self) -> Phase:
        return self.progress.phase

    @property
    def round(self) -> int:
        return self.progress.round

    @property
    def done(self) -> bool:
        return self.progress.done

    def status(self, state: NodeState) -> Status:
        return self.parts.status(state, self.progress.round)

    def subscriptions(self) -> list[str]:
        parts, topics = self.parts, self.parts.topics
        fanout = [topics.all_fanout()] if parts.chunks.listens_to_fanout() else []
        bridges = [topics.all_bridges()] if parts.config.site else []
        return [topics.links_to(parts.node), topics.all_status(), topics.all_views(),
                topics.control, topics.all_suspect(), topics.all_states(), *fanout, *bridges]

    def next_deadline(self) -> float | None:
        parts, phase = self.parts, self.progress.phase
        membership = parts.membership
        times = parts.rounds.deadlines()
        if (t := parts.fetch.next_timer()) is not None:
            times.append(t)
        if self.progress.deadline is not None:
            times.append(self.progress.deadline)
        if phase == Phase.WAITING and membership.views.latest is None:
            times.append(membership.gate.started_at + membership.gate.join_grace)  # the start-up gate opens by time
        if phase == Phase.WAITING and parts.gate.root_wait_until is not None:
            times.append(parts.gate.root_wait_until)
        if phase == Phase.WAITING and parts.rounds.settle_until > membership.now:
            times.append(parts.rounds.settle_until)  # the round start a long absence held
        if (t := membership.next_check()) is not None:
            times.append(t)
        return min(times) if times else None

    def state_frames(self, action: SendState, state: np.ndarray) -> list[Publish]:
        """The MODEL frames answering ``action`` with ``state`` (the driver's current state)."""
        return [self.parts.outbox.frame(send.dst, send.frame) for send in self.parts.server.frames(action, state)]

    def announcement(self, action: AnnounceState, state: np.ndarray) -> Publish | None:
        """The digest of ``state`` (ours at the start of ``action.round``) announced on our own
        state topic; None when that round's was announced already."""
        digest = self.parts.server.announcement(action, state)
        return Publish.state_digest(digest) if digest is not None else None

    # -- the one entry point ----------------------------------------------------------------

    def handle(self, event: CoreEvent, now: float) -> list[CoreAction]:
        """Everything that happens to the agent comes in here; what it decides comes out."""
        parts = self.parts
        match event:
            case MessageArrived(topic, payload, arrival):
                read = parts.inbox.read(topic, payload, arrival)
                if read is None:
                    return self.silence.refused(now)
                return self.intake.link_frame(read, now) if isinstance(read, LinkFrame) else self.handle(read, now)
            case FrameArrived(frame):
                parts.counters.bytes_received += frame_size(frame)
                return self.intake.frame(frame, now)
            case StatusSeen(status):
                return self.presence.status(status, now)
            case BridgeSeen(site, up):
                return [] if up else self.presence.bridge_down(site, now)
            case ViewSeen(view, publisher):
                return self.presence.view(view, now, publisher)
            case SuspectSeen(report):
                return self.silence.suspect(report, now)
            case DigestSeen(digest):
                return parts.fetch.announced(digest, now, self.progress.round) + self.steps.advance(now)
            case ControlSeen(control):
                return [ApplyControl(control)] if control.node == parts.node else []
            case GradientReady():
                return self.steps.gradient_ready(event, now)
            case Tick():
                return self._tick(now)
            case Disconnected():
                return self.presence.disconnected(now)
            case Reconnected():
                return self.presence.reconnected(now)
            case Arriving(topic):
                sender = parts.inbox.busy_sender(topic)
                return [] if sender is None else self.intake.busy_link(sender, now)
            case Sending():
                return self.intake.busy_link(None, now)
            case FaultInjected(peer, action):
                parts.outbox.note(NoteKind.FAULT_INJECTED, peer, action)
                return []
            case PublishFailed():
                parts.counters.rejected["publish_failed"] += 1
                return []
            case _:
                assert_never(event)

    def _tick(self, now: float) -> list[CoreAction]:
        parts = self.parts
        out = parts.rounds.timers(now)
        out += parts.fetch.tick(now, self.progress.round, joining=self.progress.joining)
        out += parts.outbox.views(parts.membership.check(now))
        out += self.silence.verdicts(now)
        if self.progress.expired(now):
            out += self.steps.phase_expired(now)
        return out + self.steps.advance(now)
