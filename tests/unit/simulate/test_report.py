"""The report from a synthetic event log: rows, fault detection, summary, files and plots."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from simulate import report

NODES = 7


def _telemetry(node: int, rnd: int, *, allreduce: float = 0.05, events: list[dict[str, Any]] | None = None,
               links: dict[str, str] | None = None, degraded: bool = False, accuracy: float | None = None,
               model_hash: str = "abcd0123") -> dict[str, Any]:
    return {"type": "telemetry", "t": 1.0 + rnd, "node": node, "round": rnd, "epoch": 1,
            "algorithm": "ft-tree", "wall_time": 1e9 + rnd, "loss": 2.0 / (rnd + 1), "accuracy": accuracy,
            "phase_seconds": {"compute": 0.01, "allreduce": allreduce, "total": allreduce + 0.02},
            "bytes_sent": 1_600_000, "bytes_received": 1_600_000, "contributors": NODES,
            "members": NODES, "reroutes": len(events or []), "timeouts": 0, "nacks": 0, "pulls": 0,
            "degraded": degraded, "missing_chunks": 0, "rejected": {}, "links": links or {},
            "model_hash": model_hash, "events": events or []}


def _fault(action: str, index: int, kind: str, targets: list[int], rnd: int, t: float) -> dict[str, Any]:
    rec = {"type": "fault", "t": t, "action": action, "index": index, "kind": kind, "round": rnd,
           "targets": targets, "description": f"{kind} {targets}", "mechanism": "test"}
    return rec


def serial_faults_log(detect_second: bool = True) -> list[dict[str, Any]]:
    """15 rounds; links 0-1 and 1-3 cut in rounds 5..9; a crash of node 6 at round 12."""
    records: list[dict[str, Any]] = [{"type": "run", "t": 0.0, "phase": "start"}]
    records += [_fault("plan", i, k, tg, 0, 0.0) for i, k, tg in
                ((0, "link", [0, 1]), (1, "link", [1, 3]), (2, "crash", [6]), (3, "loss", [2]))]
    records.append(_fault("skip", 3, "loss", [2], 0, 0.0) | {"detail": "not here"})
    for rnd in range(15):
        if rnd == 5:
            records += [_fault("inject", 0, "link", [0, 1], 5, 5.5), _fault("inject", 1, "link", [1, 3], 5, 5.5)]
        if rnd == 10:
            records += [_fault("heal", 0, "link", [0, 1], 10, 10.5), _fault("heal", 1, "link", [1, 3], 10, 10.5)]
        if rnd == 0:
            records.append({"type": "process", "t": 0.1, "event": "spawn", "node": 6, "pid": 4242,
                            "incarnation": 1})
        if rnd == 12:
            # The Will is on the broker before the simulator writes the fault's record.
            records.append({"type": "status", "t": 12.45, "node": 6, "state": "offline", "round": 0,
                            "pid": 4242, "incarnation": 1})
            records.append(_fault("inject", 2, "crash", [6], 12, 12.5))
        in_fault = 5 <= rnd < 10
        for node in range(NODES):
            if rnd >= 12 and node == 6:
                continue
            events: list[dict[str, Any]] = []
            if in_fault and node == 1:
                events.append({"kind": "reroute", "peer": 0, "detail": "via 2"})
            if in_fault and node == 3 and detect_second:
                events.append({"kind": "link_dead", "peer": 1, "detail": ""})
            records.append(_telemetry(node, rnd, allreduce=1.4 if in_fault else 0.05, events=events,
                                      accuracy=0.5 + rnd / 40 if rnd % 5 == 4 else None,
                                      degraded=(rnd == 7 and node == 4)))
    records.append({"type": "run", "t": 16.0, "phase": "end", "wall_time_s": 16.0, "halted": False,
                    "interrupted": False})
    return records


def test_rounds_table_aggregates_every_agent() -> None:
    faults = report.fault_outcomes(serial_faults_log())
    rows = report.rounds_table(serial_faults_log(), faults)
    assert [r.round for r in rows] == list(range(15))
    assert rows[0].reporters == NODES and rows[14].reporters == NODES - 1
    assert rows[6].allreduce_s_max == 1.4 and rows[6].faults_active == "0 1"
    assert rows[7].degraded_nodes == 1
    assert rows[12].faults_active == "2"
    assert rows[0].bytes_sent == NODES * 1_600_000


def test_an_agents_second_report_of_a_round_counts_once() -> None:
    """A reconnecting agent sent its report of round 9 again: the row said 8 reporters of 7."""
    records = serial_faults_log()
    again = next(r for r in records if r.get("type") == "telemetry" and r["round"] == 9 and r["node"] == 1)
    records.append(again | {"t": again["t"] + 0.05})
    rows = report.rounds_table(records, report.fault_outcomes(records))
    assert rows[9].reporters == NODES and rows[9].bytes_sent == NODES * 1_600_000


def test_every_injected_fault_is_detected_from_telemetry_and_status() -> None:
    faults = report.fault_outcomes(serial_faults_log())
    assert [(f.index, f.status, f.detected) for f in faults] == [
        (0, "injected", True), (1, "injected", True), (2, "injected", True), (3, "skipped", False)]
    assert "reroute 1->0" in faults[0].evidence
    assert "link_dead 3->1" in faults[1].evidence
    assert "Last Will" in faults[2].evidence and "pid 4242" in faults[2].evidence
    assert faults[0].end_round == 10 and faults[2].end_round is None


def test_a_fault_nobody_reported_is_not_detected() -> None:
    faults = report.fault_outcomes(serial_faults_log(detect_second=False))
    assert faults[1].detected is False
    summary = report.summarize(serial_faults_log(detect_second=False))
    assert summary["faults_injected"] == 3 and summary["faults_detected"] == 2


def test_link_state_alone_counts_as_detection() -> None:
    records = [_fault("plan", 0, "link", [2, 5], 0, 0.0), _fault("inject", 0, "link", [2, 5], 3, 3.0),
               _telemetry(5, 3, links={"2": "failed"}), _telemetry(2, 3)]
    assert report.fault_outcomes(records)[0].detected


def test_a_lossy_link_repaired_by_retransmits_alone_is_detected_and_a_clean_one_is_not() -> None:
    """5 % frame loss that every retransmit repaired: no NACK, timeout or reroute, so the
    report said "not detected" although the agents resent units all along."""
    def log(retransmits: int) -> list[dict[str, Any]]:
        return [_fault("plan", 0, "loss", [4], 0, 0.0), _fault("inject", 0, "loss", [4], 3, 3.0),
                _telemetry(4, 3) | {"retransmits": retransmits}, _telemetry(1, 3), _telemetry(4, 4)]
    detected = report.fault_outcomes(log(3))[0]
    assert detected.detected and "retransmits" in detected.evidence
    assert report.fault_outcomes(log(0))[0].detected is False


def test_a_crash_without_its_will_is_undetected_even_if_a_clean_exit_follows() -> None:
    records = [_fault("plan", 0, "crash", [5], 0, 0.0),
               {"type": "process", "t": 0.1, "event": "spawn", "node": 5, "pid": 100, "incarnation": 1},
               _fault("inject", 0, "crash", [5], 3, 3.0),
               {"type": "process", "t": 6.0, "event": "spawn", "node": 5, "pid": 200, "incarnation": 2},
               # the restarted process's clean exit at the end of the run: not the crash's Will
               {"type": "status", "t": 9.0, "node": 5, "state": "offline", "round": 20, "pid": 200,
                "incarnation": 2}]
    outcome = report.fault_outcomes(records)[0]
    assert not outcome.detected and "no Last Will" in outcome.evidence
    will = {"type": "status", "t": 3.2, "node": 5, "state": "offline", "round": 0, "pid": 100, "incarnation": 1}
    assert report.fault_outcomes([*records, will])[0].detected


def test_a_hang_says_how_the_fleet_saw_it() -> None:
    base = [_fault("plan", 0, "hang", [4], 0, 0.0), _fault("inject", 0, "hang", [4], 3, 3.0)]
    suspected = _telemetry(1, 4, events=[{"kind": "suspected", "peer": 4, "detail": ""}])
    view = {"type": "view", "t": 5.5, "epoch": 2, "members": [0, 1, 2, 3, 5, 6], "arity": 2,
            "coordinator": 0, "from_round": 6}
    will = {"type": "status", "t": 8.0, "node": 4, "state": "offline", "round": 0, "pid": 1, "incarnation": 1}
    assert report.fault_outcomes([*base, suspected, view, will])[0].evidence.startswith("suspicion")
    assert report.fault_outcomes([*base, view, will])[0].evidence.startswith("view change")
    assert report.fault_outcomes([*base, will])[0].evidence.startswith("Last Will")


def test_hang_is_detected_by_the_peers() -> None:
    records = [_fault("plan", 0, "hang", [4], 0, 0.0), _fault("inject", 0, "hang", [4], 3, 3.0),
               _telemetry(1, 3, events=[{"kind": "timeout", "peer": 4, "detail": ""}])]
    outcome = report.fault_outcomes(records)[0]
    assert outcome.detected and "timeout 1->4" in outcome.evidence


def test_summary_numbers() -> None:
    summary = report.summarize(serial_faults_log(), {"scenario": {"name": "s", "fleet": {"nodes": 7, "rounds": 15}}},
                               {"final_accuracy": 0.9})
    assert summary["rounds"] == 15
    assert summary["faults_injected"] == summary["faults_detected"] == 3
    assert summary["faults_skipped"] == 1
    assert summary["degraded_rounds"] == 1
    assert summary["final_test_accuracy"] == 0.5 + 14 / 40
    assert summary["round_time_fault_window_median_s"] == 1.4
    assert summary["round_time_fault_free_median_s"] == 0.05
    assert summary["wall_time_s"] == 16.0
    assert summary["models_identical_at_end"] is True
    assert summary["baseline_final_accuracy"] == 0.9
    assert summary["halted"] is False


def test_write_report_writes_every_file(tmp_path: Path) -> None:
    baseline = {"rounds": list(range(15)), "loss": [2.0 / (r + 1) for r in range(15)],
                "eval_rounds": [4, 9, 14], "accuracy": [0.6, 0.7, 0.8], "final_accuracy": 0.8}
    summary = report.write_report(tmp_path, serial_faults_log(), {"scenario": {"name": "s"}}, baseline)
    for name in ("rounds.csv", "summary.json", "report.md", "round_time.png", "loss_accuracy.png", "bytes.png"):
        assert (tmp_path / name).is_file(), name
    for png in summary["plots"]:
        data = (tmp_path / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, png
    with open(tmp_path / "rounds.csv") as fh:
        assert len(list(csv.DictReader(fh))) == 15
    assert json.loads((tmp_path / "summary.json").read_text())["faults_detected"] == 3
    md = (tmp_path / "report.md").read_text()
    assert "3 injected, 3 detected" in md and "![round_time.png](round_time.png)" in md


def test_an_empty_log_still_gives_a_report(tmp_path: Path) -> None:
    summary = report.write_report(tmp_path, [], {})
    assert summary["rounds"] == 0 and summary["final_test_accuracy"] is None
    assert (tmp_path / "report.md").is_file()


def test_rounds_say_which_wire_formats_the_agents_frames_of_values_used(tmp_path: Path) -> None:
    records = [_telemetry(n, 0) | {"wire_frames": {"float32": 2}} for n in range(3)]
    records += [_telemetry(n, 1) | {"wire_frames": {"float32": 1, "int8": 2}} for n in range(2)]
    records.append(_telemetry(2, 1))  # an agent that does not say
    rows = report.rounds_table(records)
    assert [r.wire_frames for r in rows] == ["float32:6", "float32:2 int8:4"]
    assert report.parse_wire_frames(rows[1].wire_frames) == {"float32": 2, "int8": 4}
    assert report.parse_wire_frames("") == {} == report.parse_wire_frames(None)
    assert report.parse_wire_frames("int8:x float16:3") == {"float16": 3}
    assert "wire_frames" in report.ROUND_COLUMNS


def test_the_time_after_the_last_gradient_runs_from_the_last_gradient_to_the_last_result() -> None:
    # gradients at 10.000, 10.030 (the last) and 10.015; results at 10.050, 10.060, 10.055
    ends = [(10.050, 0.050), (10.060, 0.030), (10.055, 0.040)]
    assert report.after_last_gradient(ends) == pytest.approx(0.030)
    assert report.after_last_gradient([*ends, (0.0, 0.02)]) is None  # one agent did not say when
    assert report.after_last_gradient([*ends, (float("nan"), 0.02)]) is None
    assert report.after_last_gradient([]) is None


def test_rounds_say_the_time_after_the_last_gradient_when_every_agent_said_when() -> None:
    said = [_telemetry(n, 0, allreduce=0.05 - 0.01 * n) | {"reduced_at": 100.0 + 0.001 * n} for n in range(3)]
    unsaid = [_telemetry(n, 1, allreduce=0.05) for n in range(3)]
    rows = report.rounds_table(said + unsaid)
    assert rows[0].after_last_gradient_s == pytest.approx(0.030)  # node 2's gradient to node 2's result
    assert rows[1].after_last_gradient_s is None


def _model_log() -> list[dict[str, Any]]:
    """Three agents of one model with their labels, a fourth of another model refused."""
    fp = "0123456789abcdef"
    records = serial_faults_log()[:1]
    for node, labels in ((0, [90, 0, 10]), (1, [0, 50, 50]), (2, [5, 5, 90])):
        records.append({"type": "status", "t": 0.2, "node": node, "state": "online", "round": 0, "pid": 100 + node,
                        "incarnation": 1, "fingerprint": fp, "model": "digits-mlp", "params": 2410,
                        "labels": labels})
    records.append({"type": "status", "t": 0.2, "node": 3, "state": "online", "round": 0, "pid": 103,
                    "incarnation": 1, "fingerprint": "ffffffffffffffff", "model": "other", "params": 9,
                    "labels": [1, 1, 1]})
    records.append({"type": "view", "t": 0.3, "epoch": 1, "members": [0, 1, 2], "arity": 2, "coordinator": 0,
                    "from_round": 0, "fingerprint": fp, "model": "digits-mlp", "params": 2410})
    records.append({"type": "process", "t": 0.4, "event": "exit", "node": 3, "pid": 103, "code": 5,
                    "incarnation": 1})
    records.append({"type": "process", "t": 9.0, "event": "exit", "node": 2, "pid": 102, "code": 0,
                    "incarnation": 1})
    records += [_telemetry(n, 0) for n in range(3)]
    return records


def test_the_summary_names_the_model_the_refused_members_and_every_agents_labels() -> None:
    summary = report.summarize(_model_log(), {"model": {"model": "x.py:factory", "backend": "numpy",
                                                        "dataset": "digits", "partition": "dirichlet:0.5"}})
    assert summary["model"] == {"fingerprint": "0123456789abcdef", "name": "digits-mlp", "params": 2410}
    assert summary["refused_members"] == [3]  # node 2's clean exit is no refusal
    assert summary["label_histograms"] == {"0": [90, 0, 10], "1": [0, 50, 50], "2": [5, 5, 90], "3": [1, 1, 1]}
    assert summary["setup"]["partition"] == "dirichlet:0.5"


def test_the_report_has_a_labels_table_and_plot(tmp_path: Path) -> None:
    summary = report.write_report(tmp_path, _model_log(), {"scenario": {"name": "s"}})
    assert "labels.png" in summary["plots"]
    data = (tmp_path / "labels.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    md = (tmp_path / "report.md").read_text()
    assert "| node | samples | 0 | 1 | 2 |" in md and "| 1 | 100 | 0 | 50 | 50 |" in md
    assert "refused members (another model than the fleet's): 1 (nodes 3)" in md
    assert "digits-mlp, 2,410 params, fingerprint 0123456789abcdef" in md


def test_a_run_without_labels_has_no_labels_plot(tmp_path: Path) -> None:
    summary = report.write_report(tmp_path, serial_faults_log(), {"scenario": {"name": "s"}})
    assert "labels.png" not in summary["plots"] and not (tmp_path / "labels.png").exists()
    assert summary["refused_members"] == [] and summary["model"] is None


def test_the_rounds_and_the_summary_say_local_steps_sync_against_compute_and_bytes_per_sample() -> None:
    periodic = []
    for rnd in range(4):
        for node in range(NODES):
            tel = _telemetry(node, rnd, allreduce=0.3)
            tel.update(local_steps=8, samples=800, phase_seconds={"compute": 0.1, "allreduce": 0.3, "total": 0.4})
            periodic.append(tel)
    rows = report.rounds_table(periodic)
    assert [(r.local_steps, r.samples, r.compute_s_median) for r in rows] == [(8, 800 * NODES, 0.1)] * 4
    assert rows[0].bytes_per_sample == pytest.approx(1_600_000 / 800)
    summary = report.summarize(periodic)
    assert summary["local_steps_per_sync"] == 8 and summary["samples_trained"] == 4 * NODES * 800
    assert summary["sync_share"] == pytest.approx(0.75)
    assert summary["bytes_per_sample"] == pytest.approx(2000)
    assert "local steps per sync: 8" in report.render_markdown(summary, [])
    # Telemetry of agents that do not say (every-step averaging before it was counted): one step.
    old = report.summarize([_telemetry(n, 0) for n in range(NODES)])
    assert old["local_steps_per_sync"] == 1 and old["bytes_per_sample"] is None
