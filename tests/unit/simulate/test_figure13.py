"""Figure 13's verdicts and plot from a bench accuracy document (no fleet)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simulate import figure13

THESIS_LIKE = [("ps-sync", 0.981, 90.0), ("ps-async", 0.975, 80.0), ("ring", 0.979, 40.0),
               ("tree", 0.980, 45.0), ("ft-tree", 0.980, 50.0), ("rps", 0.99, 1.0)]


def _doc(runs: list[tuple[str, float, float]]) -> dict[str, Any]:
    results = [{"algorithm": a, "label": a, "chunk_loss": 0.0,
                "curve": [{"round": 0, "accuracy": 0.5, "seconds": 1.0},
                          {"round": 9, "accuracy": acc, "seconds": s}]} for a, acc, s in runs]
    results.append({"algorithm": "ft-tree", "label": "ft-tree, loss 0.1", "chunk_loss": 0.1,
                    "curve": [{"round": 9, "accuracy": 0.1, "seconds": 999.0}]})
    return {"nodes": 7, "samples_per_step": 700, "results": results,
            "baseline": {"curve": [{"round": 85, "accuracy": 0.95, "seconds": 2.0}]}}


def test_a_run_ordered_like_the_thesis_agrees_on_every_line() -> None:
    lines = figure13.sentences(_doc(THESIS_LIKE))
    assert len(lines) == 5 and all(line.startswith("- [agrees]") for line in lines)
    assert "#1 of 5 by accuracy" in lines[0] and "#5 of 5 by time" in lines[0]  # rps is not of the five


def test_a_parameter_server_faster_than_the_trees_differs() -> None:
    runs = [(a, acc, 10.0 if a == "ps-sync" else s) for a, acc, s in THESIS_LIKE]
    lines = dict(zip(figure13.FIVE, figure13.sentences(_doc(runs)), strict=True))
    assert lines["ps-sync"].startswith("- [**differs**]") and lines["tree"].startswith("- [**differs**]")
    assert lines["ring"].startswith("- [agrees]")


def test_the_reading_gives_this_runs_spread_and_the_async_lag() -> None:
    text = figure13.reading(_doc(THESIS_LIKE))
    assert "(0.20 pp apart here)" in text and "(0.60 pp below ps-sync here)" in text
    assert figure13.reading(_doc(THESIS_LIKE[:2])) == ""


def test_a_run_without_all_five_says_what_it_lacks() -> None:
    (line,) = figure13.sentences(_doc(THESIS_LIKE[:2]))
    assert "ps-async, ps-sync" in line and "needs all five" in line


def test_the_plot_is_drawn(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = tmp_path / "figure13.png"
    figure13.plot(_doc(THESIS_LIKE), path, plt)
    assert path.read_bytes().startswith(b"\x89PNG") and path.stat().st_size > 10_000
