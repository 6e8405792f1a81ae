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
from agent.jobs.document import BlobRef, DeviceRecord, JobSpec, first_error, training_options
from agent.model.contract import Model, ModelError, fingerprint
from agent.model.loader import load_model
from agent.operator.assign import Assignment, assign
from agent.operator.jobfile import JobFile, JobFileError

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
        spec = JobSpec.model_validate({
            **job.settings(), "model": blob if blob is not None else job.model,
            "backend": job.backend_to_run, "stop": job.stop.rule(now), "selector": selector,
            "assignments": chosen.nodes, "agent_options": dict(job.options),
            "submitted_by": submitted_by, "submitted_at": now})
    except ValidationError as exc:
        raise JobFileError(f"job {job.name}: {first_error(exc, 'job')}") from None
    check_agent_config(spec)
    return spec, chosen


def check_agent_config(spec: JobSpec) -> None:
    """The agent settings every device will build from ``spec`` are valid (JobFileError if
    not): what a device would reject as invalid_document is refused here first."""
    try:
        AgentConfig(id=0, **training_options(spec))  # type: ignore[arg-type]
    except ValidationError as exc:
        raise JobFileError(f"job {spec.name}: {first_error(exc, 'job')}") from None

