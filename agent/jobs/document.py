"""The documents of devices and jobs on the wire (pydantic): one module, every message.

A job document is signed by the operator (agent.jobs.signing) and read by the devices; its
``assignments`` (device -> node id, resolved by ``job submit`` from the retained device records)
make node ids assigned, never typed on a device. ``training_options`` maps a job onto the
fields of agent.config.AgentConfig, so the device and ``job submit`` build the same config.
"""

from __future__ import annotations

import json
import math
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agent.jobs.states import ControlAction, DeviceState, ExecState, RejectReason
from agent.jobs.topics import MAX_CHUNKS, validate_device, validate_job_name, validate_sha256
from agent.model.partition import parse_partition
from agent.protocol.keys import key_bytes
from agent.validate import one_line

DEFAULT_CHUNK_BYTES = 256 * 1024
MAX_BLOB_BYTES = 256 << 20
_SOURCE_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_BLOB_SUFFIXES = (".tflite", ".py")
BUILTIN_MODEL = "mlp"

# AgentConfig fields a job may set beyond its own fields: tuning and evaluation, never the
# device's identity, credentials, paths or broker (those are the device's own).
AGENT_OPTIONS = frozenset({
    "eval_every", "eval_samples", "holdout", "label_column", "round_deadline", "timeout",
    "timeout_mode", "min_timeout", "max_timeout", "link_rate_floor", "broadcast", "chunk_size",
    "wire_dtype", "wire_budget", "influence_bound", "audit_units", "remember_dead_links", "adapt_broadcast",
    "adapt_chunks", "straggler_deadline", "comm_share", "outer_lr", "lr_final", "min_members",
    "join_grace", "checkpoint_every", "keepalive", "publish_rate", "telemetry",
    "dp_clip", "dp_epsilon", "dp_delta", "dp_noise", "dp_at_budget",
})
OptionValue = int | float | str | bool


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def validate_source_name(name: str) -> str:
    """A data source's name (``[data.<name>]`` in device.toml, ``data`` in a job)."""
    if not isinstance(name, str) or not _SOURCE_RE.fullmatch(name):
        raise ValueError(f"data source name {name!r}: 1-64 letters, digits, '_' or '-'")
    return name


def first_error(exc: ValidationError, whole: str = "document") -> str:
    """The first of a document's problems, one line, with where it is (``whole``: at the top)."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or whole
    return one_line(f"{where}: {err['msg']}")


def check_agent_options(options: dict[str, OptionValue], field: str) -> dict[str, OptionValue]:
    """Only the agent settings a job may set (AGENT_OPTIONS)."""
    unknown = sorted(set(options) - AGENT_OPTIONS)
    if unknown:
        raise ValueError(f"{field} {', '.join(unknown)} may not be set by a job "
                         f"(allowed: {', '.join(sorted(AGENT_OPTIONS))})")
    return options


def canonical_json(document: BaseModel) -> str:
    """Sorted keys, no spaces: the same document always gives the same text (what is signed)."""
    return json.dumps(document.model_dump(mode="json"), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, allow_nan=False)


class BlobRef(Frozen):
    """A model file on the retained blob topics, content-addressed by its sha256."""

    sha256: str
    size: int = Field(gt=0, le=MAX_BLOB_BYTES)
    chunk_size: int = Field(default=DEFAULT_CHUNK_BYTES, ge=1024, le=8 << 20)
    chunks: int = Field(ge=1, le=MAX_CHUNKS)
    filename: str  # model.tflite, or model.py with ``factory``
    factory: str = "factory"  # the .py file's factory function

    @field_validator("sha256")
    @classmethod
    def _sha(cls, value: str) -> str:
        return validate_sha256(value)

    @field_validator("filename")
    @classmethod
    def _filename(cls, value: str) -> str:
        if "/" in value or "\\" in value or value.startswith(".") or not value.endswith(_BLOB_SUFFIXES):
            raise ValueError(f"blob filename {value!r}: a plain file name ending in .tflite or .py")
        return value

    @model_validator(mode="after")
    def _chunk_count(self) -> BlobRef:
        if self.chunks != math.ceil(self.size / self.chunk_size):
            raise ValueError(f"blob of {self.size} bytes in chunks of {self.chunk_size} has "
                             f"{math.ceil(self.size / self.chunk_size)} chunks, not {self.chunks}")
        if not self.factory.isidentifier():
            raise ValueError(f"blob factory {self.factory!r} is not a Python name")
        return self

    @property
    def is_tflite(self) -> bool:
        return self.filename.endswith(".tflite")


class StopRule(Frozen):
    """When a job ends: whichever comes first (all unset: when stopped)."""

    rounds: int = Field(default=0, ge=0, le=10**9)  # 0: no round budget
    target_accuracy: float | None = Field(default=None, gt=0, le=1)
    deadline: float | None = Field(default=None, gt=0)  # UTC seconds


class Selector(Frozen):
    """Which devices a job is for: all (both unset), a list, or labels (all must match)."""

    devices: list[str] | None = None
    labels: dict[str, str] | None = None

    @field_validator("devices")
    @classmethod
    def _devices(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else [validate_device(d) for d in value]

    @model_validator(mode="after")
    def _one_kind(self) -> Selector:
        if self.devices is not None and self.labels is not None:
            raise ValueError("a selector names devices or labels, not both")
        return self

    def matches(self, device: str, labels: dict[str, str]) -> bool:
        if self.devices is not None:
            return device in self.devices
        if self.labels is not None:
            return all(labels.get(k) == v for k, v in self.labels.items())
        return True


class JobSettings(Frozen):
    """How a job trains: the same fields and checks in the operator's job file
    (agent.operator.jobfile.JobFile) and in the document it signs (JobSpec)."""

    name: str
    data: str  # the name of a data source in the devices' configs
    partition: str = "iid"  # iid | shards:K | dirichlet:A | none (each device's data whole)
    batch: int = Field(default=100, ge=1, le=60000)
    optimizer: Literal["adam", "sgd"] = "adam"
    lr: float = Field(default=0.001, gt=0)
    lr_schedule: Literal["constant", "linear"] = "constant"
    seed: int = Field(default=0, ge=0)
    sync_every: int | Literal["auto"] | None = None
    outer_optimizer: Literal["avg", "nesterov"] = "avg"
    algorithm: Literal["ft-tree", "tree", "rps", "ps-sync", "ps-async", "ring"] = "ft-tree"
    arity: int = Field(default=2, ge=2, le=16)
    min_devices: int = Field(default=1, ge=1, le=1024)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return validate_job_name(value)

    @field_validator("data")
    @classmethod
    def _data(cls, value: str) -> str:
        return validate_source_name(value)

    @field_validator("partition")
    @classmethod
    def _partition(cls, value: str) -> str:
        if value != "none":
            parse_partition(value)
        return value

    @field_validator("sync_every")
    @classmethod
    def _sync_every(cls, value: int | str | None) -> int | str | None:
        if isinstance(value, int) and value < 1:
            raise ValueError("sync_every must be at least 1 (or auto)")
        return value

    def settings(self) -> dict[str, object]:
        """These fields by name, to carry them over into another JobSettings."""
        return {name: getattr(self, name) for name in JobSettings.model_fields}


class JobSpec(JobSettings):
    """The job document the operator signs (``edgegrove/jobs/<name>/spec``)."""

    model: str | BlobRef = BUILTIN_MODEL
    backend: Literal["numpy", "litert"] = "numpy"
    stop: StopRule = StopRule()
    selector: Selector = Selector()
    assignments: dict[str, int]  # device -> node id 0..n-1
    agent_options: dict[str, OptionValue] = Field(default_factory=dict)
    # node id (text) -> its device's Ed25519 public key (base64 raw), pinned from enrolment:
    # every member signs its control messages and checks the others' (agent/protocol/keys.py);
    # {}: the fleet runs without signatures.
    member_keys: dict[str, str] = Field(default_factory=dict)
    submitted_by: str = ""
    submitted_at: float = Field(ge=0)

    @field_validator("model")
    @classmethod
    def _model(cls, value: str | BlobRef) -> str | BlobRef:
        if isinstance(value, str) and value != BUILTIN_MODEL and (
                "/" in value or value.endswith(_BLOB_SUFFIXES) or ":" not in value):
            raise ValueError(f"model {value!r}: {BUILTIN_MODEL}, an installed pkg.module:factory, "
                             "or a model file sent as a blob")
        return value

    @field_validator("assignments")
    @classmethod
    def _assignments(cls, value: dict[str, int]) -> dict[str, int]:
        for device in value:
            validate_device(device)
        if sorted(value.values()) != list(range(len(value))):
            raise ValueError("assignments must give the devices node ids 0..n-1, each once")
        if not value:
            raise ValueError("assignments name no device")
        return value

    @field_validator("agent_options")
    @classmethod
    def _options(cls, value: dict[str, OptionValue]) -> dict[str, OptionValue]:
        return check_agent_options(value, "agent_options")

    @model_validator(mode="after")
    def _member_keys(self) -> JobSpec:
        nodes = {str(n) for n in self.assignments.values()}
        if self.member_keys and set(self.member_keys) != nodes:
            raise ValueError("member_keys must name every assigned node id, or none")
        if any(key_bytes(text) is None for text in self.member_keys.values()):
            raise ValueError("member_keys must be base64 Ed25519 public keys (32 bytes)")
        return self

    @model_validator(mode="after")
    def _enough_devices(self) -> JobSpec:
        if len(self.assignments) < self.min_devices:
            raise ValueError(f"{len(self.assignments)} devices assigned, fewer than min_devices "
                             f"{self.min_devices}")
        return self

    @property
    def fleet_size(self) -> int:
        return len(self.assignments)

    def node_of(self, device: str) -> int | None:
        return self.assignments.get(device)


def training_options(spec: JobSpec) -> dict[str, object]:
    """The AgentConfig fields a job sets (the device adds id, broker, credentials, data and
    model path). ``partition none`` trains each device on its own data whole: ``iid`` over a
    fleet of one, which the device arranges when it loads the data."""
    options: dict[str, object] = {
        "job": spec.name, "backend": spec.backend,
        "model": spec.model if isinstance(spec.model, str) else spec.model.filename,
        "partition": "iid" if spec.partition == "none" else spec.partition,
        "batch": spec.batch, "optimizer": spec.optimizer, "lr": spec.lr,
        "lr_schedule": spec.lr_schedule, "seed": spec.seed, "sync_every": spec.sync_every,
        "algorithm": spec.algorithm, "arity": spec.arity, "rounds": spec.stop.rounds,
        "fleet_size": spec.fleet_size,
    }
    if spec.sync_every is not None:
        options["outer_optimizer"] = spec.outer_optimizer
    options.update(spec.agent_options)
    return options


class ControlMessage(Frozen):
    """The operator's signed control of a job (``edgegrove/jobs/<job>/control``, retained)."""

    job: str
    action: ControlAction
    issued_at: float = Field(ge=0)

    @field_validator("job")
    @classmethod
    def _job(cls, value: str) -> str:
        return validate_job_name(value)


class ExecStatus(Frozen):
    """One device's execution of one job (``edgegrove/jobs/<job>/exec/<device>``, retained)."""

    job: str
    device: str
    node: int | None = None
    state: ExecState
    reason: RejectReason | None = None  # rejected: why
    detail: str = ""  # rejected: the one line; failed: the log line
    round: int | None = None  # training: the round; the end: the last round
    accuracy: float | None = None  # the last evaluated accuracy
    updated_at: float
    seq: int = Field(ge=0)  # grows with each message of this device about this job


class DataSourceInfo(Frozen):
    """What a device tells about one of its data sources (the data never leaves it)."""

    format: str
    samples: int = Field(ge=0)
    labels: list[int] = Field(default_factory=list)  # histogram, class 0..k-1
    error: str = ""  # the source cannot be read: why (one line)


class DeviceRecord(Frozen):
    """A device's retained record (``edgegrove/devices/<id>``); its Will says offline."""

    id: str
    labels: dict[str, str] = Field(default_factory=dict)
    arch: str = ""
    cores: int = 0
    memory: int = 0  # bytes, total
    memory_available: int = 0  # bytes, when the record was made
    backends: list[str] = Field(default_factory=list)
    data: dict[str, DataSourceInfo] = Field(default_factory=dict)
    version: str = ""
    state: DeviceState = DeviceState.IDLE
    job: str | None = None
    node: int | None = None
    queued: list[str] = Field(default_factory=list)
    last_seen: float = 0.0
    started_at: float = 0.0
    refused: dict[str, int] = Field(default_factory=dict)  # RejectReason value -> count
    public_key: str = ""  # the device key's public half (base64 raw; enrolment pins it, not this)

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        return validate_device(value)


class TensorLayout(Frozen):
    name: str
    shape: list[int]


class ResultManifest(Frozen):
    """The trained model's description (``edgegrove/jobs/<job>/result``); the parameters follow
    as float32 little-endian bytes in ``chunks`` retained chunks of ``chunk_size`` bytes."""

    job: str
    device: str  # the publisher: the device of the final coordinator
    node: int
    round: int
    accuracy: float | None = None
    loss: float | None = None
    model: str | BlobRef
    model_hash: str  # the fleet's params hash (agent.model.flat.params_hash)
    fingerprint: str
    params_sha256: str  # sha256 of the concatenated chunks
    values: int = Field(ge=1)  # float32 values
    chunk_size: int = Field(ge=1024)
    chunks: int = Field(ge=1, le=MAX_CHUNKS)
    layout: list[TensorLayout]
    states: dict[str, ExecState] = Field(default_factory=dict)  # per device, as last heard
    published_at: float

    @model_validator(mode="after")
    def _fits(self) -> ResultManifest:
        if self.chunks != math.ceil(self.values * 4 / self.chunk_size):
            raise ValueError("result chunk count does not fit its size")
        if self.layout and sum(math.prod(t.shape) for t in self.layout) != self.values:
            raise ValueError("result layout does not add up to its values")
        return self
