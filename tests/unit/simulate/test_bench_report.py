"""bench report (simulate.evaluation): docs/EVALUATION.md from whatever JSON exists."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.commands.isolation_cmd import THESIS_CLAIMS, claims_hold
from agent.protocol.isolation import isolation_table
from simulate import evaluation
from simulate.bench import broker
from simulate.bench.common import document


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    evaluation.add_arguments(parser)
    return parser.parse_args(list(argv))


def _stats(median: float) -> dict[str, float]:
    return {"median": median, "p10": median * 0.9, "p90": median * 1.1, "min": median * 0.8,
            "max": median * 1.2, "n": 3}


def _broker_doc() -> dict[str, Any]:
    rows = [{"broker": "mosquitto", "payload_bytes": broker.CHUNK_FRAME_BYTES, "subscribers": 1,
             "messages": 10, "repeats": 3, "warmup": 1, "lost": 0, "delivered_mb_s": _stats(200.0),
             "broker_mb_s": _stats(400.0), "messages_per_s": _stats(3000.0), "seconds": _stats(0.1)},
            {"broker": "embedded", "payload_bytes": 100, "subscribers": 6, "error": "did not start"}]
    parser = argparse.ArgumentParser()
    broker.add_arguments(parser)
    return broker._document(parser.parse_args([]), rows)


def _isolation_doc() -> dict[str, Any]:
    results = isolation_table([1, 2, 3], 2, 100, np.random.default_rng(0))
    return document("isolation", arity=2, trials=100, seed=0, results=[r.as_dict() for r in results],
                    thesis={"figure_values": None, "claims": THESIS_CLAIMS,
                            "claims_hold": claims_hold(results)})


def _gloo_doc() -> dict[str, Any]:
    return document("gloo", available=True, torch="2.x", backend="gloo", transport="TCP on 127.0.0.1",
                    results=[{"nodes": 7, "values": 407_050, "iterations": 5, "ms": _stats(20.0)},
                             {"nodes": 15, "error": "timed out"}])


def _write(results: Path, name: str, doc: Any) -> None:
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{name}.json").write_text(doc if isinstance(doc, str) else json.dumps(doc))


def test_known_benches_become_tables_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results, out = tmp_path / "results", tmp_path / "docs" / "EVALUATION.md"
    _write(results, "broker", _broker_doc())
    _write(results, "isolation", _isolation_doc())
    _write(results, "gloo", _gloo_doc())
    _write(results, "model", {"benchmark": "model", "results": [
        {"backend": "numpy", "steps": 10, "batch": 100, "optimizer": "adam", "step_ms_median": 5.0,
         "step_ms_p90": 6.0, "gradients_ms_median": 3.0, "apply_ms_median": 2.0, "create_ms": 1.0,
         "peak_rss_mb": 90.0, "rss_before_backend_mb": 80.0, "rss_increase_mb": 10.0}]})
    assert evaluation.run(_args("--results", str(results), "--out", str(out), "--json")) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["sections"]["broker"] == "measured" and report["sections"]["allreduce"] == "missing"
    assert sorted(Path(p).name for p in report["images"]) == ["broker.png", "gloo.png", "isolation.png"]
    text = out.read_text()
    assert "![broker throughput](img/broker.png)" in text
    assert "| mosquitto | 65585 | 1 | 10 | 3 | 200 | 400 |" in text
    assert "**error** embedded 100 B x6: did not start" in text
    assert "The physical bound of one fault-free allreduce" in text and "| 7 | 600 |" in text
    assert "failed links (mean ± std)" in text and "[agrees]" in text
    assert "| 7 | 20 |" in text and "at 15 nodes: timed out" in text
    assert "| numpy | 5 | 6 |" in text and "machine not recorded" in text
    for png in report["images"]:
        assert Path(png).read_bytes()[:4] == b"\x89PNG"


def test_missing_benches_are_marked_with_the_command_to_run(tmp_path: Path) -> None:
    out = tmp_path / "EVALUATION.md"
    assert evaluation.run(_args("--results", str(tmp_path / "none"), "--out", str(out))) == 0
    text = out.read_text()
    for section in evaluation.SECTIONS:
        assert f"Run `{section.command}`" in text
    assert text.count("**Not yet measured.**") == len(evaluation.SECTIONS)
    assert "| 0.5 s | 7 | 0.033 | 1.449 | 1.495 | 2.822 |" in text  # the thesis's Table 1, for reference
    assert "Report generated" in text and "cores" in text


def test_bad_json_is_reported_and_the_rest_still_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results, out = tmp_path / "r", tmp_path / "E.md"
    _write(results, "broker", "{not json")
    _write(results, "isolation", "[1, 2]")
    _write(results, "gloo", {"benchmark": "gloo", "available": False, "reason": "torch is not installed"})
    _write(results, "model", {"benchmark": "model", "results": "oops"})
    assert evaluation.run(_args("--results", str(results), "--out", str(out), "--json")) == 0
    captured = capsys.readouterr()
    sections = json.loads(captured.out)["sections"]
    assert sections["broker"] == sections["isolation"] == "unreadable"
    assert sections["gloo"] == "measured"
    text = out.read_text()
    assert "broker.json is not valid JSON" in text and "holds a JSON list" in text
    assert "Not available when measured: torch is not installed" in text
    assert "Could not render" in text  # model's results are not rows
    assert "unreadable JSON" in captured.err


def test_unknown_benches_get_a_generic_table(tmp_path: Path) -> None:
    results, out = tmp_path / "r", tmp_path / "E.md"
    _write(results, "allreduce", document("allreduce", timeout=0.5, results=[
        {"nodes": 7, "scenario": "no faults", "step_s": _stats(0.05), "nested": {"x": 1}}]))
    _write(results, "zzz", {"value": 3})
    assert evaluation.run(_args("--results", str(results), "--out", str(out))) == 0
    text = out.read_text()
    assert "| nodes | scenario | step_s |" in text and "| 7 | no faults | 0.05 |" in text
    assert "| timeout | 0.5 |" in text and "Tables 1 and 2" in text
    assert "## Other: zzz" in text and "| value | 3 |" in text
