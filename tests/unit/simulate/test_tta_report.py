"""The time-to-accuracy section's table and verdicts: each bound can say met and missed."""

from __future__ import annotations

from typing import Any

from simulate import tta_report


def _run(rate: float, sync: str, seconds: float | None, matched: float | None = 0.97) -> dict[str, Any]:
    return {"link_mbs": rate, "sync_every": sync, "local_steps": 1 if sync == "1" else 16, "rounds": 100,
            "round_reached": 90 if seconds else None, "seconds": seconds, "megabytes_sent": 10.0,
            "samples": 63_000, "median_round_s": 0.5, "final_accuracy": 0.971, "samples_trained": 70_000,
            "matched_samples": 70_000, "accuracy_at_matched": matched}


def test_the_ratio_is_met_at_5x_on_a_limited_link_and_missed_below() -> None:
    doc = {"results": [_run(2, "1", 500.0), _run(2, "auto", 50.0), _run(6, "1", 100.0), _run(6, "auto", 40.0)]}
    two, six = tta_report.verdicts(doc)
    assert "**10.0x** (met" in two and "**2.5x** (missed" in six
    assert "+0.00 pp (met" in two
    doc["results"][1]["matched_between"] = [[44_800, 0.96], [89_600, 0.98]]
    assert "(96.00 % at 44,800 .. 98.00 % at 89,600 samples)" in tta_report.verdicts(doc)[0]
    assert tta_report.table_rows(doc)[1][-1].startswith("97.00 % (96.00 % at 44,800")


def test_loopback_allows_10_percent_and_accuracy_allows_half_a_point() -> None:
    doc = {"results": [_run(0, "1", 100.0, 0.970), _run(0, "auto", 109.0, 0.964)]}
    (line,) = tta_report.verdicts(doc)
    assert "(met: never more than 10 % slower)" in line and "-0.60 pp (missed" in line
    doc = {"results": [_run(0, "1", 100.0), _run(0, "auto", 112.0)]}
    assert "(missed: never more than 10 % slower)" in tta_report.verdicts(doc)[0]


def test_a_run_short_of_the_target_gives_no_ratio_and_the_table_says_so() -> None:
    doc = {"results": [_run(2, "1", None), _run(2, "auto", 50.0)]}
    assert tta_report.verdicts(doc) == ["- 2 MB/s: a run did not reach the target; no ratio."]
    assert tta_report.table_rows(doc)[0][4] == "not reached"
    assert tta_report.table_rows({"results": [_run(0, "auto", 5.0)]})[0][0] == "unlimited"
