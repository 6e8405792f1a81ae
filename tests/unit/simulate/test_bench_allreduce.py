"""bench allreduce without a fleet: scenario files, round splitting, cells, bound ratios, tables."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from simulate.bench import allreduce
from simulate.bench.broker import allreduce_traffic
from simulate.bench.fleetrun import (
    FleetRun,
    FleetScenario,
    LinkCut,
    event_times,
    parse_rounds_csv,
    per_node_loss_for,
)
from simulate.scenario import parse_scenario


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    allreduce.add_arguments(parser)
    return parser.parse_args(list(argv))


def _rows(seconds: list[float], nodes: int = 7) -> list[dict[str, object]]:
    traffic = allreduce_traffic(nodes)
    return [{"round": i, "allreduce_s_max": s, "bytes_sent": traffic.ingress_bytes,
             "bytes_received": traffic.egress_bytes, "degraded_nodes": 0} for i, s in enumerate(seconds)]


def test_generated_scenarios_are_valid_simulator_scenarios() -> None:
    args = _args("--rounds", "20")
    for nodes, scenario, _label, timeout, dtype in allreduce.plan(args):
        spec = allreduce.scenario_for(args, nodes, scenario, timeout, dtype)
        parsed = parse_scenario(spec.toml(), spec.name)
        assert parsed.fleet.nodes == nodes and parsed.fleet.rounds == 20
        assert len(parsed.faults) == len(allreduce.SCENARIOS[scenario])
        assert parsed.agent["wire_dtype"] == dtype
        if timeout is not None:
            assert parsed.agent["timeout_mode"] == "fixed" and parsed.agent["timeout"] == timeout
        for fault in parsed.faults:
            assert fault.at_round == 5 and fault.end_round == 13


def test_loss_scenario_puts_one_loss_fault_on_every_node() -> None:
    spec = FleetScenario("x", 3, 10, {"algorithm": "rps"}, per_node_loss=per_node_loss_for(0.1))
    parsed = parse_scenario(spec.toml(), "x")
    assert sorted(f.node for f in parsed.faults) == [0, 1, 2]  # type: ignore[union-attr]
    assert all(f.at_round == 0 for f in parsed.faults)


@pytest.mark.parametrize("p", [0.0, 0.05, 0.1, 0.3])
def test_per_node_drop_composes_to_the_end_to_end_loss(p: float) -> None:
    q = per_node_loss_for(p)
    assert 1 - (1 - q) ** 2 == pytest.approx(p)


def test_per_node_drop_rejects_certain_loss() -> None:
    with pytest.raises(ValueError, match="loss probability"):
        per_node_loss_for(1.0)


def test_plan_runs_the_fault_matrix_only_up_to_the_limit() -> None:
    cells = allreduce.plan(_args("--nodes", "7", "31", "--faults-up-to", "15"))
    big = [c for c in cells if c[0] == 31]
    assert big == [(31, "no_faults", "adaptive", None, "float32")]
    small = [c for c in cells if c[0] == 7]
    # fault-free f32 + f16 + int8, then 3 scenarios x (0.5, 1, adaptive)
    assert len(small) == 3 + 3 * 3


def test_split_rounds_separates_warmup_fault_and_transition_rounds() -> None:
    seconds = [9.0, 9.0, 0.3, 0.3, 2.0, 2.0, 0.8, 0.8, 0.8, 1.5, 1.5, 0.3, 0.3]
    parts = allreduce.split_rounds(_rows(seconds), fault_at=5, heal=10)
    assert parts["fault_free"] == [0.3, 0.3, 0.3, 0.3]
    assert parts["fault"] == [0.8, 0.8, 0.8]
    assert sorted(parts["transition"]) == [1.5, 1.5, 2.0, 2.0]


def test_cell_reports_extra_time_in_timeouts_and_the_thesis_figure() -> None:
    seconds = [1.0, 1.0, 0.3, 0.3, 5.0, 5.0, 0.8, 0.8, 0.8, 5.0, 5.0, 0.3, 0.3]
    spec = FleetScenario("c", 7, 13, {}, (LinkCut(1, 3),), 5, 10)
    run = FleetRun(spec, Path("."), True, 10.0, 0, rows=_rows(seconds))
    result = allreduce.cell(run, "one_fault", "fixed 0.5 s", 0.5, "float32")
    assert result["step_s"]["median"] == 0.8
    assert result["fault_free_s"]["median"] == 0.3
    assert result["extra_s"] == pytest.approx(0.5)
    assert result["extra_in_timeouts"] == pytest.approx(1.0)
    assert result["thesis_s"] == 1.449


def test_thesis_figures_for_adaptive_exist_only_without_faults() -> None:
    assert allreduce.thesis_seconds(None, 15, "no_faults") == 0.062
    assert allreduce.thesis_seconds(None, 15, "one_fault") is None
    assert allreduce.thesis_seconds(1.0, 31, "two_serial") == 4.911
    assert allreduce.thesis_seconds(0.5, 63, "no_faults") is None


def test_bound_rows_divide_the_step_by_bytes_over_throughput() -> None:
    spec = FleetScenario("b", 7, 10, {})
    run = FleetRun(spec, Path("."), True, 1.0, 0, rows=_rows([0.5] * 10))
    result = allreduce.cell(run, "no_faults", "adaptive", None, "float32")
    total = allreduce_traffic(7).total_bytes
    (row,) = allreduce.bound_rows([result], throughput=total / 0.1)  # bound = 0.1 s
    assert row["bound_s"] == pytest.approx(0.1)
    assert row["step_over_bound"] == pytest.approx(5.0)
    # telemetry counts frames, the model counts MQTT packets (topic + header): close, below 1
    assert 0.99 < row["bytes_measured_over_model"] <= 1.0


def test_bound_uses_the_wire_format_of_the_run() -> None:
    spec = FleetScenario("b", 7, 10, {})
    run = FleetRun(spec, Path("."), True, 1.0, 0, rows=_rows([0.5] * 10))
    f16 = allreduce.cell(run, "no_faults", "adaptive", None, "float16")
    (row,) = allreduce.bound_rows([f16], throughput=1e9)
    assert row["model_bytes"] < 0.6 * allreduce_traffic(7).total_bytes


def test_rounds_csv_and_event_log_are_read_back() -> None:
    rows = parse_rounds_csv("round,accuracy,allreduce_s_max\n0,,0.5\n1,0.91,0.25\n")
    assert rows == [{"round": 0, "accuracy": None, "allreduce_s_max": 0.5},
                    {"round": 1, "accuracy": 0.91, "allreduce_s_max": 0.25}]
    lines = [json.dumps({"t": 1.5, "type": "run", "phase": "ready"}), "not json", "[]",
             json.dumps({"t": 2.0, "type": "telemetry", "round": 0}),
             json.dumps({"t": 2.5, "type": "telemetry", "round": 0})]
    assert event_times(lines) == (1.5, {0: 2.5})


def test_table_lists_every_cell_and_the_bound() -> None:
    spec = FleetScenario("b", 7, 10, {})
    run = FleetRun(spec, Path("."), True, 1.0, 0, rows=_rows([0.5] * 10))
    result = allreduce.cell(run, "no_faults", "adaptive", None, "float32")
    doc = {"results": [result], "bound": allreduce.bound_rows([result], 1e9), "throughput_mb_s": 1000.0}
    text = allreduce.render_table(doc)
    assert "no_faults" in text and "0.033" in text and "1000.0 MB/s" in text


def test_bad_options_exit_with_usage_error() -> None:
    assert allreduce.run(_args("--nodes", "3")) == 2


def test_merge_keeps_earlier_cells_with_their_own_throughput(tmp_path: Path) -> None:
    spec = FleetScenario("b", 7, 10, {})
    run = FleetRun(spec, Path("."), True, 1.0, 0, rows=_rows([0.5] * 10))
    old = allreduce.cell(run, "no_faults", "adaptive", None, "float32")
    path = tmp_path / "allreduce.json"
    path.write_text(json.dumps({"throughput_mb_s": 500.0, "machine": {"date": "then"}, "results": [old]}))
    (earlier,) = allreduce.earlier_results(path)
    assert earlier["broker_mb_s"] == 500.0 and earlier["measured"] == "then"
    (row,) = allreduce.bound_rows([earlier], throughput=1e12)  # the cell's own 500 MB/s wins
    assert row["throughput_mb_s"] == 500.0
    assert row["bound_s"] == pytest.approx(allreduce_traffic(7).total_bytes / 500e6, rel=1e-3)


def test_merge_of_an_unreadable_file_starts_empty(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert allreduce.earlier_results(bad) == []
    assert allreduce.earlier_results(None) == []


def test_cells_sort_by_size_then_thesis_scenario_order() -> None:
    cells = [{"nodes": 15, "scenario": "no_faults", "timeout": "adaptive", "wire_dtype": "float32"},
             {"nodes": 7, "scenario": "two_serial", "timeout": "fixed 0.5 s", "wire_dtype": "float32"},
             {"nodes": 7, "scenario": "no_faults", "timeout": "adaptive", "wire_dtype": "int8"},
             {"nodes": 7, "scenario": "no_faults", "timeout": "adaptive", "wire_dtype": "float32"}]
    ordered = sorted(cells, key=allreduce.cell_order)
    assert [(c["nodes"], c["scenario"], c["wire_dtype"]) for c in ordered] == [
        (7, "no_faults", "float32"), (7, "no_faults", "int8"), (7, "two_serial", "float32"),
        (15, "no_faults", "float32")]
