"""bench loss without a fleet: scenarios, drops against p = 0 at the same round, the table."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from simulate.bench import loss
from simulate.bench.fleetrun import FleetRun, FleetScenario
from simulate.scenario import parse_scenario


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    loss.add_arguments(parser)
    return parser.parse_args(list(argv))


def _result(nodes: int, p: float, accs: dict[int, float]) -> dict[str, object]:
    spec = FleetScenario("l", nodes, 10, {})
    rows = [{"round": r, "accuracy": accs.get(r), "round_s_max": 0.3, "degraded_nodes": int(p > 0),
             "missing_chunks": 2, "nacks": 1, "distinct_hashes": 1 + int(p > 0)} for r in range(10)]
    return loss.run_result(nodes, p, FleetRun(spec, Path("."), True, 5.0, 0, rows=rows, ready_t=0.0,
                                              round_end_t={r: float(r) for r in range(10)}))


def test_defaults_are_the_rps_sweep() -> None:
    args = _args()
    assert args.p == [0.0, 0.05, 0.1, 0.2, 0.3] and args.nodes == [7, 15]


def test_scenario_without_loss_has_no_faults() -> None:
    args = _args()
    assert parse_scenario(loss.scenario_for(args, 7, 0.0).toml(), "x").faults == []
    lossy = parse_scenario(loss.scenario_for(args, 15, 0.2).toml(), "x")
    assert len(lossy.faults) == 15


def test_drops_are_against_p0_of_the_same_fleet_at_the_same_round() -> None:
    results = [_result(7, 0.0, {9: 0.95}), _result(7, 0.1, {9: 0.947}),
               _result(15, 0.0, {9: 0.96}), _result(15, 0.3, {4: 0.9})]
    loss.add_drops(results)
    assert results[0]["drop_pp"] == 0.0
    assert results[1]["drop_pp"] == pytest.approx(0.3)
    assert results[3]["drop_pp"] is None  # not evaluated at the reference's round
    assert results[1]["degraded_rounds"] == 10 and results[1]["max_distinct_models"] == 2


def test_table_rows_follow_the_results() -> None:
    results = [_result(7, 0.0, {9: 0.95}), _result(7, 0.2, {9: 0.94})]
    loss.add_drops(results)
    doc = {"rounds": 10, "lr": 0.003, "batch": 100, "results": results}
    rows = loss.table_rows(doc)
    assert [r[1] for r in rows] == [0.0, 0.2]
    assert "ft-tree, 10 rounds" in loss.render_table(doc)


def test_bad_options_exit_with_usage_error() -> None:
    assert loss.run(_args("--p", "1.5")) == 2


def test_table_shows_the_accuracy_at_the_reference_round_not_a_later_one() -> None:
    results = [_result(7, 0.0, {8: 0.95}), _result(7, 0.1, {8: 0.93, 9: 0.96})]
    loss.add_drops(results)
    row = loss.table_rows({"results": results})[1]
    assert row[2:5] == [8, "93.00 %", pytest.approx(2.0)]
