"""What the device core asks its driver to do: a closed union of typed actions."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from agent.jobs.document import BlobRef, ExecStatus, JobSpec
from agent.jobs.states import ExecState


@dataclass(frozen=True)
class PublishExec:
    status: ExecStatus


@dataclass(frozen=True)
class PublishRecord:
    """The device record changed (state, job, queue, refusals) or is due again."""


@dataclass(frozen=True)
class FetchBlob:
    """Get the model file: from the state directory if there, else its retained chunks."""

    blob: BlobRef


@dataclass(frozen=True)
class StoreBlob:
    """The whole file arrived and its sha256 matches: keep it, stop listening for chunks."""

    blob: BlobRef
    data: bytes


@dataclass(frozen=True)
class DropBlob:
    """Stop listening for the chunks of ``sha256`` (bad hash, the job went away)."""

    sha256: str


@dataclass(frozen=True)
class PrepareJob:
    """Load the model and this device's data, check memory and the model (answer: Prepared)."""

    spec: JobSpec
    node: int


@dataclass(frozen=True)
class StartTraining:
    spec: JobSpec
    node: int
    envelope: bytes


@dataclass(frozen=True)
class StopTraining:
    job: str
    ending: ExecState  # succeeded (target), canceled (control), timed_out (deadline)


@dataclass(frozen=True)
class PublishResult:
    """This device's node coordinated the job's end: publish the trained parameters."""

    job: str
    states: dict[str, ExecState]  # every device's last known state of the job


@dataclass(frozen=True)
class Persist:
    """Write the state directory's record: the job in progress and the jobs ended."""

    envelope: bytes | None
    seq: int
    finished: tuple[tuple[str, float], ...]


class Level(enum.Enum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


@dataclass(frozen=True)
class LogLine:
    level: Level
    line: str


DeviceAction = (PublishExec | PublishRecord | FetchBlob | StoreBlob | DropBlob | PrepareJob
                | StartTraining | StopTraining | PublishResult | Persist | LogLine)
