"""The retained messages of a small fleet of devices and jobs (agent.jobs' wire), as the broker
holds them: four devices, three finished jobs (one succeeded with its result, one failed, one
canceled) and one running. Used by the directory's unit tests and the views' browser test."""

from __future__ import annotations

from agent.jobs import topics
from agent.jobs.document import (
    DataSourceInfo,
    DeviceRecord,
    ExecStatus,
    JobSpec,
    ResultManifest,
    StopRule,
    TensorLayout,
    canonical_json,
)
from agent.jobs.envelope import Envelope
from agent.jobs.states import DeviceState, ExecState, RejectReason

T0 = 1_780_000_000.0  # the first job's submission, Unix time
DEVICES = ("barn-pi-1", "barn-pi-2", "hall-jetson", "shop-pi-3")
FINISHED = ("digits-a", "digits-b", "digits-c")
RUNNING = "digits-live"
Message = tuple[str, bytes]


def device_record(device: str, state: DeviceState = DeviceState.IDLE, job: str | None = None,
                  node: int | None = None) -> DeviceRecord:
    arm = device != "hall-jetson"
    return DeviceRecord(
        id=device, labels={"site": device.split("-")[0], "kind": "pi" if arm else "jetson"},
        arch="aarch64" if arm else "x86_64", cores=4, memory=(4 if arm else 16) << 30,
        memory_available=(3 if arm else 12) << 30, backends=["numpy", "litert"] if arm else ["numpy"],
        data={"mnist": DataSourceInfo(format="idx", samples=6000, labels=[600] * 10)},
        version="0.9.0", state=state, job=job, node=node, last_seen=T0 + 4000, started_at=T0 - 100)


def job_spec(name: str, at: float, devices: tuple[str, ...], rounds: int) -> JobSpec:
    return JobSpec(name=name, data="mnist", assignments={d: k for k, d in enumerate(devices)},
                   stop=StopRule(rounds=rounds), submitted_by="operator-ana", submitted_at=at)


def signed(spec: JobSpec) -> bytes:
    """An envelope as `edgegrove job submit` publishes it (the page does not check signatures)."""
    return canonical_json(Envelope(payload=canonical_json(spec), key_id="0" * 16, signature="c2ln")).encode()


def exec_status(job: str, device: str, node: int, state: ExecState, round_no: int | None,
                accuracy: float | None, at: float, seq: int, **more: object) -> ExecStatus:
    return ExecStatus(job=job, device=device, node=node, state=state, round=round_no, accuracy=accuracy,
                      updated_at=at, seq=seq, **more)  # type: ignore[arg-type]


def _job_messages(name: str, at: float, devices: tuple[str, ...], rounds: int, end: ExecState,
                  last_round: int) -> list[Message]:
    out: list[Message] = [(topics.job_spec(name), signed(job_spec(name, at, devices, rounds)))]
    for node, device in enumerate(devices):
        for step, round_no in enumerate(range(0, last_round + 1, 10)):
            status = exec_status(name, device, node, ExecState.TRAINING, round_no, 0.5 + 0.4 * round_no / rounds,
                                 at + 10 + round_no, step)
            out.append((topics.job_exec(name, device), canonical_json(status).encode()))
        final = exec_status(name, device, node, end, last_round, 0.5 + 0.4 * last_round / rounds,
                            at + 20 + last_round, 99, detail="" if end is ExecState.SUCCEEDED else f"{end} at the end")
        out.append((topics.job_exec(name, device), canonical_json(final).encode()))
    return out


def fleet_messages() -> list[Message]:
    """Every retained message, oldest first."""
    out: list[Message] = []
    out += _job_messages("digits-a", T0, DEVICES[:3], 100, ExecState.SUCCEEDED, 100)
    result = ResultManifest(job="digits-a", device=DEVICES[0], node=0, round=100, accuracy=0.91, loss=0.3,
                            model="mlp", model_hash="ab" * 8, fingerprint="f" * 16, params_sha256="0" * 64, values=407050,
                            chunk_size=262144, chunks=7, layout=[TensorLayout(name="w", shape=[407050])],
                            published_at=T0 + 130)
    out.append((topics.job_result("digits-a"), canonical_json(result).encode()))
    out += _job_messages("digits-b", T0 + 1000, DEVICES[1:], 60, ExecState.FAILED, 40)
    out += _job_messages("digits-c", T0 + 2000, DEVICES[:2], 200, ExecState.CANCELED, 80)
    # One device refused the running job; the three others train it.
    live = job_spec(RUNNING, T0 + 3000, DEVICES, 300)
    out.append((topics.job_spec(RUNNING), signed(live)))
    for node, device in enumerate(DEVICES):
        if device == "hall-jetson":
            status = exec_status(RUNNING, device, node, ExecState.REJECTED, None, None, T0 + 3005, 1,
                                 reason=RejectReason.BACKEND_MISSING, detail="the job's backend is not installed")
        else:
            status = exec_status(RUNNING, device, node, ExecState.TRAINING, 120, 0.84, T0 + 3200, 12)
        out.append((topics.job_exec(RUNNING, device), canonical_json(status).encode()))
    for node, device in enumerate(DEVICES):
        training = device != "hall-jetson"
        record = device_record(device, DeviceState.TRAINING if training else DeviceState.IDLE,
                               RUNNING if training else None, node if training else None)
        out.append((topics.device_record(device), canonical_json(record).encode()))
    return out
