"""Agent configuration: defaults < config file (TOML) < environment (EDGEGROVE_*) < flags."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agent.model.datasets import DATASETS
from agent.model.partition import parse_partition
from agent.model.periodic import DEFAULT_OUTER_LR, OuterConfig, OuterName
from agent.protocol.allreduce import DEFAULT_BROADCAST, DEFAULT_CHUNK_VALUES, Algorithm
from agent.protocol.chunking import MAX_CHUNK_VALUES, MIN_CHUNK_VALUES
from agent.protocol.influence import DEFAULT_INFLUENCE_FACTOR
from agent.protocol.sync_period import DEFAULT_COMM_SHARE, PeriodRule
from agent.protocol.topics import validate_job
from agent.protocol.wire_choice import AUTO_WIRE_BUDGET
from agent.validate import UsageError, broker_url, existing_path, input_file, one_line, output_dir


class ConfigError(ValueError):
    """The configuration cannot be used; the message says what to change."""


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: int = Field(ge=0, le=1023, description="this agent's node id (unique in the job)")
    job: str = Field("default", description="job name; all agents of one training run share it")
    broker: str = Field("mqtt://127.0.0.1:1883", description="broker URL, mqtt:// or mqtts://")
    username: str | None = Field(None, description="MQTT username")
    password: str | None = Field(None, description="MQTT password")
    credentials: Path | None = Field(
        None, description="credentials.json written by broker-config/make-credentials; "
        "this agent's entry supplies username, password and MQTT client id"
    )
    client_id: str | None = Field(None, description="MQTT client id (default: from the credentials file, "
                                  "else edgegrove-<job>-<id>); a dynamic-security broker admits only the bound one")
    tls_ca: Path | None = Field(None, description="CA certificate for mqtts://")
    device_key: str | None = Field(None, description="this agent's Ed25519 device key that signs its control messages: "
                                   "base64 raw private key, or a file holding it (default: the credentials file's "
                                   "entry, from make-credentials)")
    member_keys: Path | None = Field(None, description="the job's member public keys, JSON {node id: base64 key} "
                                     "(or a credentials.json with member_keys); with device-key, unsigned or badly "
                                     "signed control messages are refused (default: the credentials file's)")
    mqtt_version: Literal["3.1.1", "5"] = Field("3.1.1", description="MQTT protocol version")
    keepalive: int = Field(10, ge=2, le=600, description="MQTT keepalive (s); a hung agent's Last Will comes after ~1.5x this")
    publish_rate: float = Field(0.0, ge=0, description="pace publishing to this many MB/s (0 = unpaced; use ~50 with the embedded broker)")
    backend: Literal["numpy", "litert"] = Field("numpy", description="model backend")
    model: str = Field("mlp", description="the model: mlp (the thesis MLP), pkg.module:factory, path/to/file.py:factory "
                       "or a .tflite file (docs/MODELS.md)")
    data: Path | None = Field(None, description="this device's data: .npz (x, y [, x_test, y_test]), a CSV with a label "
                              "column, a folder of images with one subfolder per class, or MNIST (IDX dir or .npz); "
                              "default: the dataset option")
    dataset: str | None = Field(None, description="a dataset a package ships, by name (mnist, digits) when data is unset; "
                                "default: mnist")
    label_column: str = Field("label", description="the CSV column holding the labels")
    data_max_mb: float = Field(0.0, ge=0, description="refuse data whose loading would take more than this many MB "
                               "(estimated from the file before reading it; 0 = the memory available decides)")
    holdout: float = Field(0.1, ge=0, lt=1, description="fraction of the data held out for evaluation when it has no test split")
    partition: str = Field("iid", description="how the fleet splits the data: iid, shards:K (K label-sorted shards per agent) "
                           "or dirichlet:ALPHA (per-class Dirichlet proportions over the agents)")
    fleet_size: int = Field(1, ge=1, le=1024, description="agents in the job, for sharding the data")
    min_members: int = Field(0, ge=0, le=1024, description="members to wait for before round 0 (0 = fleet size)")
    join_grace: float = Field(30.0, gt=0, description="seconds the coordinator waits for min-members before starting anyway")
    non_iid: bool = Field(False, description="shard by label instead of uniformly (experiments)")
    algorithm: Literal["ft-tree", "tree", "rps", "ps-sync", "ps-async", "ring"] = Field("ft-tree", description="allreduce algorithm")
    arity: int = Field(2, ge=2, le=16, description="tree arity k")
    site: str = Field("", pattern=r"^[A-Za-z0-9_.-]{0,32}$",
                      description="the site (barn, hall, shop) this agent runs at: each site "
                                  "reduces inside itself first; '' = no site")
    rounds: int = Field(0, ge=0, description="rounds to train; 0 = train until stopped (Ctrl-C or SIGTERM)")
    batch: int = Field(100, ge=1, le=60000, description="batch size per agent per step")
    optimizer: Literal["adam", "sgd"] = Field("adam", description="optimizer")
    lr: float = Field(0.001, gt=0, description="learning rate")
    lr_schedule: Literal["constant", "linear"] = Field("constant", description="constant, or linear decay from lr to lr x lr-final over the rounds (needs rounds > 0)")
    lr_final: float = Field(0.1, gt=0, le=1, description="the linear schedule's last rate as a fraction of lr")
    seed: int = Field(0, ge=0, description="seed for init and data order (init is shared by the fleet)")
    timeout_mode: Literal["adaptive", "fixed"] = Field("adaptive", description="per-link timeouts: adaptive (RTO) or fixed")
    timeout: float = Field(0.5, gt=0, description="fixed timeout, and the initial one in adaptive mode (s)")
    min_timeout: float = Field(0.2, gt=0, description="adaptive timeout lower clamp (s); like TCP's minimum RTO it keeps a busy machine's scheduling stalls from looking like dead links")
    max_timeout: float = Field(2.0, gt=0, description="adaptive timeout upper clamp (s)")
    round_deadline: float = Field(5.0, gt=0, description="hard deadline of one allreduce (s)")
    link_rate_floor: float = Field(2e6, gt=0, description="bytes/s: adaptive timeouts let the bytes queued towards a peer drain at no faster a rate (a link fast last round may be slow now); lower it on links slower than that")
    broadcast: Literal["tree", "fanout"] = Field(DEFAULT_BROADCAST, description="ft-tree: how the root's result reaches the members: published once on the root's fan-out topic that every member reads, a missed chunk pulled from the parent (fanout, the default: one hop instead of one per tree level; 15-25 % shorter rounds at 7 agents on loopback), or relayed down the tree by every inner node, each copy ACKed (tree)")
    influence_bound: float = Field(DEFAULT_INFLUENCE_FACTOR, ge=0, le=1000, description="ft-tree: where a unit is first merged, its norm is held to this many running medians of the receiver's own gradient norm (clipped; beyond twice that, counted with zero values), so one device's influence on the mean is bounded (docs/SECURITY.md); 0: no bound")
    audit_units: bool = Field(True, description="ft-tree, with influence_bound: every unit also goes to the sender's grandparent as an audit copy, and each inner node's own part of its unit is held to a member's bound (an inner node weighs one member, as a leaf does; docs/SECURITY.md); off: no copies")
    remember_dead_links: bool = Field(True, description="route around a link that timed out in an earlier round from the start (probing it to notice when it heals); off: detect it again every round, as the thesis measured")
    chunk_size: int = Field(DEFAULT_CHUNK_VALUES, ge=MIN_CHUNK_VALUES, le=MAX_CHUNK_VALUES,
                            description="values per chunk (on slow links the coordinator may "
                                        "choose fewer for the fleet: agent/protocol/chunking.py)")
    adapt_broadcast: bool = Field(True, description="as coordinator (ft-tree) of agents configured with broadcast = tree, have the root publish each result chunk once on its fan-out topic for the whole fleet while large messages arrive slower than 100 MB/s (relayed down the tree, the result crosses an inner node's uplink once per child after its reduce: 1.5-1.7x the busiest link's bytes' time at 6-12.5 MB/s in float16/int8, 1.3-1.5x with the fan-out), back to the tree above 300 MB/s; off: always the configured broadcast")
    adapt_chunks: bool = Field(True, description="as coordinator, cut the vector into 32,768-value chunks for the whole fleet while large messages arrive slower than 100 MB/s (Wi-Fi, 100 Mbit/s: a chunk is forwarded only once whole, so big chunks make a slow link's round 2.5-3x its bytes' time), and back to chunk_size above 300 MB/s; off: always chunk_size")
    wire_dtype: Literal["float32", "float16", "int8", "auto"] = Field(
        "float32", description="wire format of values; auto (ft-tree): each frame in float32, float16 or int8, "
        "the widest in which the round's values cross its link within wire-budget at the link's measured rate "
        "and the busiest link's 3 vectors cross the agent's own link within 0.03 s at its downlink's rate "
        "(float32 until a link is measured; a chunk's result in the narrowest format that went into it)")
    wire_budget: float = Field(AUTO_WIRE_BUDGET, gt=0, description="wire-dtype auto: seconds the round's values "
                               "may take on one link (the default picks float32 from ~16 MB/s, int8 below ~8 MB/s "
                               "for the thesis model)")
    sync_every: int | Literal["auto"] | None = Field(
        None, description="periodic averaging: H local optimizer steps per agent, then the fleet averages the "
        "model delta since the last sync and applies it with the outer optimizer (a round is then a sync "
        "round); auto: the coordinator picks H from the members' measured step and sync times so that the "
        "sync takes at most comm-share of the wall time (1..64, starting at 1); unset: average the gradient "
        "after every step")
    comm_share: float | None = Field(None, gt=0, lt=1, description="with sync-every auto: the share of the "
                                     "wall time the sync may take (default 0.2)")
    outer_optimizer: OuterName = Field("avg", description="with sync-every: how the fleet's mean delta is "
                                       "applied: avg (FedAvg / local SGD) or nesterov (DiLoCo)")
    outer_lr: float | None = Field(None, gt=0, description="with sync-every: the outer learning rate "
                                   "(default: 1 for avg, 0.7 for nesterov)")
    straggler_deadline: float = Field(0.0, ge=0, le=3600, description="ft-tree: seconds a member slower than "
                                      "the rest is waited for after a node's own contribution is ready, then left "
                                      "out of that round's average like a silent member (it takes the fleet's "
                                      "result, or its state, and goes on); 0: wait as the round deadline and the "
                                      "links say")
    eval_every: int = Field(10, ge=0, description="evaluate on the test set every N rounds (0 = never)")
    eval_samples: int = Field(10000, ge=100, le=10000, description="test images per evaluation")
    checkpoint_dir: Path | None = Field(None, description="directory for checkpoints (resume and rejoin)")
    checkpoint_every: int = Field(20, ge=1, description="checkpoint every N rounds")
    telemetry: bool = Field(True, description="publish per-round telemetry")
    dp_clip: float = Field(0.0, ge=0, description="differential privacy (docs/PRIVACY.md): clip each example's "
                           "gradient (the thesis MLP on numpy; any other model: the batch's) to this L2 norm and "
                           "add Gaussian noise before it leaves the device; 0: no differential privacy")
    dp_epsilon: float | None = Field(None, gt=0, description="with dp-clip: the privacy budget epsilon of each "
                                     "device's data over the run (needs the privacy extra on the device); without "
                                     "dp-noise the noise is calibrated to spend it in the job's rounds")
    dp_delta: float = Field(1e-5, gt=0, lt=1, description="with dp-clip: the delta of (epsilon, delta)")
    dp_noise: float | None = Field(None, gt=0, description="with dp-clip: the noise multiplier (noise standard "
                                   "deviation over the clip norm); default: calibrated from dp-epsilon")
    dp_at_budget: Literal["stop", "warn"] = Field("stop", description="with dp-epsilon and dp-noise: at the budget "
                                                  "the fleet stops (the rounds are capped where it is spent) or "
                                                  "each device warns and goes on")

    @field_validator("job")
    @classmethod
    def _job(cls, value: str) -> str:
        return validate_job(value)

    @field_validator("sync_every", mode="before")
    @classmethod
    def _sync_every(cls, value: object) -> int | str | None:
        return parse_sync_every(value)

    @field_validator("partition")
    @classmethod
    def _partition(cls, value: str) -> str:
        parse_partition(value)
        return value

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, value: str | None) -> str | None:
        if value is not None and value not in DATASETS:
            raise ValueError(f"unknown dataset {value!r}; choose one of {', '.join(DATASETS)}")
        return value

    @model_validator(mode="after")
    def _one_data_source(self) -> AgentConfig:
        if self.data is not None and self.dataset is not None:
            raise ValueError("give data (this device's files) or dataset (a packaged one by name), not both")
        if self.non_iid and self.partition != "iid":
            raise ValueError(f"non_iid and partition {self.partition!r} both say how to split: drop non_iid")
        return self

    @model_validator(mode="after")
    def _backend_runs_model(self) -> AgentConfig:
        tflite = self.model.endswith(".tflite")
        if tflite and self.backend != "litert":
            raise ValueError(f"model {self.model} is a .tflite file: run it with backend litert")
        if self.backend == "litert" and self.model != "mlp" and not tflite:
            raise ValueError(f"backend litert runs the thesis MLP or a .tflite model, not {self.model}: "
                             "use backend numpy, or export the model (edgegrove model export)")
        return self

    @field_validator("broker")
    @classmethod
    def _broker(cls, value: str) -> str:
        return broker_url(value)

    @model_validator(mode="after")
    def _tls_ca_needs_mqtts(self) -> AgentConfig:
        if self.tls_ca is not None and not self.broker.startswith("mqtts://"):
            raise ValueError(f"tls_ca is given but the broker URL {self.broker} is not mqtts://: "
                             "use mqtts://HOST:PORT or drop tls_ca")
        return self

    @model_validator(mode="after")
    def _schedule_needs_rounds(self) -> AgentConfig:
        if self.lr_schedule != "constant" and self.rounds == 0:
            raise ValueError(f"lr_schedule {self.lr_schedule!r} decays over the run: set rounds > 0")
        return self

    @model_validator(mode="after")
    def _auto_wire_needs_ft_tree(self) -> AgentConfig:
        if self.wire_dtype == "auto" and Algorithm(self.algorithm) is not Algorithm.FT_TREE:
            raise ValueError(f"wire_dtype auto is for the ft-tree algorithm, not {self.algorithm}: "
                             "use float32, float16 or int8")
        return self

    @model_validator(mode="after")
    def _outer_needs_sync_every(self) -> AgentConfig:
        if self.sync_every is None and (self.outer_optimizer != "avg" or self.outer_lr is not None):
            raise ValueError("outer_optimizer and outer_lr apply to periodic averaging: set sync_every too")
        return self

    @model_validator(mode="after")
    def _comm_share_needs_auto(self) -> AgentConfig:
        if self.comm_share is not None and self.sync_every != "auto":
            raise ValueError("comm_share applies to sync_every auto: set sync_every = auto too")
        return self

    @model_validator(mode="after")
    def _dp_is_calibrated(self) -> AgentConfig:
        if not self.dp_clip:
            if self.dp_epsilon is not None or self.dp_noise is not None:
                raise ValueError("dp_epsilon and dp_noise apply to differential privacy: set dp_clip too")
            return self
        if self.dp_noise is None and (self.dp_epsilon is None or not self.rounds):
            raise ValueError("dp_clip needs dp_noise, or dp_epsilon and rounds > 0 to calibrate it")
        if self.sync_every == "auto":
            raise ValueError("differential privacy counts its steps ahead: use a fixed sync_every, not auto")
        return self

    @property
    def period_rule(self) -> PeriodRule | None:
        """sync-every auto: the coordinator's rule for the period; None: a fixed period or none."""
        if self.sync_every != "auto":
            return None
        return PeriodRule(DEFAULT_COMM_SHARE if self.comm_share is None else self.comm_share)

    @property
    def outer_config(self) -> OuterConfig:
        """The outer optimizer of periodic averaging, its learning rate defaulted by name."""
        lr = DEFAULT_OUTER_LR[self.outer_optimizer] if self.outer_lr is None else self.outer_lr
        return OuterConfig(self.outer_optimizer, lr)

    @property
    def expected_members(self) -> int:
        return self.min_members or self.fleet_size


def parse_sync_every(value: object) -> int | str | None:
    """``sync-every`` as given (a flag's text, a TOML integer): a whole number >= 1 or auto."""
    if value is None or value == "auto":
        return value
    text = str(value).strip()
    if isinstance(value, bool) or not (isinstance(value, int) or text.isdigit()) or int(text) < 1:
        raise ValueError(f"sync-every must be a whole number of local steps, 1 or more, or auto; got {value!r}")
    return int(text)


ENV_PREFIX = "EDGEGROVE_"


def env_overrides(environ: dict[str, str] | None = None) -> dict[str, Any]:
    environ = dict(os.environ if environ is None else environ)
    fields = AgentConfig.model_fields
    out: dict[str, Any] = {}
    for name in fields:
        key = ENV_PREFIX + name.upper()
        if key in environ:
            out[name] = environ[key]
    return out


def load_config(
    flags: dict[str, Any], config_file: Path | None = None, environ: dict[str, str] | None = None
) -> AgentConfig:
    merged: dict[str, Any] = {} if config_file is None else _read_config_file(config_file)
    merged.update(env_overrides(environ))
    merged.update({k: v for k, v in flags.items() if v is not None})
    try:
        config = AgentConfig(**merged)
    except ValidationError as exc:
        raise ConfigError(f"invalid agent configuration: {_problems(exc)}") from None
    return _with_credentials(config)


def _read_config_file(config_file: Path) -> dict[str, Any]:
    try:
        text = input_file(config_file).read_text()
        table = tomllib.loads(text)
    except UsageError as exc:
        raise ConfigError(f"config file: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {config_file} cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {config_file} is not valid TOML: {exc}") from None
    return {k.replace("-", "_"): v for k, v in table.items()}


def _problems(exc: ValidationError) -> str:
    """Pydantic's errors as one line: `field: message; field: message`."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "config"
        message = str(err["ctx"]["error"]) if err["type"] == "value_error" else err["msg"]
        if err["type"] == "extra_forbidden":
            message = "unknown option (see `edgegrove agent --help`)"
        parts.append(f"{where}: {message}")
    return one_line("; ".join(parts))


def check_paths(config: AgentConfig) -> None:
    """The files and directories the configuration names are usable (ConfigError if not)."""
    checks = [("tls_ca", input_file), ("data", existing_path), ("checkpoint_dir", output_dir)]
    for name, check in checks:
        value = getattr(config, name)
        if value is None:
            continue
        try:
            check(value)
        except UsageError as exc:
            raise ConfigError(f"{name.replace('_', '-')}: {exc}") from None


def _with_credentials(config: AgentConfig) -> AgentConfig:
    if config.credentials is None or config.username is not None:
        return config
    import json

    where = f"credentials file {config.credentials}"
    try:
        table = json.loads(input_file(config.credentials).read_text())
        entry = table["agents"][str(config.id)]
        update = {"username": entry["username"], "password": entry["password"]}
        if config.client_id is None and isinstance(entry.get("client_id"), str):
            update["client_id"] = entry["client_id"]
        # make-credentials' per-job keys, for a fleet without enrolment (agent/protocol/keys.py)
        if config.device_key is None and isinstance(entry.get("device_key"), str):
            update["device_key"] = entry["device_key"]
        if config.member_keys is None and isinstance(table.get("member_keys"), dict):
            update["member_keys"] = config.credentials
        return config.model_copy(update=update)
    except UsageError as exc:
        raise ConfigError(f"credentials: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where} cannot be read: {exc}") from None
    except (KeyError, TypeError, ValueError):
        raise ConfigError(
            f"{where} has no entry agents.{config.id} "
            "with username and password (generate it with broker-config/make-credentials)"
        ) from None
