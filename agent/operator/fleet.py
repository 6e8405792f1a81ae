"""The fleet as the broker's retained topics tell it: records, jobs, executions, results.

Pure parsing: a payload that does not parse is left out and counted, never an exception.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from pydantic import ValidationError

from agent.jobs import topics
from agent.jobs.document import DeviceRecord, ExecStatus, JobSpec, ResultManifest
from agent.jobs.signing import Envelope
from agent.transport.base import Message

T = TypeVar("T")


@dataclass
class FleetView:
    devices: dict[str, DeviceRecord] = field(default_factory=dict)
    jobs: dict[str, JobSpec] = field(default_factory=dict)
    execs: dict[str, dict[str, ExecStatus]] = field(default_factory=dict)  # job -> device -> status
    results: dict[str, ResultManifest] = field(default_factory=dict)
    stopped: set[str] = field(default_factory=set)  # jobs with a stop control
    result_chunks: dict[str, dict[int, bytes]] = field(default_factory=dict)
    blob_chunks: dict[str, dict[int, bytes]] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)  # topics whose payload did not parse

    def take(self, message: Message) -> None:
        """File one retained message (an empty payload clears what the topic held)."""
        topic, payload = message.topic, message.payload
        if (device := topics.parse_device_record(topic)) is not None:
            self._put(self.devices, device, payload, DeviceRecord.model_validate_json, topic)
        elif (job := topics.parse_job_spec(topic)) is not None:
            self._put(self.jobs, job, payload, spec_of, topic)
        elif (pair := topics.parse_job_exec(topic)) is not None:
            self._put(self.execs.setdefault(pair[0], {}), pair[1], payload,
                      ExecStatus.model_validate_json, topic)
        elif (job := topics.parse_job_result(topic)) is not None:
            self._put(self.results, job, payload, ResultManifest.model_validate_json, topic)
        elif (job := topics.parse_job_control(topic)) is not None:
            (self.stopped.add if payload else self.stopped.discard)(job)
        elif (chunk := topics.parse_job_result_chunk(topic)) is not None:
            _put_bytes(self.result_chunks.setdefault(chunk[0], {}), chunk[1], payload)
        elif (piece := topics.parse_blob_chunk(topic)) is not None:
            _put_bytes(self.blob_chunks.setdefault(piece[0], {}), piece[1], payload)

    def take_all(self, messages: list[Message]) -> FleetView:
        for message in messages:
            self.take(message)
        return self

    def _put(self, table: dict[str, T], key: str, payload: bytes, parse: Callable[[bytes], T],
             topic: str) -> None:
        if not payload:
            table.pop(key, None)
            return
        try:
            table[key] = parse(payload)
        except (ValidationError, ValueError, UnicodeDecodeError):
            self.unreadable.append(topic)


def _put_bytes(table: dict[int, bytes], index: int, payload: bytes) -> None:
    if payload:
        table[index] = payload
    else:
        table.pop(index, None)


def spec_of(payload: bytes) -> JobSpec:
    """The job document inside a signed envelope (the operator reads its own jobs: the
    signature is the devices' to check)."""
    envelope = Envelope.model_validate_json(payload)
    return JobSpec.model_validate(json.loads(envelope.payload))
