"""The report's differential privacy column: the most any reporter's data spent by a round."""

from __future__ import annotations

from simulate.report import rounds_table, sync_figures


def test_each_round_reports_the_largest_epsilon_spent_and_the_summary_the_last() -> None:
    records = [
        {"type": "telemetry", "round": 0, "node": 0, "dp_epsilon": 0.5},
        {"type": "telemetry", "round": 0, "node": 1, "dp_epsilon": 0.7},
        {"type": "telemetry", "round": 1, "node": 0, "dp_epsilon": 0.9},
        {"type": "telemetry", "round": 1, "node": 1},  # a device without the accountant
    ]
    rows = rounds_table(records)
    assert [r.dp_epsilon for r in rows] == [0.7, 0.9]
    assert sync_figures(rows)["dp_epsilon"] == 0.9
    assert rounds_table([{"type": "telemetry", "round": 0, "node": 0}])[0].dp_epsilon is None
