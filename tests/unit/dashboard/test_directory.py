"""Devices and jobs from the broker's retained topics: the Directory, and /api/devices, /api/jobs."""

from __future__ import annotations

from fastapi.testclient import TestClient

from agent.jobs import topics
from agent.jobs.document import canonical_json
from agent.jobs.states import ExecState
from dashboard.app import create_app
from dashboard.directory import Directory, JobState, take
from dashboard.settings import DashboardSettings
from tests.unit.dashboard.directory_messages import (
    DEVICES,
    RUNNING,
    T0,
    device_record,
    exec_status,
    fleet_messages,
)


def a_directory() -> Directory:
    directory = Directory()
    for topic, payload in fleet_messages():
        directory = take(directory, topic, payload, 5.0)
    return directory


def test_devices_and_jobs_from_their_retained_topics() -> None:
    d = a_directory()
    assert sorted(d.devices) == sorted(DEVICES)
    assert d.devices["hall-jetson"].record.arch == "x86_64" and d.devices["barn-pi-1"].record.job == RUNNING
    states = {name: job.state for name, job in d.jobs.items()}
    assert states == {"digits-a": JobState.SUCCEEDED, "digits-b": JobState.FAILED,
                      "digits-c": JobState.CANCELED, RUNNING: JobState.RUNNING}
    done = d.jobs["digits-a"]
    assert done.accuracy == 0.91 and done.round == 100  # the result's
    assert done.started_at == T0 and done.ended_at == T0 + 130
    assert sorted(done.curve) == list(range(0, 101, 10))
    live = d.jobs[RUNNING]
    assert live.ended_at is None and live.round == 120 and live.accuracy == 0.84
    assert live.execs["hall-jetson"].state is ExecState.REJECTED
    assert d.unreadable == {}


def test_a_cleared_topic_removes_and_a_bad_payload_is_counted() -> None:
    d = a_directory()
    d = take(d, topics.device_record("shop-pi-3"), b"", 6.0)
    assert "shop-pi-3" not in d.devices
    for topic in (topics.job_spec("digits-c"), *(topics.job_exec("digits-c", dev) for dev in DEVICES[:2])):
        d = take(d, topic, b"", 6.0)
    assert "digits-c" not in d.jobs  # every retained topic of it cleared
    d = take(d, topics.device_record("barn-pi-1"), b"{not json", 7.0)
    d = take(d, topics.job_spec("x1"), b'{"payload": "{}", "key_id": "k", "signature": "s"}', 7.0)
    # A record on another device's topic, an execution on another job's: refused.
    d = take(d, topics.device_record("barn-pi-2"), canonical_json(device_record("barn-pi-1")).encode(), 7.0)
    status = exec_status("digits-a", "barn-pi-1", 0, ExecState.FAILED, 1, None, T0, 200)
    d = take(d, topics.job_exec("digits-b", "barn-pi-1"), canonical_json(status).encode(), 7.0)
    assert d.unreadable == {"device_record": 2, "job_spec": 1, "job_exec": 1}
    assert d.devices["barn-pi-2"].record.id == "barn-pi-2" and "x1" not in d.jobs
    assert d.jobs["digits-b"].state is JobState.FAILED
    assert take(d, "edgegrove/demo/telemetry/1", b"{}", 8.0) is d


def test_the_api_lists_devices_and_jobs_running_first() -> None:
    app = create_app(DashboardSettings(job="rec"))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        store = client.app.state.dashboard.store  # type: ignore[attr-defined]
        for topic, payload in fleet_messages():
            assert store.ingest(topic, payload) == ()
        devices = client.get("/api/devices").json()
        assert [d["id"] for d in devices] == sorted(DEVICES)
        jetson = next(d for d in devices if d["id"] == "hall-jetson")
        assert (jetson["arch"], jetson["backends"], jetson["state"], jetson["job"]) == ("x86_64", ["numpy"], "idle", None)
        assert jetson["data"] == [{"name": "mnist", "format": "idx", "samples": 6000, "labels": [600] * 10, "error": ""}]
        jobs = client.get("/api/jobs").json()
        assert [(j["name"], j["state"]) for j in jobs] == [
            (RUNNING, "running"), ("digits-c", "canceled"), ("digits-b", "failed"), ("digits-a", "succeeded")]
        live = jobs[0]
        assert (live["rounds_planned"], live["submitted_by"], live["data"]) == (300, "operator-ana", "mnist")
        assert [(e["device"], e["state"]) for e in live["devices"]] == [
            ("barn-pi-1", "training"), ("barn-pi-2", "training"), ("hall-jetson", "rejected"), ("shop-pi-3", "training")]
        assert jobs[3]["result"] is True and jobs[3]["curve"][-1] == [100, 0.9]
        # The fleet's own state is untouched by the directory's topics.
        assert client.get("/api/fleet").json()["counters"]["malformed_total"] == 0


def test_metrics_name_each_devices_state_and_each_jobs_executions() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    app = create_app(DashboardSettings(job="rec"))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        store = client.app.state.dashboard.store  # type: ignore[attr-defined]
        for topic, payload in fleet_messages():
            store.ingest(topic, payload)
        text = client.get("/metrics").text
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("edgegrove_device_state", (("device", "hall-jetson"), ("state", "idle")))] == 1
    assert samples[("edgegrove_device_state", (("device", "barn-pi-1"), ("state", "training")))] == 1
    assert samples[("edgegrove_job_executions", (("fleet_job", RUNNING), ("state", "training")))] == 3
    assert samples[("edgegrove_job_executions", (("fleet_job", RUNNING), ("state", "rejected")))] == 1
    assert samples[("edgegrove_job_round", (("fleet_job", RUNNING),))] == 120
    assert samples[("edgegrove_job_accuracy", (("fleet_job", "digits-a"),))] == 0.91
    assert samples[("edgegrove_device_last_seen", (("device", "barn-pi-2"),))] == T0 + 4000
