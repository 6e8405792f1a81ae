"""simulate.device_setup: device names in node order, data sources, the job file and device
configs `simulate --via-devices` writes (read back by the job file's and TOML's own readers)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from agent.jobs.document import AGENT_OPTIONS
from agent.operator.jobfile import read_job_file
from simulate.device_setup import (
    DataSource,
    DeviceConfig,
    check_model_for_job,
    data_source,
    device_names,
    job_document,
    split_options,
    toml_document,
    write_device_config,
)
from simulate.model_choice import ModelChoice
from simulate.scenario import ScenarioError


def test_device_names_sort_in_node_order() -> None:
    names = device_names(12)
    assert names[0] == "node-00" and names[11] == "node-11"
    assert sorted(names) == names
    assert device_names(1) == ["node-0"]


def test_a_packaged_dataset_is_a_source_of_its_name(tmp_path: Path) -> None:
    assert data_source("mnist") == DataSource("mnist", "mnist")
    csv = tmp_path / "t.csv"
    csv.write_text("a,label\n1,0\n")
    assert data_source(str(csv), "label") == DataSource("data", "csv", str(csv), "label")
    assert data_source(str(tmp_path)).format == "images"
    assert data_source(str(tmp_path / "x.npz")).format == "npz"


def test_options_split_into_job_fields_and_agent_options() -> None:
    split = split_options({"lr": 0.01, "eval_samples": 1000, "timeout_mode": "fixed", "model": "mlp"},
                          AGENT_OPTIONS)
    assert split.fields == {"lr": 0.01}
    assert split.agent_options == {"eval_samples": 1000, "timeout_mode": "fixed"}


def test_an_option_a_job_cannot_carry_is_one_line() -> None:
    with pytest.raises(ScenarioError, match="a job cannot set client_id"):
        split_options({"client_id": "x"}, AGENT_OPTIONS)


def test_a_mixed_fleet_stays_on_the_agent_path() -> None:
    with pytest.raises(ScenarioError, match="one backend"):
        check_model_for_job(ModelChoice(backend="mixed"))


def test_the_job_document_reads_back_as_a_job_file(tmp_path: Path) -> None:
    options = split_options({"lr": 0.002, "eval_samples": 1000, "join_grace": 60}, AGENT_OPTIONS)
    document = job_document("sim-1", ModelChoice(partition="dirichlet:0.5"), options, 12, 3,
                            data_source("mnist"))
    path = tmp_path / "job.toml"
    path.write_text(toml_document(document))
    job = read_job_file(path)
    assert (job.name, job.model, job.data, job.partition, job.lr) == ("sim-1", "mlp", "mnist", "dirichlet:0.5", 0.002)
    assert job.stop.rounds == 12
    assert job.devices.ids == ["node-0", "node-1", "node-2"]
    assert dict(job.options) == {"eval_samples": 1000, "join_grace": 60}


def test_a_device_config_is_toml_with_its_secrets_private(tmp_path: Path) -> None:
    config = DeviceConfig("node-3", "mqtt://127.0.0.1:1883", tmp_path / "state", "S0ME+KEY=",
                          (DataSource("data", "csv", "/d/t.csv", "y"),), {"site": "barn"},
                          "device-node-3", 'pa"ss', None)
    path = write_device_config(tmp_path / "d" / "device.toml", config)
    table = tomllib.loads(path.read_text())
    assert table["id"] == "node-3" and table["password"] == 'pa"ss'
    assert table["operator_keys"] == ["S0ME+KEY="]
    assert table["labels"] == {"site": "barn"}
    assert table["data"]["data"] == {"format": "csv", "path": "/d/t.csv", "label_column": "y"}
    assert "tls_ca" not in table
    assert path.stat().st_mode & 0o077 == 0
