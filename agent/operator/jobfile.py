"""A job file (``job.toml``), read and checked on the operator's workstation.

    name = "mnist-mlp"
    model = "mlp"                  # mlp, pkg.module:factory, or a file: x.tflite, x.py:factory
    data = "mnist"                 # the name of a data source in the devices' configs
    partition = "iid"              # iid | shards:K | dirichlet:A | none (each device's own data)
    batch = 100
    min_devices = 2
    [stop]
    rounds = 200                   # and/or target_accuracy = 0.97, deadline = 2026-12-07T06:00:00Z
    [devices]                      # all (no table), ids = ["pi-1", "pi-2"] or labels = {site = "barn"}
    [options]                      # other agent settings a job may set (eval_every, round_deadline, ...)

Model files are relative to the job file. Whatever is wrong is one ``JobFileError`` line.
"""

from __future__ import annotations

import datetime as dt
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agent.jobs.document import (
    BUILTIN_MODEL,
    JobSettings,
    OptionValue,
    Selector,
    StopRule,
    check_agent_options,
    first_error,
)
from agent.jobs.topics import validate_device


class JobFileError(ValueError):
    """What is wrong with a job file, one line."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StopTable(_Strict):
    rounds: int = Field(default=0, ge=0, le=10**9)
    target_accuracy: float | None = Field(default=None, gt=0, le=1)
    deadline: dt.datetime | None = None  # a TOML date-time; UTC when it has no offset
    deadline_after: float | None = Field(default=None, gt=0, description="seconds after submission")

    @model_validator(mode="after")
    def _one_deadline(self) -> StopTable:
        if self.deadline is not None and self.deadline_after is not None:
            raise ValueError("give deadline or deadline_after, not both")
        return self

    def rule(self, now: float) -> StopRule:
        deadline = None
        if self.deadline is not None:
            when = self.deadline if self.deadline.tzinfo else self.deadline.replace(tzinfo=dt.UTC)
            deadline = when.timestamp()
            if deadline <= now:
                raise JobFileError(f"stop.deadline {self.deadline.isoformat()} has passed")
        elif self.deadline_after is not None:
            deadline = now + self.deadline_after
        return StopRule(rounds=self.rounds, target_accuracy=self.target_accuracy, deadline=deadline)


class DevicesTable(_Strict):
    all: bool = False
    ids: list[str] | None = None
    labels: dict[str, str] | None = None

    @field_validator("ids")
    @classmethod
    def _ids(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            if not value:
                raise ValueError("ids is empty")
            for device in value:
                validate_device(device)
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> DevicesTable:
        if sum((self.all, self.ids is not None, self.labels is not None)) > 1:
            raise ValueError("choose one of all, ids and labels")
        return self

    def selector(self) -> Selector:
        return Selector(devices=self.ids, labels=self.labels)


class JobFile(JobSettings):
    """The job as the operator wrote it (before devices are assigned): the job's settings
    (JobSettings, as the signed JobSpec carries them) and how the file says the rest."""

    model: str = BUILTIN_MODEL
    backend: Literal["numpy", "litert"] | None = None  # unset: litert for a .tflite, else numpy
    stop: StopTable = StopTable()
    devices: DevicesTable = DevicesTable()
    options: dict[str, OptionValue] = Field(default_factory=dict)

    @field_validator("options")
    @classmethod
    def _options(cls, value: dict[str, OptionValue]) -> dict[str, OptionValue]:
        return check_agent_options(value, "options")

    @property
    def backend_to_run(self) -> Literal["numpy", "litert"]:
        if self.backend is not None:
            return self.backend
        return "litert" if self.model.endswith(".tflite") else "numpy"

    @model_validator(mode="after")
    def _schedule(self) -> JobFile:
        if self.lr_schedule == "linear" and self.stop.rounds == 0:
            raise ValueError("lr_schedule linear needs stop.rounds > 0")
        return self


def read_job_file(path: Path) -> JobFile:
    """The job file at ``path``, checked; its model path made absolute (relative to the file)."""
    try:
        table = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise JobFileError(f"{path}: cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise JobFileError(f"{path}: not valid TOML: {exc}") from None
    try:
        job = JobFile.model_validate(table)
    except ValidationError as exc:
        raise JobFileError(f"{path}: {first_error(exc, 'job')}") from None
    return job.model_copy(update={"model": model_reference(job.model, path.parent)})


def model_reference(model: str, base: Path) -> str:
    """``model`` with its file made absolute against ``base``; builtins and installed modules
    (pkg.module:factory) as written."""
    head, colon, factory = model.rpartition(":")
    if model.endswith(".tflite"):
        file_text, tail = model, ""
    elif colon and head.endswith(".py") and factory.isidentifier():
        file_text, tail = head, f":{factory}"
    elif model.endswith(".py"):
        raise JobFileError(f"model {model!r}: name the factory too, e.g. {model}:factory")
    else:
        return model
    resolved = Path(file_text) if Path(file_text).is_absolute() else (base / file_text).resolve()
    if not resolved.is_file():
        raise JobFileError(f"model file {resolved} does not exist")
    return f"{resolved}{tail}"

