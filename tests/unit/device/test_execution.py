"""A device refuses a job whose data source is too large for it, with a reason, and stays up."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from agent.config import AgentConfig
from agent.device import execution
from agent.device.datasummary import summarize
from agent.jobs.states import RejectReason


def _big_csv(path: Path) -> Path:
    row = ",".join(["7"] + ["128"] * 784)
    path.write_text("label," + ",".join(f"p{i}" for i in range(784)) + "\n" + "\n".join([row] * 400) + "\n")
    return path


def test_data_over_the_devices_budget_is_rejected_as_not_enough_memory(tmp_path: Path) -> None:
    config = AgentConfig.model_validate({"id": 0, "data": _big_csv(tmp_path / "d.csv"), "data_max_mb": 0.5})
    with pytest.raises(execution.Unfit) as unfit:
        execution.prepare(config, SimpleNamespace(partition="iid"))  # type: ignore[arg-type]
    assert unfit.value.reason == RejectReason.NOT_ENOUGH_MEMORY
    assert "data_max_mb" in str(unfit.value)


def test_the_same_data_within_the_budget_is_prepared(tmp_path: Path) -> None:
    config = AgentConfig.model_validate({"id": 0, "data": _big_csv(tmp_path / "d.csv"), "data_max_mb": 64})
    training = execution.prepare(config, SimpleNamespace(partition="iid"))  # type: ignore[arg-type]
    assert training.identity.params == 407_050


def test_a_source_too_large_is_summarized_with_its_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.model import data_budget

    monkeypatch.setattr(data_budget, "available_memory", lambda meminfo="": 100_000)
    path = _big_csv(tmp_path / "d.csv")
    summary = summarize({"format": "csv", "path": str(path)})
    assert summary["samples"] == 0 and "more than the memory available" in summary["error"]
