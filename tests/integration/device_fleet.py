"""Device processes for the device integration tests: configs, start/kill, a watcher, jobs.

Devices run as real processes (`python -m agent.cli device --config ...`), each with its own
state directory, against a real mosquitto. The watcher is an MQTT client of the test's that
reads every retained record, execution state and result as they change.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agent.jobs import signing, topics
from agent.jobs.document import DEFAULT_CHUNK_BYTES, ExecStatus, JobSpec, ResultManifest
from agent.jobs.states import ExecState
from agent.transport.mqtt import MqttTransport

REPO = Path(__file__).resolve().parents[2]


def mnist_slice(cache_dir: Path, out: Path, train: int = 1500, test: int = 500) -> Path:
    """A small MNIST .npz (the thesis MLP's input: 784 floats) from the session's cache."""
    raw = np.load(cache_dir / "mnist.npz")
    x = raw["x_train"][:train].reshape(train, -1).astype(np.float32) / np.float32(255.0)
    xt = raw["x_test"][:test].reshape(test, -1).astype(np.float32) / np.float32(255.0)
    np.savez(out, x=x, y=raw["y_train"][:train].astype(np.int64), x_test=xt,
             y_test=raw["y_test"][:test].astype(np.int64))
    return out


@dataclass
class Device:
    name: str
    config: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "device", "--config", str(self.config)],
                                         env=env, stdout=out, stderr=subprocess.STDOUT, cwd=self.config.parent)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def write_config(root: Path, name: str, broker_url: str, operator_key: str, data: dict[str, dict[str, str]],
                 extra: str = "", credentials: tuple[str, str] | None = None) -> Device:
    home = root / name
    home.mkdir(parents=True, exist_ok=True)
    lines = [f'id = "{name}"', f'broker = "{broker_url}"', f'operator_keys = ["{operator_key}"]',
             f'state_dir = "{home / "state"}"', 'labels = { site = "barn" }', extra]
    if credentials is not None:
        lines += [f'username = "{credentials[0]}"', f'password = "{credentials[1]}"']
    for source, fields in data.items():
        lines.append(f"[data.{source}]")
        lines += [f'{k} = "{v}"' for k, v in fields.items()]
    (home / "device.toml").write_text("\n".join(lines) + "\n")
    return Device(name, home / "device.toml", home / "device.log")


@dataclass
class Watcher:
    """The retained state of devices and jobs as an operator sees it, and every exec change."""

    transport: MqttTransport
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    execs: dict[tuple[str, str], ExecStatus] = field(default_factory=dict)
    history: dict[tuple[str, str], list[ExecStatus]] = field(default_factory=dict)
    results: dict[str, ResultManifest] = field(default_factory=dict)
    chunks: dict[tuple[str, int], bytes] = field(default_factory=dict)

    @classmethod
    def connect(cls, url: str, credentials: tuple[str, str] | None = None) -> Watcher:
        user, password = credentials or (None, None)
        transport = MqttTransport(f"watcher-{os.getpid()}-{time.monotonic_ns()}", url, username=user,
                                  password=password, threaded=True)
        transport.connect([topics.all_device_records(), topics.all_execs(), "edgegrove/jobs/+/result",
                           "edgegrove/jobs/+/result/+"])
        return cls(transport)

    def pump(self, timeout: float = 0.1) -> None:
        for m in self.transport.receive(timeout):
            if not m.payload:
                continue
            if (device := topics.parse_device_record(m.topic)) is not None:
                self.records[device] = json.loads(m.payload)
            elif (pair := topics.parse_job_exec(m.topic)) is not None:
                status = ExecStatus.model_validate_json(m.payload)
                self.execs[pair] = status
                self.history.setdefault(pair, []).append(status)
            elif (job := topics.parse_job_result(m.topic)) is not None:
                self.results[job] = ResultManifest.model_validate_json(m.payload)
            elif (chunk := topics.parse_job_result_chunk(m.topic)) is not None:
                self.chunks[chunk] = m.payload

    def wait(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}; execs: "
                                     f"{ {k: (v.state.value, v.round) for k, v in self.execs.items()} }")
            self.pump(0.2)

    def state(self, job: str, device: str) -> ExecState | None:
        status = self.execs.get((job, device))
        return status.state if status else None

    def states(self, job: str, device: str) -> list[ExecState]:
        seen = [s.state for s in self.history.get((job, device), [])]
        return [s for i, s in enumerate(seen) if i == 0 or seen[i - 1] is not s]

    def result_bytes(self, job: str) -> bytes:
        manifest = self.results[job]
        return b"".join(self.chunks[(job, i)] for i in range(manifest.chunks))

    def close(self) -> None:
        self.transport.close()


def submit(operator: MqttTransport, key: Any, name: str, devices: list[str], **fields: Any) -> JobSpec:
    """Sign and publish a job (retained) the way `job submit` does, devices sorted by name."""
    document: dict[str, Any] = {"name": name, "data": "mnist", "submitted_at": time.time(),
                                "assignments": {d: i for i, d in enumerate(sorted(devices))}}
    document.update(fields)
    spec = JobSpec.model_validate(document)
    operator.publish(topics.job_spec(name), signing.envelope_bytes(signing.sign(spec, key)),
                     retain=True, reliable=True)
    return spec


def publish_blob(operator: MqttTransport, data: bytes, claimed_sha: str | None = None) -> dict[str, Any]:
    """A model file's retained chunks; ``claimed_sha`` lets a test claim a hash the bytes lack."""
    sha = claimed_sha or hashlib.sha256(data).hexdigest()
    chunks = [data[i:i + DEFAULT_CHUNK_BYTES] for i in range(0, len(data), DEFAULT_CHUNK_BYTES)]
    for i, chunk in enumerate(chunks):
        operator.publish(topics.blob_chunk(sha, i), chunk, retain=True, reliable=True)
    return {"sha256": sha, "size": len(data), "chunks": len(chunks), "filename": "model.py"}


def stop(operator: MqttTransport, key: Any, name: str) -> None:
    from agent.jobs.document import ControlMessage

    control = ControlMessage.model_validate({"job": name, "action": "stop", "issued_at": time.time()})
    operator.publish(topics.job_control(name), signing.envelope_bytes(signing.sign(control, key)),
                     retain=True, reliable=True)


def plain_mosquitto(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A mosquitto without users (the device behaviour tests; the ACL test uses dynsec)."""
    from simulate.brokers import free_port, mosquitto_binary

    binary = mosquitto_binary()
    assert binary is not None, "mosquitto is not installed: run scripts/setup.sh --dev"
    port = free_port()
    conf = workdir / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\nset_tcp_nodelay true\n"
                    "max_queued_messages 10000\n")
    proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"mqtt://127.0.0.1:{port}"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            probe = MqttTransport("probe", url, threaded=True, connect_timeout=1.0)
            probe.connect([])
            probe.close()
            return proc, url
        except Exception:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("mosquitto did not start")
