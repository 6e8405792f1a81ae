"""The API's devices and jobs (``GET /api/devices``, ``GET /api/jobs``): what the page's devices
and jobs views show, from the Directory."""

from __future__ import annotations

from pydantic import BaseModel, Field

from agent.jobs.document import BlobRef, DeviceRecord
from agent.jobs.states import DeviceState, ExecState, RejectReason
from dashboard.directory import DeviceEntry, Directory, JobEntry, JobState


class DataSourceModel(BaseModel):
    name: str
    format: str
    samples: int
    labels: list[int] = Field(description="samples per class")
    error: str = Field(description="why the source cannot be read (empty: it can)")


class DeviceModel(BaseModel):
    id: str
    labels: dict[str, str]
    arch: str
    cores: int
    memory: int = Field(description="bytes, total")
    memory_available: int = Field(description="bytes, when the device made its record")
    backends: list[str]
    data: list[DataSourceModel]
    version: str
    state: DeviceState
    job: str | None = Field(description="the job it trains now")
    node: int | None = Field(description="its node in that job")
    queued: list[str]
    last_seen: float = Field(description="Unix time the device says it made its record")
    heard_at: float = Field(description="Unix time the dashboard got its record")
    refused: dict[str, int] = Field(description="jobs, controls or chunks it refused, by reason")


class ExecModel(BaseModel):
    device: str
    node: int | None
    state: ExecState
    round: int | None
    accuracy: float | None
    reason: RejectReason | None
    detail: str
    updated_at: float


class JobModel(BaseModel):
    name: str
    state: JobState
    devices: list[ExecModel] = Field(description="each device's execution of the job")
    round: int | None = Field(description="the highest round a device reported")
    rounds_planned: int | None = Field(description="the stop rule's rounds (None: no round budget)")
    accuracy: float | None = Field(description="the result's accuracy, else the latest reported")
    curve: list[tuple[int, float]] = Field(description="(round, accuracy) as the devices reported it")
    started_at: float | None = Field(description="Unix time it was submitted (else first heard of)")
    ended_at: float | None = Field(description="Unix time its last execution ended (None: not over)")
    submitted_by: str
    model: str
    data: str
    algorithm: str
    result: bool = Field(description="its final parameters are published")


def device_model(entry: DeviceEntry, wall_offset: float) -> DeviceModel:
    r: DeviceRecord = entry.record
    return DeviceModel(
        id=r.id, labels=dict(r.labels), arch=r.arch, cores=r.cores, memory=r.memory,
        memory_available=r.memory_available, backends=list(r.backends),
        data=[DataSourceModel(name=name, format=d.format, samples=d.samples, labels=list(d.labels), error=d.error)
              for name, d in sorted(r.data.items())],
        version=r.version, state=r.state, job=r.job, node=r.node, queued=list(r.queued),
        last_seen=r.last_seen, heard_at=round(entry.heard_at + wall_offset, 3), refused=dict(r.refused))


def job_model(entry: JobEntry) -> JobModel:
    spec = entry.spec
    model = "" if spec is None else spec.model.filename if isinstance(spec.model, BlobRef) else spec.model
    return JobModel(
        name=entry.name, state=entry.state,
        devices=[ExecModel(device=e.device, node=e.node, state=e.state, round=e.round, accuracy=e.accuracy,
                           reason=e.reason, detail=e.detail, updated_at=e.updated_at)
                 for _, e in sorted(entry.execs.items())],
        round=entry.round, rounds_planned=spec.stop.rounds or None if spec is not None else None,
        accuracy=entry.accuracy, curve=sorted(entry.curve.items()),
        started_at=entry.started_at, ended_at=entry.ended_at,
        submitted_by="" if spec is None else spec.submitted_by, model=model,
        data="" if spec is None else spec.data, algorithm="" if spec is None else spec.algorithm,
        result=entry.result is not None)


def devices_model(directory: Directory, wall_offset: float) -> list[DeviceModel]:
    return [device_model(entry, wall_offset) for _, entry in sorted(directory.devices.items())]


def jobs_model(directory: Directory) -> list[JobModel]:
    """Running jobs first, then the newest."""
    jobs = sorted(directory.jobs.values(), key=lambda j: (j.state is not JobState.RUNNING, -(j.started_at or 0)))
    return [job_model(job) for job in jobs]
