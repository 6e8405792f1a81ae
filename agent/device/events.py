"""What reaches the device core: a closed union of events (bytes as they came off the wire).

A signed message comes with the driver's verdict on its signature (agent/device/verifier.py):
the core decides what a verified or refused message means, and imports no cryptography."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from agent.jobs.envelope import Verdict
from agent.jobs.states import RejectReason


@dataclass(frozen=True)
class Booted:
    """The state directory's record of the job this device was running, and the jobs done."""

    envelope: bytes | None  # the signed spec of the job in progress (None: idle)
    verdict: Verdict | None = None  # on the envelope's signature (the driver checks it)
    seq: int = 0
    finished: tuple[tuple[str, float], ...] = ()  # (job, submitted_at) this device ended


@dataclass(frozen=True)
class SpecArrived:
    job: str
    raw: bytes  # the signed envelope; b"": the operator cleared the job
    verdict: Verdict | None = None  # on its signature (None only for b"")


@dataclass(frozen=True)
class ControlArrived:
    job: str
    raw: bytes
    verdict: Verdict | None = None


@dataclass(frozen=True)
class ExecArrived:
    """A retained execution state (ours from before a restart, or another device's)."""

    job: str
    device: str
    raw: bytes


@dataclass(frozen=True)
class ChunkArrived:
    sha256: str
    index: int
    data: bytes


@dataclass(frozen=True)
class BlobOnDisk:
    """The model file of ``sha256`` is in the state directory already, its hash checked."""

    sha256: str


@dataclass(frozen=True)
class Prepared:
    """The device loaded the job's model and its data (reason None) or could not."""

    job: str
    reason: RejectReason | None = None
    detail: str = ""


@dataclass(frozen=True)
class RoundReported:
    job: str
    round: int
    loss: float
    accuracy: float | None


class Outcome(enum.Enum):
    COMPLETED = "completed"  # the runtime reached its rounds
    STOPPED = "stopped"  # we asked it to stop (control, target accuracy, deadline)
    FAILED = "failed"  # with the log line


@dataclass(frozen=True)
class TrainingEnded:
    job: str
    outcome: Outcome
    round: int
    detail: str = ""
    coordinator: bool = False  # this node was the lowest live member of the final view


@dataclass(frozen=True)
class Tick:
    """Time passed (deadlines, the start-up settling, the record's heartbeat)."""


DeviceEvent = (Booted | SpecArrived | ControlArrived | ExecArrived | ChunkArrived | BlobOnDisk
               | Prepared | RoundReported | TrainingEnded | Tick)
