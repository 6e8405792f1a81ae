"""What `job submit` builds before it publishes: the checked model, the signed document."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.jobs.document import DataSourceInfo, DeviceRecord, JobSpec
from agent.jobs.signing import KeyRing, envelope_bytes, generate_key, open_signed, sign
from agent.model.contract import ModelError
from agent.operator.blobs import blob_ref
from agent.operator.fleet import FleetView
from agent.operator.jobfile import JobFileError, read_job_file
from agent.operator.submit import build_spec, check_model
from agent.transport.base import Message

REPO = Path(__file__).resolve().parents[3]


def devices(*names: str, data: str = "mnist") -> dict[str, DeviceRecord]:
    return {n: DeviceRecord(id=n, data={data: DataSourceInfo(format="mnist", samples=1)}) for n in names}


def job_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.toml"
    path.write_text('name = "j1"\ndata = "mnist"\n' + text)
    return path


def test_a_job_becomes_a_signed_document_a_device_opens(tmp_path: Path) -> None:
    job = read_job_file(job_file(tmp_path, "min_devices = 2\n[stop]\nrounds = 30\n"))
    checked = check_model(job)
    spec, chosen = build_spec(job, devices("b", "a", "c"), None, now=100.0, submitted_by="me")
    assert spec.assignments == {"a": 0, "b": 1, "c": 2} and chosen.skipped == {}
    assert (spec.model, spec.stop.rounds, spec.submitted_at, spec.fleet_size) == ("mlp", 30, 100.0, 3)
    assert len(checked.fingerprint) == 16 and checked.path is None
    key = generate_key()
    opened = open_signed(envelope_bytes(sign(spec, key)), KeyRing.of([key.public_key()]), JobSpec)
    assert opened == spec
    view = FleetView().take_all([Message("edgegrove/jobs/j1/spec", envelope_bytes(sign(spec, key)), True)])
    assert view.jobs["j1"] == spec


def test_a_tflite_model_goes_as_a_blob_with_the_litert_backend(tmp_path: Path) -> None:
    cnn = REPO / "examples" / "mnist_cnn" / "mnist_cnn.tflite"
    job = read_job_file(job_file(tmp_path, f'model = "{cnn}"\npartition = "dirichlet:0.5"\n'))
    checked = check_model(job)
    assert checked.path == cnn
    ref, data = blob_ref(cnn)
    spec, _ = build_spec(job, devices("a"), ref, now=1.0, submitted_by="")
    assert spec.backend == "litert" and spec.model == ref and ref.size == len(data)


def test_settings_a_device_would_reject_are_refused_at_submit(tmp_path: Path) -> None:
    digits = REPO / "examples" / "digits" / "model.py"
    job = read_job_file(job_file(tmp_path, f'model = "{digits}:factory"\nbackend = "litert"\n'))
    ref, _ = blob_ref(digits)
    with pytest.raises(JobFileError, match="backend litert"):
        build_spec(job, devices("a"), ref, now=1.0, submitted_by="")


def test_a_model_that_fails_its_check_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def factory():\n    raise RuntimeError('no weights here')\n")
    job = read_job_file(job_file(tmp_path, 'model = "bad.py:factory"\n'))
    with pytest.raises(ModelError, match="no weights here"):
        check_model(job)
