"""device.toml: who the device is, where its broker is, what data it holds, whom it trusts.

    id = "pi-3"
    broker = "mqtt://broker.local:1883"
    credentials = "/etc/edgegrove/device-credentials.json"   # or username / password
    labels = { site = "barn" }
    operator_keys = ["<base64 Ed25519 public key>"]           # or the path of a .pub file
    state_dir = "/var/lib/edgegrove"
    backends = ["numpy", "litert"]
    [data.mnist]
    format = "mnist"
    [data.cameras]
    path = "/data/cam"
    format = "images"

Any problem is one line (ConfigError) before anything starts.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agent.config import ConfigError, _problems
from agent.jobs.document import validate_source_name
from agent.jobs.envelope import KeyProblem, raw_public_key
from agent.jobs.topics import validate_device
from agent.protocol.keys import key_bytes
from agent.validate import UsageError, broker_url, existing_path, input_file, one_line, output_dir

DataFormat = Literal["npz", "csv", "images", "mnist", "digits"]
BackendName = Literal["numpy", "litert"]
ALL_BACKENDS: tuple[BackendName, ...] = ("numpy", "litert")
PACKAGED = {"mnist": "mnist", "digits": "digits"}  # formats a package can supply without a path


class DataSource(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format: DataFormat
    path: Path | None = None
    label_column: str = "label"

    @model_validator(mode="after")
    def _path_where_needed(self) -> DataSource:
        if self.path is None and self.format not in PACKAGED:
            raise ValueError(f"format {self.format} needs a path")
        if self.path is not None and self.format == "digits":
            raise ValueError("format digits is scikit-learn's bundled set: give no path")
        return self


class DeviceConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    broker: str = "mqtt://127.0.0.1:1883"
    username: str | None = None
    password: str | None = None
    credentials: Path | None = None  # JSON {username, password[, client_id]} (edgegrove fleet enroll)
    client_id: str | None = None
    tls_ca: Path | None = None
    mqtt_version: Literal["3.1.1", "5"] = "3.1.1"
    keepalive: int = Field(default=10, ge=2, le=600)
    labels: dict[str, str] = Field(default_factory=dict)
    operator_keys: list[str] = Field(min_length=1)
    # The device key (`edgegrove enroll`): base64 raw Ed25519 private key, or a 0600 file holding
    # it; signs the control messages of its jobs. None: jobs with member keys are refused.
    device_key: str | None = None
    device_public_key: str | None = None  # its public half, shown in the device's record
    state_dir: Path
    backends: list[BackendName] = Field(default_factory=lambda: list(ALL_BACKENDS))
    data: dict[str, DataSource] = Field(default_factory=dict)
    min_free_memory_mb: float = Field(default=64.0, ge=0)
    log_rate: float = Field(default=0.5, gt=0, le=100)  # log lines per second to the broker
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        return validate_device(value)

    @field_validator("broker")
    @classmethod
    def _broker(cls, value: str) -> str:
        return broker_url(value)

    @field_validator("data")
    @classmethod
    def _names(cls, value: dict[str, DataSource]) -> dict[str, DataSource]:
        for name in value:
            validate_source_name(name)  # the same names a job may ask for
        return value

    @model_validator(mode="after")
    def _tls(self) -> DeviceConfig:
        if self.tls_ca is not None and not self.broker.startswith("mqtts://"):
            raise ValueError(f"tls_ca is given but the broker URL {self.broker} is not mqtts://")
        return self

    @field_validator("device_key")
    @classmethod
    def _device_key(cls, value: str | None) -> str | None:
        if value is None or key_bytes(value) is not None:
            return value
        try:
            text = Path(value).read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"neither a base64 Ed25519 private key nor a readable file: {exc}") from None
        if key_bytes(text) is None:
            raise ValueError(f"{value} does not hold a base64 Ed25519 private key (32 bytes)")
        return text

    @property
    def private_device_key(self) -> bytes | None:
        return None if self.device_key is None else key_bytes(self.device_key)

    @property
    def mqtt_client_id(self) -> str:
        return self.client_id or f"edgegrove-device-{self.id}"


def load_device_config(path: Path) -> tuple[DeviceConfig, list[bytes]]:
    """The device's configuration with its credentials filled in, and its operator keys (raw)."""
    table = read_toml(path)
    try:
        config = DeviceConfig.model_validate(table)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_problems(exc).replace('edgegrove agent', 'edgegrove device')}") from None
    config = _with_credentials(config)
    _check_paths(config)
    try:
        keys = [raw_public_key(text) for text in config.operator_keys]
    except KeyProblem as exc:
        raise ConfigError(f"{path}: operator_keys: {exc}") from None
    return config, keys


def read_toml(path: Path) -> dict[str, object]:
    try:
        return tomllib.loads(input_file(path).read_text())
    except UsageError as exc:
        raise ConfigError(f"device config: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"device config {path} cannot be read: {one_line(str(exc))}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"device config {path} is not valid TOML: {exc}") from None


def _with_credentials(config: DeviceConfig) -> DeviceConfig:
    if config.credentials is None or config.username is not None:
        return config
    try:
        entry = json.loads(input_file(config.credentials).read_text())
        update = {"username": str(entry["username"]), "password": str(entry["password"])}
    except UsageError as exc:
        raise ConfigError(f"credentials: {exc}") from None
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        raise ConfigError(f"credentials file {config.credentials} has no username and password "
                          "(write it with `edgegrove fleet enroll`)") from None
    if config.client_id is None and isinstance(entry.get("client_id"), str):
        update["client_id"] = entry["client_id"]
    return config.model_copy(update=update)


def _check_paths(config: DeviceConfig) -> None:
    try:
        if config.tls_ca is not None:
            input_file(config.tls_ca)
        output_dir(config.state_dir)
        for name, source in config.data.items():
            if source.path is not None:
                try:
                    existing_path(source.path)
                except UsageError as exc:
                    raise UsageError(f"data.{name}: {exc}") from None
    except UsageError as exc:
        raise ConfigError(str(exc)) from None
