"""What `edgegrove simulate --via-devices` writes before anything starts: one device per node
(its name, its config file with the broker, credentials, labels, data source and the operator's
public key) and the job document the simulator submits through `edgegrove job submit`'s path.

Devices are named ``node-<i>`` with the index zero-padded, so that `job submit`'s assignment
(matching devices sorted by name get node ids 0..n-1) gives device ``node-<i>`` node id ``i``:
the scenario's faults, written by node id, hit the device the simulator started for that node.
Everything here is pure (values in, text or dicts out) except ``write_device_config``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.model.datasets import DATASETS
from simulate.model_choice import MODEL_OPTIONS, ModelChoice
from simulate.scenario import ScenarioError

DEVICE_PREFIX = "node"
# The job document's own fields that a scenario's [agent] options (or --agent-option) may set;
# the rest go to the job's agent_options, which the wire module whitelists.
JOB_FIELDS = ("batch", "optimizer", "lr", "lr_schedule", "seed", "sync_every", "outer_optimizer",
              "algorithm", "arity")


def device_names(nodes: int) -> list[str]:
    """``node-0`` .. ``node-<n-1>``, zero-padded so that sorting by name is sorting by index."""
    width = len(str(max(nodes - 1, 0)))
    return [f"{DEVICE_PREFIX}-{i:0{width}d}" for i in range(nodes)]


@dataclass(frozen=True)
class DataSource:
    """One ``[data.<name>]`` table of a device config."""

    name: str
    format: str  # mnist | digits | npz | csv | images
    path: str | None = None
    label_column: str | None = None

    def toml_table(self) -> dict[str, Any]:
        table: dict[str, Any] = {"format": self.format}
        if self.path is not None:
            table["path"] = self.path
        if self.label_column is not None:
            table["label_column"] = self.label_column
        return table


def data_source(dataset: str, label_column: str | None = None) -> DataSource:
    """The data source every device of the run holds: a packaged dataset by its name, or the
    file/folder ``--dataset`` named (the simulator's devices share it and split it by node)."""
    if dataset in DATASETS:
        return DataSource(dataset, dataset)
    path = Path(dataset)
    if path.is_dir():
        fmt = "images"
    elif path.suffix.lower() == ".csv":
        fmt = "csv"
    else:
        fmt = "npz"
    return DataSource("data", fmt, str(path), label_column if fmt == "csv" else None)


@dataclass(frozen=True)
class JobOptions:
    """A scenario's agent options, split as a job carries them."""

    fields: dict[str, Any] = field(default_factory=dict)  # the job document's own fields
    agent_options: dict[str, Any] = field(default_factory=dict)  # its whitelisted agent_options
    label_column: str | None = None  # the device's data source's, not the job's


def split_options(options: Mapping[str, Any], allowed: frozenset[str]) -> JobOptions:
    """``options`` (the scenario's [agent] with --agent-option) as the job's fields and its
    agent_options; an option neither can carry is one ScenarioError line (exit 2)."""
    fields: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    label_column = None
    refused = []
    for key, value in options.items():
        if key in MODEL_OPTIONS:
            continue
        if key == "label_column":
            label_column = str(value)
        if key in JOB_FIELDS:
            fields[key] = value
        elif key in allowed:
            extra[key] = value
        else:
            refused.append(key)
    if refused:
        raise ScenarioError(f"a job cannot set {', '.join(sorted(refused))} "
                            f"(a job sets {', '.join(JOB_FIELDS)} and {', '.join(sorted(allowed))})")
    return JobOptions(fields, extra, label_column)


def check_model_for_job(model: ModelChoice) -> None:
    """A job runs one model on one backend: a mixed fleet stays on the agent path."""
    if model.backend == "mixed":
        raise ScenarioError("a job runs one backend: --backend mixed runs as agents (--via-agents)")


def job_document(job: str, model: ModelChoice, options: JobOptions, rounds: int, nodes: int,
                 source: DataSource) -> dict[str, Any]:
    """The job file the simulator submits (agent.operator.jobfile's job.toml, what a user
    would write); ``job submit`` adds the assignments, the signature and the time. The job
    names the run's devices."""
    document: dict[str, Any] = {
        "name": job,
        "model": model.model,
        "backend": model.backend,
        "data": source.name,
        "partition": model.partition,
        **options.fields,
        "min_devices": 1,
        "stop": {"rounds": rounds},
        "devices": {"ids": device_names(nodes)},
    }
    if options.agent_options:
        document["options"] = dict(options.agent_options)
    return document


@dataclass(frozen=True)
class DeviceConfig:
    """The device.toml of one simulated device."""

    name: str
    broker: str
    state_dir: Path
    operator_key: str  # base64 Ed25519 public key
    sources: tuple[DataSource, ...]
    labels: Mapping[str, str] = field(default_factory=dict)
    username: str | None = None
    password: str | None = None
    tls_ca: str | None = None

    def toml_text(self) -> str:
        top: dict[str, Any] = {"id": self.name, "broker": self.broker}
        if self.username is not None:
            top["username"] = self.username
            top["password"] = self.password
        if self.tls_ca is not None:
            top["tls_ca"] = self.tls_ca
        top["state_dir"] = str(self.state_dir)
        top["operator_keys"] = [self.operator_key]
        lines = [f"{k} = {_toml_value(v)}" for k, v in top.items()]
        lines += ["", "[labels]"] + [f"{k} = {_toml_value(v)}" for k, v in self.labels.items()]
        for source in self.sources:
            lines += ["", f"[data.{source.name}]"]
            lines += [f"{k} = {_toml_value(v)}" for k, v in source.toml_table().items()]
        return "\n".join(lines) + "\n"


def write_device_config(path: Path, config: DeviceConfig) -> Path:
    """Write ``config`` to ``path`` (0600: it holds the device's password)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config.toml_text())
    path.chmod(0o600)
    return path


def toml_document(document: Mapping[str, Any]) -> str:
    """A job document as TOML: scalars first, then one table per dict (one level deep)."""
    scalars = [f"{k} = {_toml_value(v)}" for k, v in document.items() if not isinstance(v, Mapping)]
    tables = []
    for name, table in document.items():
        if isinstance(table, Mapping):
            tables += ["", f"[{name}]"] + [f"{k} = {_toml_value(v)}" for k, v in table.items()]
    return "\n".join(scalars + tables) + "\n"


def _toml_value(value: Any) -> str:
    """A TOML scalar or array; a JSON string is a valid TOML basic string."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))
