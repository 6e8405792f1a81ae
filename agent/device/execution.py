"""One job run in the device's process: its AgentConfig, its model and data, the runtime, and
the trained parameters it leaves (published by the coordinator's device).

The job's node is one ``AgentRuntime`` with its own MQTT connection (client id
``edgegrove-<job>-<node>``, the device's credentials); ``should_stop`` is the device's hook, so
the device keeps listening to its own topics between the runtime's polls.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from agent.config import AgentConfig, _problems
from agent.device.config import PACKAGED, DeviceConfig
from agent.device.events import Outcome
from agent.device.facts import meminfo
from agent.jobs import topics
from agent.jobs.document import (
    DEFAULT_CHUNK_BYTES,
    BlobRef,
    JobSpec,
    ResultManifest,
    TensorLayout,
    canonical_json,
    training_options,
)
from agent.jobs.states import ExecState, RejectReason
from agent.protocol.keys import MemberKeys, public_of, ring_of
from agent.runtime import AgentRuntime, RoundReport, Training, TransportWrapper, load_training

log = logging.getLogger("edgegrove.device")
THESIS_MODEL_BYTES = 407_050 * 4
# Resident bytes a job needs per byte of model beyond the device's own: parameters, gradient,
# the optimizer's two slots, the round's buffers and a state copy (measured ~10x for the MLP).
MODEL_MEMORY_FACTOR = 16
EVAL_CHUNK = 1000


class Unfit(Exception):
    """The job cannot run here: a RejectReason and one line."""

    def __init__(self, reason: RejectReason, line: str) -> None:
        super().__init__(line)
        self.reason = reason


def agent_config(device: DeviceConfig, spec: JobSpec, node: int, model_file: Path | None,
                 checkpoints: Path) -> AgentConfig:
    """The agent configuration of this device's node of ``spec`` (Unfit if the job's options
    do not make one)."""
    source = device.data[spec.data]
    fields = training_options(spec)
    fields.update(id=node, broker=device.broker, username=device.username, password=device.password,
                  tls_ca=device.tls_ca, mqtt_version=device.mqtt_version, checkpoint_dir=checkpoints,
                  label_column=source.label_column)
    fields.setdefault("keepalive", device.keepalive)
    if source.path is None:
        fields["dataset"] = PACKAGED[source.format]
    else:
        fields["data"] = source.path
    if model_file is not None and isinstance(spec.model, BlobRef):
        fields["model"] = str(model_file) if spec.model.is_tflite else f"{model_file}:{spec.model.factory}"
    try:
        return AgentConfig(**fields)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise Unfit(RejectReason.INVALID_DOCUMENT, f"the job's options: {_problems(exc)}") from None


def job_keys(device: DeviceConfig, spec: JobSpec, node: int) -> MemberKeys | None:
    """The keys this device's node of ``spec`` signs and checks with: its device key and the
    ring the job pinned (None: a job without member keys). Unfit when the job pinned a key
    that is not this device's: it would sign what nobody accepts."""
    if not spec.member_keys:
        return None
    private = device.private_device_key
    ring = ring_of(spec.member_keys)
    if private is None or ring.get(node) != public_of(private):
        raise Unfit(RejectReason.DEVICE_KEY_MISMATCH,
                    f"the job pins a device key for node {node} that is not this device's "
                    f"({'none configured' if private is None else 'enrol it again and resubmit'})")
    return MemberKeys.of_private(node, private, ring)


def check_memory(spec: JobSpec, min_free_mb: float, available: int | None = None) -> None:
    """Unfit unless the job's model fits beside the free memory the device keeps."""
    model_bytes = spec.model.size if isinstance(spec.model, BlobRef) else THESIS_MODEL_BYTES
    needed = MODEL_MEMORY_FACTOR * model_bytes + int(min_free_mb * 2**20)
    free = meminfo("MemAvailable") if available is None else available
    if free and free < needed:
        raise Unfit(RejectReason.NOT_ENOUGH_MEMORY,
                    f"{free / 2**20:.0f} MB available, the job needs about {needed / 2**20:.0f} MB")


def prepare(config: AgentConfig, spec: JobSpec) -> Training:
    """The job's model, this device's part of the data and the backend (Unfit: the model's
    check failed on this device's data)."""
    from agent.model.contract import ModelError
    from agent.model.data import DataError
    from agent.model.data_budget import DataTooLarge

    try:
        return load_training(config, shard=(0, 1) if spec.partition == "none" else None)
    except DataTooLarge as exc:  # refused before reading it: the device stays up
        raise Unfit(RejectReason.NOT_ENOUGH_MEMORY, str(exc)) from None
    except (DataError, ModelError) as exc:
        raise Unfit(RejectReason.MODEL_CHECK_FAILED, str(exc)) from None
    except Exception as exc:  # the job's model is the user's code: whatever it raises, refused
        raise Unfit(RejectReason.MODEL_CHECK_FAILED, f"{type(exc).__name__}: {exc}") from None


@dataclass
class Finished:
    """How a job's run ended here."""

    outcome: Outcome
    round: int
    detail: str = ""
    coordinator: bool = False
    params: np.ndarray | None = None
    model_hash: str = ""
    losses: list[float] = field(default_factory=list)


def run(config: AgentConfig, training: Training, should_stop: Callable[[], bool],
        on_round: Callable[[RoundReport], None], wrap_transport: TransportWrapper | None = None,
        keys: MemberKeys | None = None) -> Finished:
    """Run the node to its end (rounds reached, stopped, or failed). ``wrap_transport``
    decorates the job's MQTT transport (the simulator's fault injector), as for the agent."""
    from agent.core import Phase
    from agent.model.contract import ModelError
    from agent.transport.base import TransportError
    from agent.transport.mqtt import MqttTransport

    try:
        mqtt = MqttTransport(
            config.client_id or f"edgegrove-{config.job}-{config.id}", config.broker,
            username=config.username, password=config.password,
            tls_ca=str(config.tls_ca) if config.tls_ca else None, protocol=config.mqtt_version,
            keepalive=config.keepalive, threaded=False,
            max_publish_bytes_per_s=config.publish_rate * 1e6 if config.publish_rate else None)
        transport = mqtt if wrap_transport is None else wrap_transport(mqtt, config)
        runtime = AgentRuntime(config, training.backend, training.batches, training.test_set, transport,
                               should_stop=should_stop, on_round=on_round, model=training.identity,
                               labels=tuple(training.labels), keys=keys)
        code = runtime.run()
    except (TransportError, ModelError) as exc:
        return Finished(Outcome.FAILED, 0, str(exc))
    except Exception as exc:  # the user's model mid-training: this job fails, the device stays up
        log.exception("job %s failed", config.job)
        return Finished(Outcome.FAILED, 0, f"{type(exc).__name__}: {exc}")
    if code != 0:
        why = "the fleet of this job runs another model" if code == 5 else (
            "another process runs this node" if code == 4 else f"the runtime ended with status {code}")
        return Finished(Outcome.FAILED, runtime.round, why)
    done = runtime.core.phase == Phase.DONE
    # The lowest member of the final view, not the lowest live one now: the members that ended
    # first are offline by the time the others look, and one publisher is wanted, not several.
    final_view = runtime.core.parts.membership.views.latest
    coordinator = final_view is not None and min(final_view.members) == runtime.core.parts.node
    return Finished(Outcome.COMPLETED if done else Outcome.STOPPED, runtime.round, coordinator=coordinator,
                    params=runtime.backend.params().copy(), model_hash=f"{runtime.backend.model_hash():08x}")


def evaluate(training: Training, params_backend_accuracy: Callable[[np.ndarray, np.ndarray], float],
             limit: int) -> float | None:
    """The trained model's accuracy on this device's test set (the result's metric)."""
    from agent.model.data import to_float_pixels

    x, y = training.test_set
    n = min(limit, len(y))
    if n == 0:
        return None
    correct = 0.0
    for start in range(0, n, EVAL_CHUNK):
        stop = min(n, start + EVAL_CHUNK)
        correct += params_backend_accuracy(to_float_pixels(x[start:stop]), y[start:stop]) * (stop - start)
    return correct / n


def result_messages(spec: JobSpec, device: str, node: int, training: Training, finished: Finished,
                    accuracy: float | None, states: dict[str, ExecState], now: float,
                    chunk_size: int = DEFAULT_CHUNK_BYTES) -> list[tuple[str, bytes]]:
    """The result chunks (float32 little-endian) and then the manifest, as (topic, payload)."""
    assert finished.params is not None
    data = np.ascontiguousarray(finished.params, dtype="<f4").tobytes()
    chunks = [data[i:i + chunk_size] for i in range(0, len(data), chunk_size)]
    manifest = ResultManifest(
        job=spec.name, device=device, node=node, round=finished.round, accuracy=accuracy,
        loss=finished.losses[-1] if finished.losses else None, model=spec.model,
        model_hash=finished.model_hash, fingerprint=training.identity.fingerprint,
        params_sha256=hashlib.sha256(data).hexdigest(), values=len(data) // 4, chunk_size=chunk_size,
        chunks=math.ceil(len(data) / chunk_size),
        layout=[TensorLayout(name=t.name, shape=list(t.shape)) for t in training.model.tensors],
        states=states, published_at=now)
    return ([(topics.job_result_chunk(spec.name, i), c) for i, c in enumerate(chunks)]
            + [(topics.job_result(spec.name), canonical_json(manifest).encode())])
