"""The device's decisions, sans-IO: ``DeviceCore.handle(event, now) -> actions``.

What to do with a job document, a control, a model-file chunk, an execution state, the end of
training, the passing of time. ``now`` is the wall clock in UTC seconds (a job's deadline is
one), injected; the core reads no clock, file or socket, so its tests need no broker and no
sleep. One job runs at a time, the others wait in submitted order.
"""

from __future__ import annotations

import enum
import hashlib
from collections import Counter
from dataclasses import dataclass, field

from pydantic import ValidationError

from agent.device.actions import (
    DeviceAction,
    DropBlob,
    FetchBlob,
    Level,
    LogLine,
    Persist,
    PrepareJob,
    PublishExec,
    PublishRecord,
    PublishResult,
    StartTraining,
    StopTraining,
    StoreBlob,
)
from agent.device.events import (
    BlobOnDisk,
    Booted,
    ChunkArrived,
    ControlArrived,
    DeviceEvent,
    ExecArrived,
    Outcome,
    Prepared,
    RoundReported,
    SpecArrived,
    Tick,
    TrainingEnded,
)
from agent.jobs.document import BlobRef, ControlMessage, ExecStatus, JobSpec
from agent.jobs.envelope import Refused, Verdict, open_verified
from agent.jobs.states import ControlAction, DeviceState, ExecState, RejectReason
from agent.validate import one_line

SETTLE_S = 1.0  # after start: the retained specs, controls and our exec states all come in
BLOB_TIMEOUT_S = 300.0  # a model file's chunks must all arrive within this
EXEC_EVERY_S = 1.0  # a training execution's state at most this often (its round)
RECORD_EVERY_S = 60.0  # the device record again (last seen)


@dataclass(frozen=True)
class Capabilities:
    """What this device can run: the static half of the accept checks."""

    device: str
    data_sources: frozenset[str]
    backends: frozenset[str]
    labels: tuple[tuple[str, str], ...] = ()


class Stage(enum.Enum):
    QUEUED = "queued"
    DOWNLOADING = "downloading"
    PREPARING = "preparing"
    TRAINING = "training"


@dataclass
class Execution:
    """One job this device holds, queued or current."""

    spec: JobSpec
    envelope: bytes
    node: int
    stage: Stage = Stage.QUEUED
    round: int | None = None
    accuracy: float | None = None
    ending: ExecState | None = None  # a stop was asked: how this execution ends
    chunks: dict[int, bytes] = field(default_factory=dict)
    download_deadline: float = 0.0
    reported_at: float = 0.0  # when its training state was last published

    @property
    def job(self) -> str:
        return self.spec.name

    @property
    def blob(self) -> BlobRef | None:
        return self.spec.model if isinstance(self.spec.model, BlobRef) else None


@dataclass(frozen=True)
class Summary:
    """The core's part of the device record."""

    state: DeviceState
    job: str | None
    node: int | None
    queued: list[str]
    refused: dict[str, int]


class DeviceCore:
    def __init__(self, capabilities: Capabilities, now: float) -> None:
        self.caps = capabilities
        self.settle_at = now + SETTLE_S
        self.settled = False
        self.pending: dict[str, tuple[bytes, Verdict]] = {}  # specs that came before settling
        self.queue: list[Execution] = []
        self.current: Execution | None = None
        self.finished: dict[str, float] = {}  # job -> submitted_at of the run that ended here
        self.stops: dict[str, float] = {}  # job -> issued_at of its signed stop
        self.seqs: dict[str, int] = {}
        self.own: dict[str, ExecStatus] = {}  # our retained exec states (from before a restart)
        self.others: dict[str, dict[str, ExecState]] = {}
        self.refused: Counter[RejectReason] = Counter()
        self.refused_seen: set[str] = set()  # sha256 of refused messages: counted once
        self.record_due = now + RECORD_EVERY_S

    @property
    def device(self) -> str:
        return self.caps.device

    def summary(self) -> Summary:
        ex = self.current
        return Summary(DeviceState.TRAINING if ex else DeviceState.IDLE, ex.job if ex else None,
                       ex.node if ex else None, [q.job for q in self.queue],
                       {r.value: n for r, n in sorted(self.refused.items())})

    def handle(self, event: DeviceEvent, now: float) -> list[DeviceAction]:
        match event:
            case Booted():
                return self._booted(event, now)
            case SpecArrived():
                return self._spec_arrived(event, now)
            case ControlArrived():
                return self._control(event, now)
            case ExecArrived():
                return self._exec_arrived(event)
            case ChunkArrived():
                return self._chunk(event, now)
            case BlobOnDisk():
                return self._blob_ready(event.sha256, None)
            case Prepared():
                return self._prepared(event, now)
            case RoundReported():
                return self._round(event, now)
            case TrainingEnded():
                return self._ended(event, now)
            case Tick():
                return self._tick(now)

    # -- start-up -----------------------------------------------------------------------------

    def _booted(self, event: Booted, now: float) -> list[DeviceAction]:
        """Connected and subscribed: the retained messages come in for SETTLE_S from now."""
        self.settle_at = now + SETTLE_S
        self.finished.update(dict(event.finished))
        if event.envelope is not None and event.verdict is not None:
            # The job in progress when the device went down: resumed as the same node once
            # settled (its signature checked again, like any spec's).
            try:
                job = open_verified(event.verdict, JobSpec).name
            except Refused as refusal:
                return [LogLine(Level.WARNING, f"the state directory's job is not resumed: {refusal}")]
            self.pending[job] = (event.envelope, event.verdict)
            self.seqs[job] = max(self.seqs.get(job, 0), event.seq)
        return []

    def _settle(self, now: float) -> list[DeviceAction]:
        self.settled = True
        opened = []
        for job, (raw, verdict) in self.pending.items():
            try:
                at = open_verified(verdict, JobSpec).submitted_at
            except Refused:
                at = 0.0  # refused (and said why) first
            opened.append((at, job, raw, verdict))
        self.pending.clear()
        actions: list[DeviceAction] = [PublishRecord()]
        for _, job, raw, verdict in sorted(opened, key=lambda o: (o[0], o[1])):
            actions += self._spec(job, raw, verdict, now)
        return actions

    # -- job documents ------------------------------------------------------------------------

    def _spec_arrived(self, event: SpecArrived, now: float) -> list[DeviceAction]:
        if not event.raw or event.verdict is None:
            return self._withdrawn(event.job, now)
        if not self.settled:
            self.pending[event.job] = (event.raw, event.verdict)
            return []
        return self._spec(event.job, event.raw, event.verdict, now)

    def _spec(self, job: str, raw: bytes, verdict: Verdict, now: float) -> list[DeviceAction]:
        try:
            spec = open_verified(verdict, JobSpec)
        except Refused as refusal:
            return self._refuse_message(job, raw, refusal.reason, f"job {job}: {refusal}", now)
        if spec.name != job:
            return self._refuse_message(job, raw, RejectReason.INVALID_DOCUMENT,
                                        f"job {job}: the document names job {spec.name}", now)
        node = spec.node_of(self.device)
        if node is None:
            return self._passed_over(spec, raw, now)
        if self._known(spec):
            return []  # already held, or ended here
        problem = self._cannot_run(spec)
        if problem is not None:
            reason, line = problem
            return self._refuse_message(job, raw, reason, line, now, node)
        ex = Execution(spec, raw, node)
        ending = self._ended_before_start(spec, now)
        if ending is not None:
            return self._finish(ex, ending, now, "")
        self.queue.append(ex)
        self.queue.sort(key=lambda q: (q.spec.submitted_at, q.job))
        return [self._status(ex, ExecState.QUEUED, now), PublishRecord(), *self._advance(now)]

    def _passed_over(self, spec: JobSpec, raw: bytes, now: float) -> list[DeviceAction]:
        """Not assigned: ``job submit`` leaves out a device the selector picks but that lacks
        the data source; that device says so itself (rejected, no_data_source)."""
        picked = spec.selector.matches(self.device, dict(self.caps.labels))
        if not picked or spec.data in self.caps.data_sources or self._known(spec):
            return []
        have = ", ".join(sorted(self.caps.data_sources)) or "none"
        return self._refuse_message(spec.name, raw, RejectReason.NO_DATA_SOURCE,
                                    f"job {spec.name}: no data source {spec.data!r} here (have: {have})", now)

    def _known(self, spec: JobSpec) -> bool:
        held = [e for e in [self.current, *self.queue] if e is not None and e.job == spec.name]
        if held:
            return True
        if self.finished.get(spec.name, -1.0) >= spec.submitted_at:
            return True
        own = self.own.get(spec.name)
        # Ended here before a restart that lost the state directory: the retained state says so.
        return own is not None and own.state.terminal and own.updated_at >= spec.submitted_at

    def _cannot_run(self, spec: JobSpec) -> tuple[RejectReason, str] | None:
        if spec.data not in self.caps.data_sources:
            have = ", ".join(sorted(self.caps.data_sources)) or "none"
            return RejectReason.NO_DATA_SOURCE, f"job {spec.name}: no data source {spec.data!r} here (have: {have})"
        if spec.backend not in self.caps.backends:
            return RejectReason.BACKEND_MISSING, f"job {spec.name}: backend {spec.backend} is not available here"
        return None

    def _ended_before_start(self, spec: JobSpec, now: float) -> ExecState | None:
        if self.stops.get(spec.name, -1.0) >= spec.submitted_at:
            return ExecState.CANCELED
        if spec.stop.deadline is not None and now >= spec.stop.deadline:
            return ExecState.TIMED_OUT
        return None

    def _withdrawn(self, job: str, now: float) -> list[DeviceAction]:
        """The operator cleared the job's retained document: forget it if it waits here."""
        self.pending.pop(job, None)
        waiting = [q for q in self.queue if q.job == job]
        self.queue = [q for q in self.queue if q.job != job]
        actions: list[DeviceAction] = []
        for ex in waiting:
            actions += self._finish(ex, ExecState.CANCELED, now, "the job was withdrawn")
        return actions

    # -- refusals -----------------------------------------------------------------------------

    def _refuse_message(self, job: str, raw: bytes, reason: RejectReason, line: str, now: float,
                        node: int | None = None) -> list[DeviceAction]:
        digest = hashlib.sha256(raw).hexdigest()
        if digest in self.refused_seen:
            return []  # the same retained message again (a reconnect): counted once
        self.refused_seen.add(digest)
        self.refused[reason] += 1
        status = self._new_status(job, node, ExecState.REJECTED, now, reason=reason, detail=line)
        return [PublishExec(status), LogLine(Level.WARNING, line), PublishRecord()]

    # -- the queue ----------------------------------------------------------------------------

    def _advance(self, now: float) -> list[DeviceAction]:
        if self.current is not None or not self.queue or not self.settled:
            return []
        ex = self.current = self.queue.pop(0)
        actions: list[DeviceAction] = [self._status(ex, ExecState.ACCEPTED, now), self._persist(),
                                       PublishRecord()]
        blob = ex.blob
        if blob is None:
            ex.stage = Stage.PREPARING
            return [*actions, PrepareJob(ex.spec, ex.node)]
        ex.stage = Stage.DOWNLOADING
        ex.download_deadline = now + BLOB_TIMEOUT_S
        return [*actions, self._status(ex, ExecState.DOWNLOADING, now), FetchBlob(blob)]

    def _finish(self, ex: Execution, state: ExecState, now: float, detail: str,
                reason: RejectReason | None = None) -> list[DeviceAction]:
        """``ex`` ends in ``state`` (terminal): said, remembered, and the next job starts."""
        self.finished[ex.job] = ex.spec.submitted_at
        actions: list[DeviceAction] = [self._status(ex, state, now, detail=detail, reason=reason)]
        if ex is self.current:
            self.current = None
            if ex.stage is Stage.DOWNLOADING and ex.blob is not None:
                actions.append(DropBlob(ex.blob.sha256))
        if reason is not None:
            self.refused[reason] += 1
            actions.append(LogLine(Level.WARNING, detail))
        elif state is ExecState.FAILED:
            actions.append(LogLine(Level.ERROR, f"job {ex.job} failed: {detail}"))
        return [*actions, self._persist(), PublishRecord(), *self._advance(now)]

    # -- controls -----------------------------------------------------------------------------

    def _control(self, event: ControlArrived, now: float) -> list[DeviceAction]:
        if not event.raw or event.verdict is None:
            return []
        try:
            control = open_verified(event.verdict, ControlMessage)
        except Refused as refusal:
            return self._refuse_message(event.job, event.raw, refusal.reason,
                                        f"control of job {event.job}: {refusal}", now)
        if control.job != event.job or control.action is not ControlAction.STOP:
            return []
        self.stops[control.job] = max(self.stops.get(control.job, -1.0), control.issued_at)
        for waiting in list(self.queue):
            if waiting.job == control.job and control.issued_at >= waiting.spec.submitted_at:
                self.queue.remove(waiting)
                return self._finish(waiting, ExecState.CANCELED, now, "stopped by the operator")
        ex = self.current
        if ex is None or ex.job != control.job or control.issued_at < ex.spec.submitted_at:
            return []
        return self._stop(ex, ExecState.CANCELED, now)

    def _stop(self, ex: Execution, ending: ExecState, now: float) -> list[DeviceAction]:
        if ex.ending is not None:
            return []
        ex.ending = ending
        if ex.stage is Stage.TRAINING:
            return [StopTraining(ex.job, ending)]
        return self._finish(ex, ending, now, "")

    # -- execution states ---------------------------------------------------------------------

    def _exec_arrived(self, event: ExecArrived) -> list[DeviceAction]:
        try:
            status = ExecStatus.model_validate_json(event.raw) if event.raw else None
        except ValidationError:
            return []
        if status is None or status.job != event.job or status.device != event.device:
            return []
        if event.device == self.device:
            self.own[event.job] = status
            self.seqs[event.job] = max(self.seqs.get(event.job, 0), status.seq)
        else:
            self.others.setdefault(event.job, {})[event.device] = status.state
        return []

    def _status(self, ex: Execution, state: ExecState, now: float, detail: str = "",
                reason: RejectReason | None = None) -> PublishExec:
        return PublishExec(self._new_status(ex.job, ex.node, state, now, reason=reason, detail=detail,
                                            round=ex.round, accuracy=ex.accuracy))

    def _new_status(self, job: str, node: int | None, state: ExecState, now: float, *,
                    reason: RejectReason | None = None, detail: str = "", round: int | None = None,
                    accuracy: float | None = None) -> ExecStatus:
        seq = self.seqs[job] = self.seqs.get(job, 0) + 1
        return ExecStatus(job=job, device=self.device, node=node, state=state, reason=reason,
                          detail=one_line(detail)[:500], round=round, accuracy=accuracy,
                          updated_at=now, seq=seq)

    def _persist(self) -> Persist:
        ex = self.current
        seq = self.seqs.get(ex.job, 0) if ex else 0
        return Persist(ex.envelope if ex else None, seq, tuple(sorted(self.finished.items())))

    # -- model file ---------------------------------------------------------------------------

    def _chunk(self, event: ChunkArrived, now: float) -> list[DeviceAction]:
        ex = self.current
        blob = ex.blob if ex is not None and ex.stage is Stage.DOWNLOADING else None
        if ex is None or blob is None or blob.sha256 != event.sha256 or event.index >= blob.chunks:
            return []
        ex.chunks[event.index] = event.data
        if len(ex.chunks) < blob.chunks:
            return []
        data = b"".join(ex.chunks[i] for i in range(blob.chunks))
        ex.chunks = {}
        if len(data) != blob.size or hashlib.sha256(data).hexdigest() != blob.sha256:
            line = (f"job {ex.job}: the model file's chunks ({len(data)} bytes) do not hash to "
                    f"{blob.sha256[:12]}... ({blob.size} bytes)")
            return self._finish(ex, ExecState.REJECTED, now, line, RejectReason.BLOB_HASH_MISMATCH)
        return self._blob_ready(blob.sha256, data)

    def _blob_ready(self, sha256: str, data: bytes | None) -> list[DeviceAction]:
        ex = self.current
        blob = ex.blob if ex is not None and ex.stage is Stage.DOWNLOADING else None
        if ex is None or blob is None or blob.sha256 != sha256:
            return []
        ex.stage = Stage.PREPARING
        stored: list[DeviceAction] = [] if data is None else [StoreBlob(blob, data)]
        return [*stored, PrepareJob(ex.spec, ex.node)]

    # -- training -----------------------------------------------------------------------------

    def _prepared(self, event: Prepared, now: float) -> list[DeviceAction]:
        ex = self.current
        if ex is None or ex.job != event.job or ex.stage is not Stage.PREPARING:
            return []
        if event.reason is not None:
            return self._finish(ex, ExecState.REJECTED, now, f"job {ex.job}: {event.detail}", event.reason)
        if ex.ending is not None:
            return self._finish(ex, ex.ending, now, "")
        ex.stage = Stage.TRAINING
        ex.reported_at = now
        return [self._status(ex, ExecState.TRAINING, now), StartTraining(ex.spec, ex.node, ex.envelope)]

    def _round(self, event: RoundReported, now: float) -> list[DeviceAction]:
        ex = self.current
        if ex is None or ex.job != event.job or ex.stage is not Stage.TRAINING:
            return []
        ex.round = event.round
        if event.accuracy is not None:
            ex.accuracy = event.accuracy
        target = ex.spec.stop.target_accuracy
        if target is not None and event.accuracy is not None and event.accuracy >= target:
            return self._stop(ex, ExecState.SUCCEEDED, now)
        if now - ex.reported_at < EXEC_EVERY_S:
            return []
        ex.reported_at = now
        return [self._status(ex, ExecState.TRAINING, now)]

    def _ended(self, event: TrainingEnded, now: float) -> list[DeviceAction]:
        ex = self.current
        if ex is None or ex.job != event.job:
            return []
        ex.round = event.round
        if event.outcome is Outcome.FAILED:
            return self._finish(ex, ExecState.FAILED, now, event.detail)
        state = ex.ending or (ExecState.SUCCEEDED if event.outcome is Outcome.COMPLETED else ExecState.CANCELED)
        states = {**self.others.get(ex.job, {}), self.device: state}
        publish = event.coordinator and event.round > 0
        result: list[DeviceAction] = [PublishResult(ex.job, states)] if publish else []
        return [*result, *self._finish(ex, state, now, event.detail)]

    # -- time ---------------------------------------------------------------------------------

    def _tick(self, now: float) -> list[DeviceAction]:
        actions: list[DeviceAction] = []
        if not self.settled and now >= self.settle_at:
            actions += self._settle(now)
        ex = self.current
        if ex is not None and ex.spec.stop.deadline is not None and now >= ex.spec.stop.deadline:
            actions += self._stop(ex, ExecState.TIMED_OUT, now)
        elif ex is not None and ex.stage is Stage.DOWNLOADING and now >= ex.download_deadline:
            actions += self._finish(ex, ExecState.FAILED, now,
                                    f"the model file's chunks did not all arrive within {BLOB_TIMEOUT_S:.0f} s")
        for waiting in [q for q in self.queue if q.spec.stop.deadline is not None
                        and now >= q.spec.stop.deadline]:
            self.queue.remove(waiting)
            actions += self._finish(waiting, ExecState.TIMED_OUT, now, "the deadline passed while queued")
        if now >= self.record_due:
            self.record_due = now + RECORD_EVERY_S
            actions.append(PublishRecord())
        return actions
