"""bench accuracy without a fleet: variants, curves, time to target, the must-show verdict."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from simulate.bench import accuracy
from simulate.bench.fleetrun import FleetRun, FleetScenario
from simulate.scenario import parse_scenario


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    accuracy.add_arguments(parser)
    return parser.parse_args(list(argv))


def _run(accs: dict[int, float], loss: float = 0.0, rounds: int = 10) -> FleetRun:
    spec = FleetScenario("r", 7, rounds, {}, per_node_loss=loss)
    rows = [{"round": r, "accuracy": accs.get(r), "round_s_max": 0.2, "degraded_nodes": 0,
             "missing_chunks": 0, "nacks": 0} for r in range(rounds)]
    return FleetRun(spec, Path("."), True, 30.0, 0, rows=rows, ready_t=1.0,
                    round_end_t={r: 1.0 + 0.5 * (r + 1) for r in range(rounds)})


def test_variants_put_the_lossy_ft_tree_right_after_the_clean_one() -> None:
    labels = [v[0] for v in accuracy.variants(_args("--loss", "0.1"))]
    assert labels == ["ft-tree", "ft-tree, loss 0.1", "tree", "rps", "ps-sync", "ps-async", "ring"]
    assert [v[0] for v in accuracy.variants(_args("--loss", "0"))] == [
        "ft-tree", "tree", "rps", "ps-sync", "ps-async", "ring"]


def test_scenario_carries_algorithm_lr_and_extra_agent_options() -> None:
    args = _args("--lr", "0.002", "--agent-option", "round_deadline=1.5")
    spec = accuracy.scenario_for(args, "ft-tree, loss 0.1", "ft-tree", 0.1)
    parsed = parse_scenario(spec.toml(), spec.name)
    assert parsed.agent["lr"] == 0.002 and parsed.agent["round_deadline"] == 1.5
    assert parsed.agent["algorithm"] == "ft-tree" and len(parsed.faults) == 7


def test_curve_and_time_to_target_use_eval_rounds_and_seconds_since_ready() -> None:
    run = _run({4: 0.95, 9: 0.981})
    points = accuracy.curve(run)
    assert points == [{"round": 4, "accuracy": 0.95, "seconds": 2.5},
                      {"round": 9, "accuracy": 0.981, "seconds": 5.0}]
    assert accuracy.time_to(points, 0.98) == {"round": 9, "seconds": 5.0}
    assert accuracy.time_to(points, 0.99) is None


def test_must_show_compares_at_the_same_round() -> None:
    clean = accuracy.run_result("ft-tree", "ft-tree", 0.0, _run({4: 0.95, 9: 0.982}), 0.98)
    lossy = accuracy.run_result("ft-tree, loss 0.1", "ft-tree", 0.1,
                                _run({4: 0.94, 9: 0.979, 10: 0.5}, 0.05, 11), 0.98)
    shown = accuracy.must_show([clean, lossy], 0.98, 0.1)
    assert shown["ft_tree_reaches_target"] is True
    assert shown["round"] == 9 and shown["lossy_accuracy"] == 0.979
    assert shown["drop_pp"] == pytest.approx(0.3)
    assert shown["loss_within_bound"] is True


def test_must_show_fails_a_drop_beyond_half_a_point() -> None:
    clean = accuracy.run_result("ft-tree", "ft-tree", 0.0, _run({9: 0.975}), 0.98)
    lossy = accuracy.run_result("ft-tree, loss 0.1", "ft-tree", 0.1, _run({9: 0.969}), 0.98)
    shown = accuracy.must_show([clean, lossy], 0.98, 0.1)
    assert shown["ft_tree_reaches_target"] is False and shown["loss_within_bound"] is False


def test_baseline_points_turn_epochs_into_rounds() -> None:
    base = {"report": {"history": [{"epoch": 1, "test_accuracy": 0.96, "elapsed_s": 3.0},
                                   {"epoch": 2, "test_accuracy": 0.981, "elapsed_s": 6.5}]}}
    points = accuracy.baseline_points(base, 85)
    assert points == [{"round": 84, "accuracy": 0.96, "seconds": 3.0},
                      {"round": 169, "accuracy": 0.981, "seconds": 6.5}]


def test_table_has_one_row_per_run_and_the_baseline() -> None:
    result = accuracy.run_result("rps", "rps", 0.0, _run({9: 0.97}), 0.98)
    doc = {"nodes": 7, "batch": 100, "lr": 0.003, "rounds": 10, "target": 0.98, "samples_per_step": 700,
           "results": [result], "must_show": {},
           "baseline": {"curve": [{"round": 84, "accuracy": 0.981, "seconds": 3.0}],
                        "time_to_target": {"round": 84, "seconds": 3.0}}}
    rows = accuracy.table_rows(doc)
    assert [r[0] for r in rows] == ["rps", "single machine (batch 700)"]
    assert "rps" in accuracy.render_table(doc)


def test_bad_options_exit_with_usage_error() -> None:
    assert accuracy.run(_args("--loss", "1.0")) == 2


def test_accuracies_print_with_two_decimals_not_rounded_up_to_the_target() -> None:
    assert accuracy.pct(0.97977) == "97.98 %"
    assert accuracy.pct(None) is None
