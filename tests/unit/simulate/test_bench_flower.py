"""bench flower without Flower running: arguments, the order of the arms, the Edgegrove fault
scenarios, the figures read from a ServerApp's round log, memory sampling, the report."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from simulate.bench import flower
from simulate.bench.flower_arms import (
    ArmPlan,
    Fault,
    FlowerWatch,
    PeakRss,
    edgegrove_scenario,
    flower_figures,
)
from simulate.bench.flower_deploy import FlowerMissing, _toml, find_flower_bin
from simulate.evaluation import build
from simulate.scenario import BandwidthFault, CrashFault, parse_scenario

MB = 1e6


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    flower.add_arguments(parser)
    return parser.parse_args(list(argv))


def _plan(**changes: Any) -> ArmPlan:
    plan = flower.plan_for(_args("--nodes", "3"), "iid")
    return ArmPlan(**{**plan.__dict__, **changes})


def test_dirichlet_and_bad_values_are_refused_with_one_line() -> None:
    assert "Dirichlet" in (flower.usage_problem(_args("--partitions", "iid", "dirichlet")) or "")
    assert "--target" in (flower.usage_problem(_args("--target", "1.5")) or "")
    assert flower.usage_problem(_args("--fault-rounds", "3")) is not None
    assert flower.usage_problem(_args()) is None


def test_the_command_exits_2_with_one_line_before_anything_starts() -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(flower.__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-m", "edgegrove.cli", "bench", "flower", "--partitions",
                           "dirichlet"], capture_output=True, text=True, timeout=60, env=env, check=False)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "Dirichlet" in done.stderr


def test_arms_run_every_partition_clean_then_every_fault_on_the_first_partition() -> None:
    got = flower.arms(_args("--partitions", "iid", "label", "--faults", "link-6mbps", "client-restart"))
    assert got == [("iid", Fault.NONE), ("label", Fault.NONE), ("iid", Fault.LINK_6MBPS),
                   ("iid", Fault.CLIENT_RESTART)]
    assert flower.arms(_args("--faults")) == [("iid", Fault.NONE)]


@pytest.mark.parametrize("fault", list(Fault))
def test_every_edgegrove_scenario_is_one_the_simulator_accepts(fault: Fault) -> None:
    plan = _plan(partition="label")
    spec = edgegrove_scenario(plan, fault)
    parsed = parse_scenario(spec.toml(), spec.name)
    assert parsed.fleet.nodes == 3 and parsed.agent["non_iid"] is True
    if fault is Fault.NONE:
        assert parsed.faults == [] and parsed.fleet.rounds == plan.edgegrove_rounds
        return
    (struck,) = parsed.faults
    assert parsed.fleet.rounds == plan.edgegrove_fault_rounds
    if fault is Fault.LINK_6MBPS:
        assert isinstance(struck, BandwidthFault) and struck.bytes_per_second == 6e6
        assert struck.node == 2 and struck.via == "proxy"
    else:
        assert isinstance(struck, CrashFault)
        assert struck.node == (2 if fault is Fault.CLIENT_RESTART else 0)  # agent 0 coordinates
        assert struck.at_round == 20 and struck.restart_round == 20 + plan.restart_after_rounds


def _round(rnd: int, t: float, acc: float, replied: int = 3) -> dict[str, Any]:
    return {"event": "round", "round": rnd, "t_start": t, "t_sent": t + 0.5, "t_end": t + 10.0,
            "asked": 3, "replied": replied, "accuracy": acc, "train_s": [1.0] * replied,
            "load_s": [0.5] * replied, "partitions": list(range(replied))}


def test_flower_figures_time_bytes_and_missing_updates_from_the_round_log(tmp_path: Path) -> None:
    watch = FlowerWatch(tmp_path / "rounds.jsonl")
    # the fault strikes in round 3: a client's update is lost; all are back in round 4
    watch.records = [_round(1, 100.0, 0.90), _round(2, 111.0, 0.95),
                     _round(3, 122.0, 0.975, replied=2), _round(4, 133.0, 0.98)]
    # bytes through the proxies sampled over time: 10 MB per second of run
    watch.bytes_at = [(100.0 + 0.25 * i, int(2.5 * MB * i)) for i in range(200)]
    got = flower_figures(_plan(), Fault.CLIENT_RESTART, watch)
    assert got["time_to_target"] == {"round": 3, "seconds": 31.5}  # from round 1's messages out
    assert got["bytes_to_target_mb"] == pytest.approx(320.0, abs=3)  # 100 s -> 132 s
    assert got["rounds_missing_updates"] == [3]
    assert got["all_back_at_round"] == 4
    assert got["round_s"]["median"] == pytest.approx(9.5)
    assert got["round_s_outside_client_work"]["median"] == pytest.approx(8.0)


def test_the_watch_reads_only_whole_lines_as_the_log_grows(tmp_path: Path) -> None:
    path = tmp_path / "rounds.jsonl"
    watch = FlowerWatch(path)

    class Proxies:
        def proxy_bytes(self) -> int:
            return 7

    path.write_text(json.dumps({"event": "round-start", "round": 1}) + "\n" + '{"event": "ro')
    watch.poll(Proxies())  # type: ignore[arg-type]
    assert watch.started(1) and not watch.started(2) and watch.rounds() == []
    with path.open("a") as f:
        f.write('und", "round": 1}\n{"event": "end"}\n')
    watch.poll(Proxies())  # type: ignore[arg-type]
    assert len(watch.rounds()) == 1 and watch.ended() and watch.bytes_at[-1][1] == 7


def test_peak_rss_sums_a_process_tree_and_keeps_the_peak() -> None:
    me = psutil.Process()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        rss = PeakRss(lambda: {0: [me], 1: [me, psutil.Process(child.pid)]})
        rss.sample()
        alone, tree = rss.peak_mb[0], rss.peak_mb[1]
        assert tree > alone > 5
        figures = rss.figures()
        assert figures["max_mb"] == round(tree, 1) and set(figures["per_client_mb"]) == {"0", "1"}
    finally:
        child.kill()
        child.wait()


def test_a_missing_flower_says_how_to_install_it(tmp_path: Path) -> None:
    with pytest.raises(FlowerMissing, match=r"scripts/setup.sh --dev"):
        find_flower_bin(tmp_path)


def test_run_config_values_are_flwr_run_config_literals() -> None:
    assert [_toml(True), _toml(3), _toml(0.5), _toml("/tmp/a b")] == ["true", "3", "0.5", "'/tmp/a b'"]


def _doc() -> dict[str, Any]:
    args = _args("--nodes", "3")
    flower_entry = {"rounds": 4, "round_s": {"median": 9.5, "min": 9, "max": 30.0},
                    "time_to_target": {"round": 3, "seconds": 31.5}, "bytes_to_target_mb": 320.0,
                    "memory": {"per_client_mb": {"0": 450.0}, "median_mb": 450.0, "max_mb": 450.0},
                    "final_accuracy": 0.98, "finished": True, "rounds_missing_updates": [],
                    "curve": [{"round": 1, "accuracy": 0.9, "seconds": 9.5}]}
    edgegrove_entry = {**flower_entry, "round_s": {"median": 0.1, "min": 0.1, "max": 0.4},
                       "memory": {"per_client_mb": {"0": 115.0}, "median_mb": 115.0, "max_mb": 115.0}}
    faulty = {**flower_entry, "finished": False, "stalled_after_round": 3, "fault_at_round": 3,
              "gave_up": "nothing new for 180 s after the fault",
              "rounds_missing_updates": [3]}
    return {"benchmark": "flower", "machine": {"cpu_model": "Test CPU", "cpu_count": 2},
            "flwr": "1.42.0", "nodes": 3, "target": 0.97, "batch": 100,
            "plan": flower.plan_for(args, "iid").__dict__, "tuning": flower.TUNING,
            "method": flower.METHOD,
            "results": [{"partition": "iid", "fault": "none", "flower": flower_entry,
                         "edgegrove": edgegrove_entry},
                        {"partition": "iid", "fault": "server-restart", "flower": faulty,
                         "edgegrove": {**edgegrove_entry, "all_back_at_round": 31}}]}


def test_the_table_says_what_happened_under_each_fault() -> None:
    rows = flower.table_rows(_doc())
    assert [r[1] for r in rows] == ["flower", "edgegrove"] * 2
    assert rows[0][-1] == "ok" and rows[1][3] == 0.1
    assert "did not end (last round 3: nothing new for 180 s after the fault)" in rows[2][-1]
    assert "all back at round 31" in rows[3][-1]


def test_the_evaluation_section_is_generated_from_flower_json(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    (results / "flower.json").write_text(json.dumps(_doc()))
    text, statuses, _ = build(results, tmp_path / "EVALUATION.md", tmp_path / "img")
    assert statuses["flower"] == "measured"
    section = text.split("## Side by side with Flower")[1].split("\n## ")[0]
    assert "Test CPU" in section and "FLWR_SUPEREXEC_TASK_POLL_INTERVAL" in section
    assert "**did not end** (no round after 3; nothing new for 180 s after the fault)" in section
    assert "| iid / none | flower |" in section
    assert "subprocess (default) \\| process" in section  # a '|' in a cell is escaped
