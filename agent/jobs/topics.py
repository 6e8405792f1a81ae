"""Every MQTT topic of devices and jobs, in one place (root ``edgegrove``).

    edgegrove/devices/<device>            retained device record (Will: state offline)
    edgegrove/devices/<device>/log        warnings and errors, rate-limited
    edgegrove/jobs/<job>/spec             retained signed job document (operator only)
    edgegrove/jobs/<job>/control          retained signed control (operator only)
    edgegrove/jobs/<job>/exec/<device>    retained execution state (that device only)
    edgegrove/jobs/<job>/result           retained result manifest (a member of the job)
    edgegrove/jobs/<job>/result/<i>       retained result chunks (float32 LE)
    edgegrove/blobs/<sha256>/<i>          retained model-file chunks (operator only)

A job's training traffic keeps ``edgegrove/<job>/...`` (agent.protocol.topics), so a job may
not be named like one of the roots above.
"""

from __future__ import annotations

import re

from agent.protocol.topics import validate_job

ROOT = "edgegrove"
RESERVED_JOB_NAMES = frozenset({"devices", "jobs", "blobs"})
MAX_CHUNKS = 1 << 16

_DEVICE_RE = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,62})")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_INDEX_RE = re.compile(r"0|[1-9][0-9]{0,5}")


def validate_device(name: str) -> str:
    """A device id: 1-63 of [a-z0-9-], starting with a letter or digit."""
    if not isinstance(name, str) or not _DEVICE_RE.fullmatch(name):
        raise ValueError(f"device name {name!r} is not valid: use 1-63 lowercase letters, "
                         "digits or '-', starting with a letter or digit")
    return name


def validate_job_name(name: str) -> str:
    """A job name: the agent's job-name rule, and none of the roots of this module."""
    validate_job(name)
    if name in RESERVED_JOB_NAMES:
        raise ValueError(f"job name {name!r} is reserved (its training topics would be "
                         f"{ROOT}/{name}/...): pick another")
    return name


def validate_sha256(text: str) -> str:
    if not isinstance(text, str) or not _SHA256_RE.fullmatch(text):
        raise ValueError(f"{text!r} is not a sha256 (64 lowercase hex digits)")
    return text


# -- devices -------------------------------------------------------------------------------

def device_record(device: str) -> str:
    return f"{ROOT}/devices/{validate_device(device)}"


def all_device_records() -> str:
    return f"{ROOT}/devices/+"


def device_log(device: str) -> str:
    return f"{ROOT}/devices/{validate_device(device)}/log"


def all_device_logs() -> str:
    return f"{ROOT}/devices/+/log"


# -- jobs ----------------------------------------------------------------------------------

def job_spec(job: str) -> str:
    return f"{ROOT}/jobs/{validate_job_name(job)}/spec"


def all_job_specs() -> str:
    return f"{ROOT}/jobs/+/spec"


def job_control(job: str) -> str:
    return f"{ROOT}/jobs/{validate_job_name(job)}/control"


def all_job_controls() -> str:
    return f"{ROOT}/jobs/+/control"


def job_exec(job: str, device: str) -> str:
    return f"{ROOT}/jobs/{validate_job_name(job)}/exec/{validate_device(device)}"


def job_execs(job: str) -> str:
    """Every device's execution of one job."""
    return f"{ROOT}/jobs/{validate_job_name(job)}/exec/+"


def all_execs_of(device: str) -> str:
    """One device's executions of every job (what a restarted device reads back)."""
    return f"{ROOT}/jobs/+/exec/{validate_device(device)}"


def all_execs() -> str:
    return f"{ROOT}/jobs/+/exec/+"


def job_result(job: str) -> str:
    return f"{ROOT}/jobs/{validate_job_name(job)}/result"


def job_result_chunk(job: str, index: int) -> str:
    return f"{ROOT}/jobs/{validate_job_name(job)}/result/{_index(index)}"


def job_result_chunks(job: str) -> str:
    return f"{ROOT}/jobs/{validate_job_name(job)}/result/+"


# -- blobs ---------------------------------------------------------------------------------

def blob_chunk(sha256: str, index: int) -> str:
    return f"{ROOT}/blobs/{validate_sha256(sha256)}/{_index(index)}"


def blob_chunks(sha256: str) -> str:
    return f"{ROOT}/blobs/{validate_sha256(sha256)}/+"


# -- parsing: None for anything that is not exactly such a topic -----------------------------

def parse_device_record(topic: str) -> str | None:
    parts = _parts(topic, "devices", 1)
    return parts[0] if parts and _DEVICE_RE.fullmatch(parts[0]) else None


def parse_device_log(topic: str) -> str | None:
    parts = _parts(topic, "devices", 2)
    return parts[0] if parts and parts[1] == "log" and _DEVICE_RE.fullmatch(parts[0]) else None


def parse_job_spec(topic: str) -> str | None:
    return _job_leaf(topic, "spec")


def parse_job_control(topic: str) -> str | None:
    return _job_leaf(topic, "control")


def parse_job_result(topic: str) -> str | None:
    return _job_leaf(topic, "result")


def parse_job_exec(topic: str) -> tuple[str, str] | None:
    """(job, device) of an exec topic."""
    parts = _parts(topic, "jobs", 3)
    if not parts or parts[1] != "exec" or not _is_job(parts[0]) or not _DEVICE_RE.fullmatch(parts[2]):
        return None
    return parts[0], parts[2]


def parse_job_result_chunk(topic: str) -> tuple[str, int] | None:
    """(job, chunk index) of a result chunk topic."""
    parts = _parts(topic, "jobs", 3)
    if not parts or parts[1] != "result" or not _is_job(parts[0]) or not _INDEX_RE.fullmatch(parts[2]):
        return None
    return parts[0], int(parts[2])


def parse_blob_chunk(topic: str) -> tuple[str, int] | None:
    """(sha256, chunk index) of a blob chunk topic."""
    parts = _parts(topic, "blobs", 2)
    if not parts or not _SHA256_RE.fullmatch(parts[0]) or not _INDEX_RE.fullmatch(parts[1]):
        return None
    return parts[0], int(parts[1])


def _job_leaf(topic: str, leaf: str) -> str | None:
    parts = _parts(topic, "jobs", 2)
    return parts[0] if parts and parts[1] == leaf and _is_job(parts[0]) else None


def _parts(topic: str, kind: str, count: int) -> list[str] | None:
    head = f"{ROOT}/{kind}/"
    if not topic.startswith(head):
        return None
    parts = topic[len(head):].split("/")
    return parts if len(parts) == count else None


def _is_job(name: str) -> bool:
    try:
        validate_job_name(name)
    except ValueError:
        return False
    return True


def _index(index: int) -> int:
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < MAX_CHUNKS:
        raise ValueError(f"chunk index {index!r} is not in 0..{MAX_CHUNKS - 1}")
    return index
