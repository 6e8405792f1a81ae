"""`edgegrove bench tta`: the runs it plans, their scenarios, and the table, JSON and plot from
run directories (real fleets are the integration tests' and the bench's own business)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from simulate.bench import tta_runs
from simulate.scenario import load_scenario
from tests.unit.simulate.test_bench_tta import _write_run


def _args(*argv: str) -> object:
    from agent.cli import OneLineParser

    parser = OneLineParser(prog="edgegrove bench tta")
    tta_runs.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_every_link_rate_runs_every_sync_period_with_its_rounds() -> None:
    args = _args("--links", "2", "6", "--sync-every", "1", "8", "auto", "--rounds", "250", "40", "40")
    assert tta_runs.plan(args) == [(2.0, "1", 250), (2.0, "8", 40), (2.0, "auto", 40),  # type: ignore[arg-type]
                                   (6.0, "1", 250), (6.0, "8", 40), (6.0, "auto", 40)]
    assert tta_runs.plan(_args("--links", "0", "--sync-every", "1", "auto", "--rounds", "30")) == [  # type: ignore[arg-type]
        (0.0, "1", 30), (0.0, "auto", 30)]


def test_agent_options_reach_every_runs_simulate_command(tmp_path: Path) -> None:
    command = tta_runs.simulate_command(tmp_path / "s.toml", tmp_path / "r", "auto", ["lr=0.003", "batch=100"])
    at = command.index("--agent-option")
    assert command[at:at + 4] == ["--agent-option", "lr=0.003", "--agent-option", "batch=100"]
    assert "--agent-option" not in tta_runs.simulate_command(tmp_path / "s.toml", tmp_path / "r", "1")


def test_the_scenario_limits_every_agents_link_in_the_kernel_or_none(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(tta_runs.scenario_text("s", 3, 20, 6.0, 2))
    scenario = load_scenario(str(path))
    assert (scenario.fleet.nodes, scenario.fleet.rounds, len(scenario.faults)) == (3, 20, 3)
    assert {f.kind for f in scenario.faults} == {"bandwidth"}
    path.write_text(tta_runs.scenario_text("s", 3, 20, 0.0, 2))
    assert load_scenario(str(path)).faults == []


@pytest.mark.parametrize(("argv", "said"), [
    (["--links", "fast"], "MB/s"), (["--links", "-2"], "link rate"), (["--sync-every", "0"], "1 or more"),
    (["--rounds", "2.5"], "rounds"), (["--sync-every", "1", "8", "--rounds", "10", "20", "30"], "--rounds"),
    (["--agent-option", "lr"], "KEY=VALUE"), (["--agent-option", "rounds=3"], "sets it itself"),
])
def test_bad_values_exit_2_with_one_line(argv: list[str], said: str, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "edgegrove.cli", "bench", "tta", *argv, "--runs-dir", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "r").exists()


def test_reused_runs_give_the_table_the_json_and_the_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    _write_run(runs / "6mbs-h1", {1: 0.5, 5: 0.95}, 1)
    _write_run(runs / "6mbs-h8", {1: 0.96, 3: 0.97}, 8)
    out, img = tmp_path / "tta.json", tmp_path / "img" / "tta.png"
    args = _args("--links", "6", "--sync-every", "1", "8", "--rounds", "6", "--target", "0.95", "--reuse",
                 "--runs-dir", str(runs), "--out", str(out), "--plot", str(img))
    assert tta_runs.run(args) == 0  # type: ignore[arg-type]
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "tta" and doc["target_accuracy"] == 0.95
    by = {r["sync_every"]: r for r in doc["results"]}
    assert by["1"]["round_reached"] == 5 and by["8"]["round_reached"] == 1 and by["8"]["local_steps"] == 8
    assert "--sync-every 8" in by["8"]["command"] and img.stat().st_size > 1000
    # After the 1,200 samples of every-step averaging's 6 rounds; h8 (1,600 a round) evaluated
    # only at 3,200 and later: none to interpolate from, so no figure rather than a guess.
    assert (by["1"]["matched_samples"], by["1"]["accuracy_at_matched"]) == (1200, 0.95)
    assert by["8"]["matched_samples"] == 1200 and by["8"]["accuracy_at_matched"] is None
    assert "sync every" in capsys.readouterr().out
