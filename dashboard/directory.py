"""Devices and jobs as the broker's retained topics tell them (agent.jobs' wire). PURE.

``take(directory, topic, payload, now)`` files one message of ``edgegrove/devices/<device>``
(the device's record), ``edgegrove/jobs/<job>/spec`` (the operator's signed document, read
without its signature: the devices check it, the page only shows it), ``.../exec/<device>``
(a device's execution of the job) or ``.../result``. An empty payload clears what the topic
held (retained messages are deleted so); a payload that does not parse changes nothing and is
counted by the kind of topic. The jobs view's state, start and end, rounds and accuracy curve
come from the executions the devices report.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from pydantic import ValidationError

from agent.jobs import topics
from agent.jobs.document import DeviceRecord, ExecStatus, JobSpec, ResultManifest
from agent.jobs.envelope import Envelope
from agent.jobs.states import ExecState

MAX_DEVICES = 4096
MAX_JOBS = 512
MAX_CURVE = 2000  # accuracy points kept per job
Unreadable = Literal["device_record", "job_spec", "job_exec", "job_result"]
# The topic filters the dashboard subscribes to for the devices and jobs views.
SUBSCRIPTIONS = (topics.all_device_records(), topics.all_job_specs(), topics.all_execs(),
                 f"{topics.ROOT}/jobs/+/result", topics.all_device_logs())


class JobState(enum.StrEnum):
    """A job as the page shows it, from its devices' executions."""

    SUBMITTED = "submitted"  # its document is out; no device has answered yet
    RUNNING = "running"  # a device's execution is not over
    SUCCEEDED = "succeeded"  # over, and a device succeeded (or the result is published)
    FAILED = "failed"
    CANCELED = "canceled"
    TIMED_OUT = "timed_out"
    REJECTED = "rejected"  # every device refused it


@dataclass(frozen=True)
class DeviceEntry:
    record: DeviceRecord
    heard_at: float  # `now` of its latest record


@dataclass(frozen=True)
class JobEntry:
    name: str
    spec: JobSpec | None = None
    execs: Mapping[str, ExecStatus] = field(default_factory=dict)
    result: ResultManifest | None = None
    curve: Mapping[int, float] = field(default_factory=dict)  # round -> accuracy, as reported

    @property
    def state(self) -> JobState:
        states = [e.state for e in self.execs.values()]
        if not states:
            return JobState.SUCCEEDED if self.result is not None else JobState.SUBMITTED
        if any(not s.terminal for s in states):
            return JobState.RUNNING
        if self.result is not None or ExecState.SUCCEEDED in states:
            return JobState.SUCCEEDED
        for over in (ExecState.FAILED, ExecState.TIMED_OUT, ExecState.CANCELED):
            if over in states:
                return JobState(over.value)
        return JobState.REJECTED

    @property
    def started_at(self) -> float | None:
        if self.spec is not None:
            return self.spec.submitted_at
        times = [e.updated_at for e in self.execs.values()]
        return min(times) if times else None

    @property
    def ended_at(self) -> float | None:
        if self.state in (JobState.SUBMITTED, JobState.RUNNING):
            return None
        times = [e.updated_at for e in self.execs.values()]
        if self.result is not None:
            times.append(self.result.published_at)
        return max(times) if times else None

    @property
    def round(self) -> int | None:
        rounds = [e.round for e in self.execs.values() if e.round is not None]
        if self.result is not None:
            rounds.append(self.result.round)
        return max(rounds) if rounds else None

    @property
    def accuracy(self) -> float | None:
        if self.result is not None and self.result.accuracy is not None:
            return self.result.accuracy
        return self.curve[max(self.curve)] if self.curve else None


@dataclass(frozen=True)
class Directory:
    devices: Mapping[str, DeviceEntry] = field(default_factory=dict)
    jobs: Mapping[str, JobEntry] = field(default_factory=dict)
    unreadable: Mapping[Unreadable, int] = field(default_factory=dict)


def take(directory: Directory, topic: str, payload: bytes, now: float) -> Directory:
    """One retained message of the devices and jobs wire (another topic: nothing changes)."""
    try:
        if (device := topics.parse_device_record(topic)) is not None:
            return _device(directory, device, payload, now)
        if (job := topics.parse_job_spec(topic)) is not None:
            spec = _spec_of(payload) if payload else None
            return _job(directory, job, lambda entry: replace(entry, spec=spec))
        if (pair := topics.parse_job_exec(topic)) is not None:
            return _exec(directory, *pair, ExecStatus.model_validate_json(payload) if payload else None)
        if (job := topics.parse_job_result(topic)) is not None:
            result = ResultManifest.model_validate_json(payload) if payload else None
            return _job(directory, job, lambda entry: replace(entry, result=result))
    except (ValidationError, ValueError, UnicodeDecodeError):
        return _unreadable(directory, topic)
    return directory


def is_directory_topic(topic: str) -> bool:
    return topic.startswith((f"{topics.ROOT}/devices/", f"{topics.ROOT}/jobs/"))


def _spec_of(payload: bytes) -> JobSpec:
    envelope = Envelope.model_validate_json(payload)
    return JobSpec.model_validate(json.loads(envelope.payload))


def _device(directory: Directory, device: str, payload: bytes, now: float) -> Directory:
    devices = dict(directory.devices)
    if not payload:
        devices.pop(device, None)
    else:
        record = DeviceRecord.model_validate_json(payload)
        if record.id != device:
            raise ValueError(f"record of {record.id!r} on {device!r}'s topic")
        if device not in devices and len(devices) >= MAX_DEVICES:
            return directory
        devices[device] = DeviceEntry(record, now)
    return replace(directory, devices=devices)


def _job(directory: Directory, job: str, change: Callable[[JobEntry], JobEntry]) -> Directory:
    jobs = dict(directory.jobs)
    if job not in jobs and len(jobs) >= MAX_JOBS:
        return directory
    entry = change(jobs.get(job) or JobEntry(job))
    jobs[job] = entry
    if entry.spec is None and entry.result is None and not entry.execs:
        del jobs[job]  # every retained topic of the job cleared
    return replace(directory, jobs=jobs)


def _exec(directory: Directory, job: str, device: str, status: ExecStatus | None) -> Directory:
    if status is not None and (status.job, status.device) != (job, device):
        raise ValueError(f"execution of {status.job}/{status.device} on {job}/{device}'s topic")
    return _job(directory, job, lambda entry: _with_exec(entry, device, status))


def _with_exec(entry: JobEntry, device: str, status: ExecStatus | None) -> JobEntry:
    execs = dict(entry.execs)
    curve = dict(entry.curve)
    if status is None:
        execs.pop(device, None)
    else:
        execs[device] = status
        if status.round is not None and status.accuracy is not None:
            curve[status.round] = status.accuracy
            for old in sorted(curve)[:-MAX_CURVE]:
                del curve[old]
    return replace(entry, execs=execs, curve=curve)


def _unreadable(directory: Directory, topic: str) -> Directory:
    kind: Unreadable = ("device_record" if topic.startswith(f"{topics.ROOT}/devices/")
                        else "job_spec" if topic.endswith("/spec")
                        else "job_result" if topic.endswith("/result") else "job_exec")
    counts = dict(directory.unreadable)
    counts[kind] = counts.get(kind, 0) + 1
    return replace(directory, unreadable=counts)
