from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from agent.config import AgentConfig
from agent.jobs import document as d
from agent.jobs.states import ExecState, RejectReason

SHA = "cd" * 32


def spec(**over: object) -> d.JobSpec:
    fields: dict[str, object] = {"name": "j", "data": "mnist", "assignments": {"a": 0, "b": 1},
                                 "submitted_at": 100.0}
    fields.update(over)
    return d.JobSpec.model_validate(fields)


def test_a_job_round_trips_through_canonical_json() -> None:
    job = spec(model={"sha256": SHA, "size": 600_000, "chunks": 3, "filename": "m.tflite"},
               backend="litert", stop={"rounds": 5, "target_accuracy": 0.9},
               selector={"labels": {"site": "barn"}}, agent_options={"eval_every": 2})
    text = d.canonical_json(job)
    assert " " not in text and text == json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
    assert d.JobSpec.model_validate_json(text) == job
    assert d.canonical_json(d.JobSpec.model_validate_json(text)) == text


def test_canonical_json_does_not_depend_on_field_order() -> None:
    a = d.ControlMessage.model_validate({"job": "j", "action": "stop", "issued_at": 1.0})
    b = d.ControlMessage.model_validate({"issued_at": 1.0, "action": "stop", "job": "j"})
    assert d.canonical_json(a) == d.canonical_json(b) == '{"action":"stop","issued_at":1.0,"job":"j"}'


@pytest.mark.parametrize("over", [
    {"name": "devices"}, {"assignments": {"a": 0, "b": 2}}, {"assignments": {}},
    {"assignments": {"A": 0}}, {"agent_options": {"broker": "mqtt://evil"}},
    {"agent_options": {"id": 3}}, {"model": "/etc/passwd.py:factory"}, {"model": "m.tflite"},
    {"partition": "shards:x"}, {"min_devices": 3}, {"data": "a/b"}, {"surprise": 1}, {"sync_every": 0},
    {"model": {"sha256": SHA, "size": 600_000, "chunks": 2, "filename": "m.tflite"}},
    {"model": {"sha256": SHA, "size": 10, "chunks": 1, "filename": "../m.tflite"}},
    {"selector": {"devices": ["a"], "labels": {"k": "v"}}},
])
def test_invalid_jobs_are_refused(over: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        spec(**over)


def test_selector_matches_all_list_or_labels() -> None:
    assert d.Selector().matches("x", {})
    assert d.Selector(devices=["a"]).matches("a", {}) and not d.Selector(devices=["a"]).matches("b", {})
    barn = d.Selector(labels={"site": "barn"})
    assert barn.matches("x", {"site": "barn", "k": "v"}) and not barn.matches("x", {"site": "hall"})


def test_training_options_make_a_valid_agent_config() -> None:
    job = spec(partition="none", sync_every=4, outer_optimizer="nesterov", stop={"rounds": 7},
               agent_options={"eval_samples": 500, "round_deadline": 3.0})
    config = AgentConfig(**d.training_options(job), id=1)  # type: ignore[arg-type]
    assert (config.job, config.fleet_size, config.rounds, config.partition) == ("j", 2, 7, "iid")
    assert (config.sync_every, config.outer_optimizer, config.eval_samples) == (4, "nesterov", 500)


def test_every_whitelisted_option_is_an_agent_config_field() -> None:
    assert set(AgentConfig.model_fields) >= d.AGENT_OPTIONS


def test_exec_status_and_record_round_trip() -> None:
    status = d.ExecStatus(job="j", device="a", node=0, state=ExecState.REJECTED,
                          reason=RejectReason.UNKNOWN_KEY, updated_at=1.0, seq=2)
    assert d.ExecStatus.model_validate_json(d.canonical_json(status)) == status
    record = d.DeviceRecord(id="a", data={"m": d.DataSourceInfo(format="npz", samples=3, labels=[1, 2])},
                            refused={"unknown_key": 1})
    assert d.DeviceRecord.model_validate_json(d.canonical_json(record)) == record


def test_result_manifest_checks_its_sizes() -> None:
    fields = {"job": "j", "device": "a", "node": 0, "round": 3, "model": "mlp", "model_hash": "h",
              "fingerprint": "f", "params_sha256": SHA, "values": 1000, "chunk_size": 1024,
              "chunks": 4, "layout": [{"name": "w", "shape": [10, 100]}], "published_at": 1.0}
    assert d.ResultManifest.model_validate(fields).chunks == 4
    with pytest.raises(ValidationError):
        d.ResultManifest.model_validate({**fields, "chunks": 3})
    with pytest.raises(ValidationError):
        d.ResultManifest.model_validate({**fields, "layout": [{"name": "w", "shape": [10, 10]}]})
