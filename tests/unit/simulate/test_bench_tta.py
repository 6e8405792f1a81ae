"""Time and bytes to a target accuracy, from a run directory's event log."""

from __future__ import annotations

import json
from pathlib import Path

from simulate.bench import tta


def _write_run(run_dir: Path, accuracies: dict[int, float], local_steps: int) -> None:
    run_dir.mkdir()
    lines = []
    for rnd in range(6):
        for node in range(2):
            lines.append({"type": "telemetry", "t": 10.0 + 2 * rnd + 0.1 * node, "node": node, "round": rnd,
                          "epoch": 1, "loss": 1.0, "accuracy": accuracies.get(rnd), "bytes_sent": 1_000_000,
                          "phase_seconds": {"compute": 0.1, "allreduce": 0.5, "total": 0.6},
                          "local_steps": local_steps, "samples": 100 * local_steps, "model_hash": "ab"})
    (run_dir / "events.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")


def test_the_first_round_at_the_target_gives_the_seconds_bytes_and_samples(tmp_path: Path) -> None:
    _write_run(tmp_path / "h8", {1: 0.80, 3: 0.93, 5: 0.95}, 8)
    result = tta.time_to_accuracy(tmp_path / "h8", 0.92)
    assert result["round_reached"] == 3 and result["local_steps"] == 8
    assert result["seconds"] == 6.0  # round 3's last report minus round 0's
    assert result["megabytes_sent"] == 8.0 and result["samples"] == 4 * 2 * 800
    assert result["final_accuracy"] == 0.95


def test_a_run_that_never_reaches_the_target_says_so_and_the_json_is_written(tmp_path: Path) -> None:
    _write_run(tmp_path / "h1", {5: 0.5}, 1)
    out = tmp_path / "periodic.json"
    assert tta.main(["--target", "0.9", "--out", str(out), str(tmp_path / "h1")]) == 0
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "periodic" and doc["results"][0]["round_reached"] is None
    assert doc["results"][0]["seconds"] is None


def test_the_accuracy_after_a_number_of_samples_is_interpolated_between_evaluations(tmp_path: Path) -> None:
    _write_run(tmp_path / "h8", {1: 0.80, 3: 0.90, 5: 0.95}, 8)  # 1,600 samples a round
    assert tta.time_to_accuracy(tmp_path / "h8", 0.92)["samples_trained"] == 6 * 1600
    assert tta.accuracy_at_samples(tmp_path / "h8", 3200) == {"accuracy": 0.80, "before": (3200, 0.80),
                                                               "after": (3200, 0.80)}
    halfway = tta.accuracy_at_samples(tmp_path / "h8", 4800)  # between round 1 (3,200) and 3 (6,400)
    assert halfway["accuracy"] == 0.85 and halfway["before"] == (3200, 0.80) and halfway["after"] == (6400, 0.90)
    assert tta.accuracy_at_samples(tmp_path / "h8", 9601)["accuracy"] is None  # past the last evaluation
    assert tta.accuracy_at_samples(tmp_path / "h8", 100)["accuracy"] is None  # before the first
