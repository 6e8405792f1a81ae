"""The device core's decisions, with no broker, no clock and no sleep."""

from __future__ import annotations

import hashlib
from typing import Any

from agent.device import actions as a
from agent.device import events as e
from agent.device.core import SETTLE_S, Capabilities, DeviceCore
from agent.jobs import signing
from agent.jobs.document import ControlMessage, ExecStatus, JobSpec, canonical_json
from agent.jobs.states import DeviceState, ExecState, RejectReason

OPERATOR = signing.generate_key()
STRANGER = signing.generate_key()
RING = signing.KeyRing.parse([signing.public_key_text(OPERATOR)])
CAPS = Capabilities("dev-a", frozenset({"mnist"}), frozenset({"numpy"}), (("site", "barn"),))
T0 = 1000.0


def job(name: str = "j1", at: float = 1.0, key: Any = OPERATOR, **over: Any) -> bytes:
    fields: dict[str, Any] = {"name": name, "data": "mnist", "assignments": {"dev-a": 0, "dev-b": 1},
                              "submitted_at": at}
    fields.update(over)
    return signing.envelope_bytes(signing.sign(JobSpec.model_validate(fields), key))


def stop(name: str = "j1", at: float = 2.0, key: Any = OPERATOR) -> bytes:
    control = ControlMessage.model_validate({"job": name, "action": "stop", "issued_at": at})
    return signing.envelope_bytes(signing.sign(control, key))


def spec_arrived(name: str, raw: bytes) -> e.SpecArrived:
    """As the driver hands a job over: with the verdict on its signature."""
    return e.SpecArrived(name, raw, signing.verify_bytes(raw, RING) if raw else None)


def control_arrived(name: str, raw: bytes) -> e.ControlArrived:
    return e.ControlArrived(name, raw, signing.verify_bytes(raw, RING) if raw else None)


def ready(core: DeviceCore | None = None) -> DeviceCore:
    """A core that booted idle and settled."""
    core = core or DeviceCore(CAPS, T0)
    core.handle(e.Booted(None), T0)
    core.handle(e.Tick(), T0 + SETTLE_S)
    return core


def states(actions: list[a.DeviceAction]) -> list[ExecState]:
    return [x.status.state for x in actions if isinstance(x, a.PublishExec)]


def of(kind: type, actions: list[a.DeviceAction]) -> list[Any]:
    return [x for x in actions if isinstance(x, kind)]


def train(core: DeviceCore, name: str = "j1", at: float = 1.0, **over: Any) -> list[a.DeviceAction]:
    out = core.handle(spec_arrived(name, job(name, at, **over)), T0 + 2)
    return out + core.handle(e.Prepared(name), T0 + 2)


def test_a_job_runs_from_queued_to_succeeded_and_the_coordinator_publishes_the_result() -> None:
    core = ready()
    out = core.handle(spec_arrived("j1", job()), T0 + 2)
    assert states(out) == [ExecState.QUEUED, ExecState.ACCEPTED]
    assert of(a.PrepareJob, out)[0].node == 0
    assert of(a.Persist, out)[0].envelope == job()
    out = core.handle(e.Prepared("j1"), T0 + 3)
    assert states(out) == [ExecState.TRAINING] and of(a.StartTraining, out)[0].node == 0
    assert core.summary().state is DeviceState.TRAINING
    core.handle(e.ExecArrived("j1", "dev-b", canonical_json(ExecStatus(
        job="j1", device="dev-b", node=1, state=ExecState.TRAINING, updated_at=1, seq=3)).encode()), T0 + 3)
    out = core.handle(e.TrainingEnded("j1", e.Outcome.COMPLETED, 20, coordinator=True), T0 + 9)
    assert states(out) == [ExecState.SUCCEEDED]
    assert of(a.PublishResult, out)[0].states == {"dev-a": ExecState.SUCCEEDED, "dev-b": ExecState.TRAINING}
    assert of(a.Persist, out)[0].envelope is None and core.summary().state is DeviceState.IDLE
    assert [x.status.seq for x in of(a.PublishExec, out)] == [4]


def test_a_non_coordinator_does_not_publish_the_result() -> None:
    core = ready()
    train(core)
    out = core.handle(e.TrainingEnded("j1", e.Outcome.COMPLETED, 20, coordinator=False), T0 + 9)
    assert states(out) == [ExecState.SUCCEEDED] and not of(a.PublishResult, out)


def test_specs_wait_for_the_retained_messages_to_settle_then_run_in_submitted_order() -> None:
    core = DeviceCore(CAPS, T0)
    core.handle(e.Booted(None), T0)
    assert core.handle(spec_arrived("late", job("late", at=9.0)), T0 + 0.1) == []
    assert core.handle(spec_arrived("early", job("early", at=3.0)), T0 + 0.2) == []
    assert core.handle(e.Tick(), T0 + SETTLE_S / 2) == []
    out = core.handle(e.Tick(), T0 + SETTLE_S)
    assert [(x.status.job, x.status.state) for x in of(a.PublishExec, out)] == [
        ("early", ExecState.QUEUED), ("early", ExecState.ACCEPTED), ("late", ExecState.QUEUED)]
    assert core.summary().queued == ["late"]


def test_a_job_submitted_while_busy_stays_queued_and_runs_next() -> None:
    core = ready()
    train(core)
    out = core.handle(spec_arrived("j2", job("j2", at=5.0)), T0 + 3)
    assert states(out) == [ExecState.QUEUED] and not of(a.PrepareJob, out)
    out = core.handle(e.TrainingEnded("j1", e.Outcome.COMPLETED, 3), T0 + 4)
    assert [(x.status.job, x.status.state) for x in of(a.PublishExec, out)] == [
        ("j1", ExecState.SUCCEEDED), ("j2", ExecState.ACCEPTED)]
    assert of(a.PrepareJob, out)[0].spec.name == "j2"


def test_a_job_signed_with_another_key_is_rejected_counted_once_and_the_next_one_runs() -> None:
    core = ready()
    forged = job(key=STRANGER)
    out = core.handle(spec_arrived("j1", forged), T0 + 2)
    assert of(a.PublishExec, out)[0].status.reason is RejectReason.UNKNOWN_KEY
    assert core.handle(spec_arrived("j1", forged), T0 + 3) == []  # retained again: counted once
    assert core.summary().refused == {"unknown_key": 1}
    assert states(core.handle(spec_arrived("j2", job("j2")), T0 + 4)) == [ExecState.QUEUED, ExecState.ACCEPTED]


def test_a_tampered_job_is_a_bad_signature() -> None:
    envelope = signing.Envelope.model_validate_json(job())
    tampered = envelope.model_copy(update={"payload": envelope.payload.replace('"batch":100', '"batch":7')})
    out = ready().handle(spec_arrived("j1", signing.envelope_bytes(tampered)), T0 + 2)
    assert of(a.PublishExec, out)[0].status.reason is RejectReason.BAD_SIGNATURE


def test_a_job_under_another_topic_name_is_invalid() -> None:
    out = ready().handle(spec_arrived("other", job("j1")), T0 + 2)
    assert of(a.PublishExec, out)[0].status.reason is RejectReason.INVALID_DOCUMENT


def test_missing_data_source_or_backend_is_rejected_with_the_reason() -> None:
    core = ready()
    out = core.handle(spec_arrived("j1", job(data="cameras")), T0 + 2)
    assert of(a.PublishExec, out)[0].status.reason is RejectReason.NO_DATA_SOURCE
    out = core.handle(spec_arrived("j2", job("j2", backend="litert")), T0 + 2)
    assert of(a.PublishExec, out)[0].status.reason is RejectReason.BACKEND_MISSING
    assert core.summary().refused == {"backend_missing": 1, "no_data_source": 1}


def test_a_device_the_selector_picks_but_submit_left_out_says_it_lacks_the_data() -> None:
    core = ready()
    unassigned = job(data="digits", assignments={"dev-b": 0}, selector={"labels": {"site": "barn"}})
    assert of(a.PublishExec, core.handle(spec_arrived("j1", unassigned), T0 + 2))[0].status.reason \
        is RejectReason.NO_DATA_SOURCE
    elsewhere = job("j2", data="digits", assignments={"dev-b": 0}, selector={"labels": {"site": "hall"}})
    assert core.handle(spec_arrived("j2", elsewhere), T0 + 2) == []


def test_a_model_that_fails_its_check_here_is_rejected_and_the_device_stays_ready() -> None:
    core = ready()
    core.handle(spec_arrived("j1", job()), T0 + 2)
    out = core.handle(e.Prepared("j1", RejectReason.MODEL_CHECK_FAILED, "labels 0..11, model has 10"), T0 + 2)
    assert states(out) == [ExecState.REJECTED] and core.summary().refused == {"model_check_failed": 1}
    assert core.summary().state is DeviceState.IDLE


def test_blob_chunks_are_assembled_hash_checked_and_stored() -> None:
    data = bytes(range(256)) * 10
    sha = hashlib.sha256(data).hexdigest()
    blob = {"sha256": sha, "size": len(data), "chunk_size": 1024,
            "chunks": 3, "filename": "m.tflite"}
    core = ready()
    out = core.handle(spec_arrived("j1", job(model=blob, backend="numpy")), T0 + 2)
    assert states(out)[-1] is ExecState.DOWNLOADING and of(a.FetchBlob, out)
    for i in (2, 0):
        assert core.handle(e.ChunkArrived(sha, i, data[i * 1024:(i + 1) * 1024]), T0 + 3) == []
    out = core.handle(e.ChunkArrived(sha, 1, data[1024:2048]), T0 + 3)
    assert of(a.StoreBlob, out)[0].data == data and of(a.PrepareJob, out)


def test_a_blob_whose_hash_is_wrong_is_rejected_and_the_next_job_runs() -> None:
    blob = {"sha256": "ab" * 32, "size": 1500, "chunk_size": 1024, "chunks": 2, "filename": "m.tflite"}
    core = ready()
    core.handle(spec_arrived("j1", job(model=blob)), T0 + 2)
    core.handle(spec_arrived("j2", job("j2", at=2.0)), T0 + 2)
    core.handle(e.ChunkArrived("ab" * 32, 0, b"x" * 1024), T0 + 3)
    out = core.handle(e.ChunkArrived("ab" * 32, 1, b"y" * 476), T0 + 3)
    assert of(a.PublishExec, out)[0].status.reason is RejectReason.BLOB_HASH_MISMATCH
    assert of(a.DropBlob, out) and of(a.PrepareJob, out)[0].spec.name == "j2"
    assert core.summary().refused == {"blob_hash_mismatch": 1}


def test_a_model_file_on_disk_needs_no_download() -> None:
    blob = {"sha256": "ab" * 32, "size": 1500, "chunk_size": 1024, "chunks": 2, "filename": "m.tflite"}
    core = ready()
    core.handle(spec_arrived("j1", job(model=blob)), T0 + 2)
    out = core.handle(e.BlobOnDisk("ab" * 32), T0 + 2)
    assert of(a.PrepareJob, out) and not of(a.StoreBlob, out)


def test_a_signed_stop_cancels_training_and_the_result_still_comes() -> None:
    core = ready()
    train(core)
    out = core.handle(control_arrived("j1", stop()), T0 + 3)
    assert of(a.StopTraining, out) == [a.StopTraining("j1", ExecState.CANCELED)]
    out = core.handle(e.TrainingEnded("j1", e.Outcome.STOPPED, 7, coordinator=True), T0 + 4)
    assert states(out) == [ExecState.CANCELED] and of(a.PublishResult, out)


def test_a_stop_signed_by_a_stranger_is_refused_and_counted() -> None:
    core = ready()
    train(core)
    out = core.handle(control_arrived("j1", stop(key=STRANGER)), T0 + 3)
    assert not of(a.StopTraining, out) and core.summary().refused == {"unknown_key": 1}


def test_a_stop_before_the_job_cancels_it_and_an_older_stop_does_not() -> None:
    core = ready()
    core.handle(control_arrived("j1", stop(at=5.0)), T0 + 2)
    assert states(core.handle(spec_arrived("j1", job(at=4.0)), T0 + 2)) == [ExecState.CANCELED]
    # The same name submitted again after that stop runs.
    assert states(core.handle(spec_arrived("j1", job(at=6.0)), T0 + 3))[:2] == [ExecState.QUEUED,
                                                                                ExecState.ACCEPTED]


def test_a_stop_of_a_queued_job_cancels_it_there() -> None:
    core = ready()
    train(core)
    core.handle(spec_arrived("j2", job("j2", at=2.0)), T0 + 2)
    out = core.handle(control_arrived("j2", stop("j2", at=3.0)), T0 + 3)
    assert states(out) == [ExecState.CANCELED] and core.summary().queued == []


def test_the_target_accuracy_stops_training_as_succeeded() -> None:
    core = ready()
    train(core, stop={"rounds": 100, "target_accuracy": 0.9})
    assert not of(a.StopTraining, core.handle(e.RoundReported("j1", 9, 0.5, 0.85), T0 + 3))
    out = core.handle(e.RoundReported("j1", 19, 0.3, 0.91), T0 + 4)
    assert of(a.StopTraining, out) == [a.StopTraining("j1", ExecState.SUCCEEDED)]
    assert states(core.handle(e.TrainingEnded("j1", e.Outcome.STOPPED, 20), T0 + 5)) == [ExecState.SUCCEEDED]


def test_training_states_are_published_at_most_once_a_second() -> None:
    core = ready()
    train(core)
    assert states(core.handle(e.RoundReported("j1", 0, 1.0, None), T0 + 2.5)) == []
    out = core.handle(e.RoundReported("j1", 1, 0.9, None), T0 + 3.1)
    assert [(x.status.state, x.status.round) for x in of(a.PublishExec, out)] == [(ExecState.TRAINING, 1)]


def test_the_deadline_times_out_training_and_waiting_jobs() -> None:
    core = ready()
    train(core, stop={"deadline": T0 + 10})
    core.handle(spec_arrived("j2", job("j2", at=2.0, stop={"deadline": T0 + 5})), T0 + 2)
    out = core.handle(e.Tick(), T0 + 6)
    assert [(x.status.job, x.status.state) for x in of(a.PublishExec, out)] == [("j2", ExecState.TIMED_OUT)]
    out = core.handle(e.Tick(), T0 + 10)
    assert of(a.StopTraining, out) == [a.StopTraining("j1", ExecState.TIMED_OUT)]
    assert states(core.handle(e.TrainingEnded("j1", e.Outcome.STOPPED, 4), T0 + 11)) == [ExecState.TIMED_OUT]


def test_a_job_past_its_deadline_is_timed_out_on_arrival() -> None:
    assert states(ready().handle(spec_arrived("j1", job(stop={"deadline": T0})), T0 + 2)) == [
        ExecState.TIMED_OUT]


def test_a_failed_run_reports_the_log_line() -> None:
    core = ready()
    train(core)
    out = core.handle(e.TrainingEnded("j1", e.Outcome.FAILED, 3, "the broker refused"), T0 + 4)
    assert states(out) == [ExecState.FAILED] and of(a.PublishExec, out)[0].status.detail == "the broker refused"
    assert of(a.LogLine, out)[0].level is a.Level.ERROR


def test_a_stored_job_no_longer_signed_by_a_trusted_key_is_not_resumed() -> None:
    core = DeviceCore(CAPS, T0)
    stale = job(key=STRANGER)
    out = core.handle(e.Booted(stale, signing.verify_bytes(stale, RING), seq=3), T0)
    assert of(a.LogLine, out) and core.handle(e.Tick(), T0 + SETTLE_S) == [a.PublishRecord()]


def test_a_restarted_device_resumes_its_job_as_the_same_node_with_growing_seq() -> None:
    core = DeviceCore(CAPS, T0)
    core.handle(e.Booted(job(), signing.verify_bytes(job(), RING), seq=7, finished=(("old", 0.5),)), T0)
    core.handle(spec_arrived("old", job("old", at=0.5)), T0 + 0.1)  # ended before the reboot
    core.handle(spec_arrived("j1", job()), T0 + 0.1)  # its retained copy: the same job
    out = core.handle(e.Tick(), T0 + SETTLE_S)
    assert [(x.status.job, x.status.state, x.status.seq) for x in of(a.PublishExec, out)] == [
        ("j1", ExecState.QUEUED, 8), ("j1", ExecState.ACCEPTED, 9)]
    assert of(a.PrepareJob, out)[0].node == 0


def test_a_job_whose_retained_state_says_it_ended_here_is_not_run_again() -> None:
    core = DeviceCore(CAPS, T0)
    core.handle(e.Booted(None), T0)
    ended = ExecStatus(job="j1", device="dev-a", node=0, state=ExecState.SUCCEEDED, updated_at=5.0, seq=9)
    core.handle(e.ExecArrived("j1", "dev-a", canonical_json(ended).encode()), T0)
    core.handle(spec_arrived("j1", job(at=1.0)), T0)
    assert core.handle(e.Tick(), T0 + SETTLE_S) == [a.PublishRecord()]


def test_a_withdrawn_job_leaves_the_queue() -> None:
    core = ready()
    train(core)
    core.handle(spec_arrived("j2", job("j2", at=2.0)), T0 + 2)
    out = core.handle(spec_arrived("j2", b""), T0 + 3)
    assert states(out) == [ExecState.CANCELED] and core.summary().queued == []


def test_garbage_never_raises() -> None:
    core = ready()
    garbage: list[e.DeviceEvent] = [spec_arrived("j1", b"\xff"), control_arrived("j1", b"{}"), e.ExecArrived("j1", "dev-b", b"[]"),
                  e.ChunkArrived("ab" * 32, 5, b""), e.Prepared("nope"), e.RoundReported("nope", 1, 0.1, None),
                  e.TrainingEnded("nope", e.Outcome.COMPLETED, 1)]
    for event in garbage:
        core.handle(event, T0 + 2)
    assert core.summary().refused == {"invalid_document": 2}
