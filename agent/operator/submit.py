"""What `job submit` decides before it publishes: the model's check, the devices, the document.

Pure apart from loading the model file (as `edgegrove model check` does); the command
(agent/commands/job_submit.py) does the broker's part.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from agent.config import AgentConfig
from agent.jobs.document import BlobRef, DeviceRecord, JobSpec, training_options
from agent.model.contract import Model, ModelError, fingerprint
from agent.model.loader import load_model
from agent.operator.assign import Assignment, assign
from agent.operator.jobfile import JobFile, JobFileError
from agent.validate import one_line

PROBE_ROWS = 8


@dataclass(frozen=True)
class CheckedModel:
    model: Model
    fingerprint: str
    path: Path | None  # the file sent as a blob; None for a builtin or installed model
    factory: str


def check_model(job: JobFile) -> CheckedModel:
    """Load the job's model as a device will and take one gradient (as `model check`);
    ModelError (one line) when a fleet would stop on it."""
    model = load_model(job.model)
    params = model.initial_params(job.seed)
    rng = np.random.default_rng(job.seed)
    x = rng.random((PROBE_ROWS, *model.input_shape), dtype=np.float32)
    y = np.arange(PROBE_ROWS, dtype=np.int64) % model.num_classes
    loss, grad = model.loss_and_grad(params, x, y)
    if not math.isfinite(float(loss)) or not np.all(np.isfinite(np.asarray(grad, dtype=np.float64))):
        raise ModelError(f"model {model.name} gives a non-finite loss or gradient: a fleet would stop it")
    path, factory = _model_file(job.model)
    return CheckedModel(model, fingerprint(model, job.seed), path, factory)


def _model_file(model: str) -> tuple[Path | None, str]:
    if model.endswith(".tflite"):
        return Path(model), "factory"
    head, colon, factory = model.rpartition(":")
    if colon and head.endswith(".py"):
        return Path(head), factory
    return None, "factory"


def build_spec(job: JobFile, records: dict[str, DeviceRecord], blob: BlobRef | None,
               now: float, submitted_by: str) -> tuple[JobSpec, Assignment]:
    """The job document for the devices the records offer (AssignError if too few)."""
    selector = job.devices.selector()
    chosen = assign(records, selector, job.data, job.min_devices)
    try:
        spec = JobSpec(
            name=job.name, model=blob if blob is not None else job.model, backend=job.backend_to_run,
            data=job.data, partition=job.partition, batch=job.batch, optimizer=job.optimizer, lr=job.lr,
            lr_schedule=job.lr_schedule, seed=job.seed, sync_every=job.sync_every,
            outer_optimizer=job.outer_optimizer, algorithm=job.algorithm, arity=job.arity,
            stop=job.stop.rule(now), min_devices=job.min_devices, selector=selector,
            assignments=chosen.nodes, agent_options=dict(job.options), submitted_by=submitted_by,
            submitted_at=now)
    except ValidationError as exc:
        raise JobFileError(f"job {job.name}: {_first(exc)}") from None
    check_agent_config(spec)
    return spec, chosen


def check_agent_config(spec: JobSpec) -> None:
    """The agent settings every device will build from ``spec`` are valid (JobFileError if
    not): what a device would reject as invalid_document is refused here first."""
    try:
        AgentConfig(id=0, **training_options(spec))  # type: ignore[arg-type]
    except ValidationError as exc:
        raise JobFileError(f"job {spec.name}: {_first(exc)}") from None


def _first(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "job"
    return one_line(f"{where}: {err['msg']}")
