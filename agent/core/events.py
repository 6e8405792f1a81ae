"""Everything that can happen to an agent core: a closed union of typed events.

``AgentCore.handle(event, now)`` is the one entry point. A driver hands over what its
transport delivered (``MessageArrived``: topic and bytes, decoded and checked by the core)
and what its transport observed about the connection (``Disconnected``, ``Reconnected``,
``Arriving``, ``Sending``), the gradient it was asked for, and the passing of time (``Tick``).
Tests and tools may hand over messages already decoded (``FrameArrived``, ``StatusSeen``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agent.protocol.messages import Control, StateDigest, Status, Suspect, View
from agent.protocol.wire import Frame


@dataclass(frozen=True)
class MessageArrived:
    """One message as the broker delivered it. ``arrival``: seconds a large one took to
    arrive, first byte to last (0: untimed, as if at once), what the coordinator picks the
    fleet's chunk size from."""

    topic: str
    payload: bytes
    arrival: float = 0.0


@dataclass(frozen=True)
class FrameArrived:
    """A frame already decoded and checked (its size is counted as received)."""

    frame: Frame


@dataclass(frozen=True)
class StatusSeen:
    status: Status


@dataclass(frozen=True)
class BridgeSeen:
    """A site's bridge to the core went up or down (its broker's notification)."""

    site: str
    up: bool


@dataclass(frozen=True)
class ViewSeen:
    """A view; ``publisher`` is the id its topic names (None: given locally, trusted)."""

    view: View
    publisher: int | None = None


@dataclass(frozen=True)
class SuspectSeen:
    """A member's report that a peer is silent, or that it takes no part in some rounds."""

    report: Suspect


@dataclass(frozen=True)
class DigestSeen:
    """A member's announcement of its state's digest for a round (from its own topic)."""

    digest: StateDigest


@dataclass(frozen=True)
class ControlSeen:
    """A fault-injection command (simulator and dashboard only)."""

    control: Control


@dataclass(frozen=True)
class GradientReady:
    """The gradient asked for by ``ComputeGradient``; ``compute_seconds``, when the driver
    measured it, is the compute phase (else: since the request, which may include an
    evaluation run first)."""

    round: int
    loss: float
    gradient: np.ndarray
    model_hash: int
    compute_seconds: float | None = None


@dataclass(frozen=True)
class Tick:
    """Time passed (``next_deadline`` says when the core next needs one)."""


@dataclass(frozen=True)
class Disconnected:
    """The connection to the broker dropped."""


@dataclass(frozen=True)
class Reconnected:
    """The connection to the broker is back; the broker may have lost every retained message."""


@dataclass(frozen=True)
class Arriving:
    """A large message on ``topic`` is still arriving, piece by piece: our downlink is slow."""

    topic: str


@dataclass(frozen=True)
class Sending:
    """What we published is still waiting to leave: our uplink is slow."""


@dataclass(frozen=True)
class FaultInjected:
    """The driver's transport took a fault-injection command (recorded for the report)."""

    peer: int | None
    action: str


@dataclass(frozen=True)
class PublishFailed:
    """The driver could not publish (the broker is away): counted as rejected output."""


CoreEvent = (MessageArrived | FrameArrived | StatusSeen | BridgeSeen | ViewSeen | SuspectSeen | DigestSeen | ControlSeen
             | GradientReady | Tick | Disconnected | Reconnected | Arriving | Sending
             | FaultInjected | PublishFailed)
