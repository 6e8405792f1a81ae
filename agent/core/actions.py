"""What an agent core asks its driver to do: a closed union of typed actions.

Everything that leaves the agent is one ``Publish``: which kind of topic it goes to, and with
it whether the broker retains it and whether it must survive a reconnect, are decided here
once (``DELIVERY``), for the real transport and the in-memory fleet alike.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from agent.core.report import RoundReport
from agent.protocol.membership import Refusal
from agent.protocol.messages import Control, StateDigest, Status, Suspect, Telemetry, View
from agent.protocol.topics import Topics
from agent.protocol.wire import Frame, encode


class Channel(enum.Enum):
    LINK = "link"  # a frame for one peer
    FANOUT = "fanout"  # a round's result, once for every member (this node as the round's root)
    STATUS = "status"
    VIEW = "view"
    SUSPECT = "suspect"
    TELEMETRY = "telemetry"
    STATE = "state"  # the digest of our state for a round


@dataclass(frozen=True)
class Delivery:
    retain: bool  # the broker keeps the last one for every later subscriber
    reliable: bool  # QoS 1: kept while the connection is down and delivered after a reconnect


DELIVERY: dict[Channel, Delivery] = {
    # A frame late is useless to a round: QoS 0, the round's timeouts deal with the loss.
    Channel.LINK: Delivery(retain=False, reliable=False),
    Channel.FANOUT: Delivery(retain=False, reliable=False),
    # Who is alive and the fleet's view: what a (re)joining member reads first.
    Channel.STATUS: Delivery(retain=True, reliable=True),
    Channel.VIEW: Delivery(retain=True, reliable=True),
    # A report of silence that cannot go out now (broker away) is stale later.
    Channel.SUSPECT: Delivery(retain=False, reliable=False),
    Channel.TELEMETRY: Delivery(retain=False, reliable=True),
    # A joiner reads the coordinator's last announcement first; a stale one is useless.
    Channel.STATE: Delivery(retain=True, reliable=False),
}

Message = Frame | Status | View | Suspect | Telemetry | StateDigest


@dataclass(frozen=True)
class Publish:
    """Publish ``message`` as node ``node`` on the topic of ``channel`` (``dst``: a link's)."""

    channel: Channel
    node: int
    message: Message
    dst: int | None = None

    @classmethod
    def frame_to(cls, node: int, dst: int, frame: Frame) -> Publish:
        return cls(Channel.LINK, node, frame, dst)

    @classmethod
    def fanout(cls, node: int, frame: Frame) -> Publish:
        return cls(Channel.FANOUT, node, frame)

    @classmethod
    def status_of(cls, status: Status) -> Publish:
        return cls(Channel.STATUS, status.node, status)

    @classmethod
    def view_by(cls, node: int, view: View) -> Publish:
        return cls(Channel.VIEW, node, view)

    @classmethod
    def suspect(cls, report: Suspect) -> Publish:
        return cls(Channel.SUSPECT, report.node, report)

    @classmethod
    def telemetry(cls, telemetry: Telemetry) -> Publish:
        return cls(Channel.TELEMETRY, telemetry.node, telemetry)

    @classmethod
    def state_digest(cls, digest: StateDigest) -> Publish:
        return cls(Channel.STATE, digest.node, digest)

    @property
    def retain(self) -> bool:
        return DELIVERY[self.channel].retain

    @property
    def reliable(self) -> bool:
        return DELIVERY[self.channel].reliable

    @property
    def frame(self) -> Frame:
        assert isinstance(self.message, Frame), self
        return self.message

    def topic(self, topics: Topics) -> str:
        channel, node = self.channel, self.node
        if channel is Channel.LINK:
            assert self.dst is not None
            return topics.link(node, self.dst)
        if channel is Channel.FANOUT:
            return topics.fanout(node)
        if channel is Channel.STATUS:
            return topics.status(node)
        if channel is Channel.VIEW:
            return topics.view_of(node)
        if channel is Channel.SUSPECT:
            return topics.suspect(node)
        if channel is Channel.STATE:
            return topics.state(node)
        return topics.telemetry(node)

    def payload(self) -> bytes:
        message = self.message
        return encode(message) if isinstance(message, Frame) else message.encode()


@dataclass(frozen=True)
class ComputeGradient:
    """Compute round ``round``'s gradient on the current state; answer with ``GradientReady``.
    ``local_steps`` (periodic averaging): take that many local optimizer steps from the synced
    state and answer with their model delta instead."""

    round: int
    members: tuple[int, ...]
    local_steps: int | None = None


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
    """Answer ``request`` (a MODEL_PULL) with the current state: ``AgentCore.state_frames``
    builds the frames."""

    request: Frame
    round: int
    chunks: tuple[int, ...] | None = None  # the chunks to send (None: what the request asks)


@dataclass(frozen=True)
class AnnounceState:
    """Announce the digest of the current state, ours at the start of ``round``: publish
    what ``AgentCore.announcement`` builds from it."""

    round: int


@dataclass(frozen=True)
class SaveCheckpoint:
    round: int
    epoch: int


@dataclass(frozen=True)
class ApplyControl:
    """A fault-injection command for this node's transport (simulator only)."""

    control: Control


@dataclass(frozen=True)
class ReportRound:
    report: RoundReport


@dataclass(frozen=True)
class Displaced:
    """A newer process runs as this node (same id and credentials): stop, without fighting
    for the session and without taking it offline (no offline status, no checkpoint)."""

    by_incarnation: int
    pid: int | None


@dataclass(frozen=True)
class FleetFinished:
    """The fleet ran its last round while we were away (cut off, hung): nothing is left to
    join and nobody serves a state any more. Say so and stop (exit status 0)."""

    rounds: int
    members: tuple[int, ...]
    round: int  # ours: the last round we ran with the fleet

    def line(self) -> str:
        return (f"the fleet finished its {self.rounds} rounds while this agent was away (at round "
                f"{self.round}; members {list(self.members)} all done): nothing left to join, exiting")


CoreAction = (Publish | ComputeGradient | ApplyUpdate | LoadState | SendState | AnnounceState | SaveCheckpoint
              | ApplyControl | ReportRound | Displaced | Refusal | FleetFinished)
