"""bench compare: pooling the interleaved runs into medians and ratios, and torch optional."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import pytest

from simulate.bench import compare


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    compare.add_arguments(parser)
    return parser.parse_args(list(argv))


def _fleet(ms: list[float], cpu: float, degraded: int = 0) -> dict[str, Any]:
    return {"samples_ms": ms, "degraded_rounds": degraded, "cpu_agents": cpu, "cpu_mosquitto": 0.05,
            "bound_ms": 25.0, "period_s": 0.1}


def test_samples_are_pooled_over_alternations_and_held_against_gloo() -> None:
    out = compare.summarize(7, {
        "gloo": [{"samples_ms": [10.0, 30.0]}, {"samples_ms": [20.0]}],
        "edgegrove": [_fleet([40.0, 60.0], 0.2), _fleet([50.0], 0.4, degraded=1)],
    })
    gloo, eg = out["arms"]["gloo"], out["arms"]["edgegrove"]
    assert gloo["ms"]["median"] == 20.0 and gloo["run_medians_ms"] == [20.0, 20.0]
    assert eg["ms"]["median"] == 50.0 and eg["ratio_to_gloo"] == 2.5 and eg["ratio_to_bound"] == 2.0
    assert eg["cpu_s_per_round_agents"] == pytest.approx(0.3) and eg["degraded_rounds"] == 1
    rows = compare.table_rows({"results": [out]})
    assert [r[1] for r in rows] == ["gloo", "edgegrove"] and rows[1][4] == 2.5


def test_a_failed_run_is_reported_not_averaged() -> None:
    out = compare.summarize(15, {"gloo": [{"error": "no result"}], "edgegrove": [_fleet([80.0], 0.5)]})
    assert out["arms"]["gloo"]["errors"] == ["no result"] and "ms" not in out["arms"]["gloo"]
    assert out["arms"]["edgegrove"]["ratio_to_gloo"] is None
    assert "error: no result" in compare.render_table({"values": 1, "alternations": 1, "results": [out]})


def test_arms_follow_the_options(tmp_path: Any) -> None:
    args = _args("--fp16-nodes", "7", "--baseline", str(tmp_path))
    assert compare.arms_for(7, args, have_torch=True) == ["gloo", "edgegrove", "edgegrove-fp16", "before",
                                                          "before-fp16"]
    assert compare.arms_for(15, args, have_torch=False) == ["edgegrove", "before"]
    args = _args("--baseline", str(tmp_path), "--baseline-nodes", "7")
    assert compare.arms_for(31, args, have_torch=True) == ["gloo", "edgegrove"]


def test_without_torch_only_edgegrove_runs(monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("torch", "torch.distributed"):
        monkeypatch.setitem(sys.modules, name, None)
    ran: list[str] = []

    def fake_arm(arm: str, nodes: int, args: argparse.Namespace) -> dict[str, Any]:
        ran.append(arm)
        return _fleet([30.0], 0.1)

    monkeypatch.setattr(compare, "_run_arm", fake_arm)
    assert compare.run(_args("--nodes", "3", "--alternations", "2", "--fp16-nodes")) == 0
    captured = capsys.readouterr()
    assert ran == ["edgegrove", "edgegrove"]
    assert "torch is not installed" in captured.err and "edgegrove" in captured.out


def test_the_report_section_shows_every_arm_and_the_baseline(tmp_path: Any) -> None:
    from simulate.evaluation import Context, render_compare

    out = compare.summarize(7, {"gloo": [{"samples_ms": [20.0]}], "edgegrove": [_fleet([50.0], 0.1)],
                                "before": [_fleet([150.0], 0.2)]})
    doc = {"alternations": 2, "rounds": 14, "warmup": 4, "gloo_iterations": 20, "torch": "2.x",
           "baseline": "/tmp/base", "agent_options": [], "values": 1, "results": [out]}
    text = render_compare(doc, Context({}, tmp_path, ""))
    assert "`before`" in text and "| 7 | before | 150 |" in text and "| 7 | edgegrove | 50 |" in text
    assert "only (not `before`)" not in text
    doc["own_options"] = ["broadcast=fanout"]
    assert "only (not `before`): `broadcast=fanout`" in render_compare(doc, Context({}, tmp_path, ""))


def test_own_options_reach_this_checkouts_arms_only(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, list[str]] = {}

    def measure(nodes: int, fleet_args: argparse.Namespace, work: Any) -> dict[str, Any]:
        seen[str(fleet_args.env)] = fleet_args.agent_option
        return {"per_round": [], "degraded_rounds": 0, "cpu_s_per_round_agents": 0.1,
                "cpu_s_per_round": {}, "bound_s": 0.02, "round_period_s_median": 0.1}

    monkeypatch.setattr(compare.round_profile, "measure_fleet", measure)
    args = _args("--baseline", str(tmp_path), "--agent-option", "chunk_size=1024",
                 "--own-option", "broadcast=fanout")
    compare._run_arm(compare.EDGEGROVE, 7, args)
    compare._run_arm(compare.BEFORE_FP16, 7, args)
    assert seen == {"[]": ["chunk_size=1024", "broadcast=fanout"],
                    f"['PYTHONPATH={tmp_path}']": ["chunk_size=1024", "wire_dtype=float16"]}


def _baseline_checkout(root: Any, body: str) -> Any:
    """A checkout whose `bench round-profile` is ``body`` (the baseline arm runs it as is)."""
    bench = root / "simulate" / "bench"
    bench.mkdir(parents=True)
    for package in (root / "simulate", bench):
        (package / "__init__.py").write_text("")
    (bench / "round_profile.py").write_text(body)
    return root


_RECORDING_PROFILE = '''
import json, os, sys
with open(os.path.join(os.environ["PYTHONPATH"], "seen.json"), "w") as fh:
    json.dump({"argv": sys.argv[1:], "cwd": os.getcwd(), "module": __file__}, fh)
print("round profile: 7 agents ...", file=sys.stderr)
print(json.dumps({"results": [{"per_round": [{"allreduce_max": 0.1}, {"allreduce_max": 0.3}],
                               "degraded_rounds": 0, "cpu_s_per_round_agents": 0.2,
                               "cpu_s_per_round": {"mosquitto": 0.02}, "bound_s": 0.025,
                               "round_period_s_median": 0.3}]}))
'''


def test_a_baseline_checkout_measures_its_own_fleet_with_its_own_code(tmp_path: Any) -> None:
    # An old checkout's agents are refused by this checkout's broker set-up (credentials bound
    # to client ids): the baseline runs its own round-profile, broker and agents.
    base = _baseline_checkout(tmp_path / "base", _RECORDING_PROFILE)
    args = _args("--baseline", str(base), "--agent-option", "chunk_size=1024", "--own-option", "broadcast=fanout",
                 "--rounds", "9", "--warmup", "3")
    out = compare._run_arm(compare.BEFORE_FP16, 7, args)
    assert out["samples_ms"] == [100.0, 300.0] and out["after_last_gradient_ms"] == []
    assert out["cpu_agents"] == 0.2 and out["bound_ms"] == 25.0
    seen = json.loads((base / "seen.json").read_text())
    assert seen["cwd"] == str(base) and seen["module"].startswith(str(base))
    argv = seen["argv"]
    assert argv[argv.index("--nodes") + 1] == "7" and argv[argv.index("--rounds") + 1] == "9"
    options = [argv[i + 1] for i, a in enumerate(argv) if a == "--agent-option"]
    assert options == ["chunk_size=1024", "wire_dtype=float16"]  # not this checkout's own options


def test_a_baseline_that_fails_says_why(tmp_path: Any) -> None:
    base = _baseline_checkout(tmp_path / "base", 'import sys\nsys.exit("Connection Refused: not authorised.")\n')
    out = compare._run_arm(compare.BEFORE, 7, _args("--baseline", str(base)))
    assert "exit 1" in out["error"] and "not authorised" in out["error"]


def test_the_time_after_the_last_gradient_is_pooled_and_held_against_gloo() -> None:
    fleet = _fleet([60.0, 80.0], 0.2) | {"after_last_gradient_ms": [30.0, 50.0]}
    out = compare.summarize(7, {"gloo": [{"samples_ms": [20.0]}], "edgegrove": [fleet],
                                "before": [_fleet([150.0], 0.3)]})
    eg, before = out["arms"]["edgegrove"], out["arms"]["before"]
    assert eg["after_last_gradient_ms"]["median"] == 40.0 and eg["after_last_gradient_ratio_to_gloo"] == 2.0
    assert "after_last_gradient_ms" not in before  # its agents did not say when
    rows = compare.table_rows({"results": [out]})
    assert rows[1][5:7] == [40.0, 2.0] and rows[2][5:7] == [None, None]
