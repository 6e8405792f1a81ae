"""`edgegrove bench compare`: gloo and edgegrove side by side, interleaved, in one run.

For every fleet size N and every alternation: torch.distributed gloo averages the thesis
model's 407,050-float32 vector among N local processes (``bench gloo``'s measurement), then
N real agents on a real mosquitto run fault-free ft-tree rounds (``bench round-profile``'s
measurement: per round the SLOWEST agent's allreduce phase, the step ``bench allreduce``
reports; and the fleet's collective time after its last gradient, from the moment the last
agent had its gradient to the moment the last had the result, which is what gloo's
barrier-then-allreduce times), then any extra arms (float16 on the wire, the code of another
checkout: its own `bench round-profile`, broker set-up and agents, in a process of its own). Arms
alternate (gloo, edgegrove, ..., gloo, edgegrove, ...) so that a noisy neighbour on the
shared host hits them alike. Figures: medians over all samples of an arm (gloo: iterations,
edgegrove: measured rounds), the ratio edgegrove / gloo, the broker bound (bytes through the
broker / its measured throughput, ``docs/results/broker.json``), degraded rounds and agents'
CPU seconds per round (psutil, user + system, measured rounds only; median over alternations).

torch is optional (the ``compare`` extra): without it the gloo arm is skipped with a message
and the edgegrove arms are still measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from agent.model.mlp import PARAM_COUNT
from agent.validate import (
    EXIT_USAGE,
    UsageError,
    arg,
    input_dir,
    input_file,
    positive_seconds,
    whole,
)
from simulate.bench import gloo, round_profile
from simulate.bench.common import (
    RESULTS_DIR,
    add_output_arguments,
    document,
    emit,
    format_table,
    progress,
    summary,
)

DESCRIPTION = __doc__
GLOO = "gloo"
EDGEGROVE = "edgegrove"
FP16 = "edgegrove-fp16"
BEFORE = "before"
BEFORE_FP16 = "before-fp16"
# A baseline checkout with this file measures its own fleet (see _run_baseline_bench).
BASELINE_BENCH = Path("simulate/bench/round_profile.py")
BASELINE_GRACE_S = 60.0  # on top of --timeout: the baseline's start-up, then its clean-up


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=arg(whole(2, 256, "a fleet size")), nargs="+", default=[7, 15, 31],
                        help="fleet sizes (gloo world sizes)")
    parser.add_argument("--alternations", type=arg(whole(1, None, "a number of alternations")), default=3,
                        help="how many times every arm runs per fleet size, interleaved")
    parser.add_argument("--rounds", type=arg(whole(2, None, "a number of rounds")), default=14,
                        help="edgegrove rounds per run (the first --warmup are left out)")
    parser.add_argument("--warmup", type=arg(whole(0, None, "a number of rounds")), default=4,
                        help="edgegrove rounds left out at the start of every run")
    parser.add_argument("--gloo-iterations", type=arg(whole(1, None, "a number of iterations")), default=20,
                        help="timed gloo allreduces per run")
    parser.add_argument("--fp16-nodes", type=arg(whole(2, 256, "a fleet size")), nargs="*", default=[7],
                        help="fleet sizes that also run an arm with float16 on the wire")
    parser.add_argument("--baseline", type=arg(input_dir), default=None, metavar="DIR",
                        help="also run the agents of the checkout in DIR (PYTHONPATH=DIR) as arm "
                             "'before' (and 'before-fp16' at the --fp16-nodes sizes): before/after "
                             "in one sitting")
    parser.add_argument("--baseline-nodes", type=arg(whole(2, 256, "a fleet size")), nargs="*", default=None,
                        metavar="N", help="fleet sizes that run the --baseline arms (default: every size)")
    parser.add_argument("--agent-option", action="append", default=[], metavar="NAME=VALUE",
                        help="extra agent option for the edgegrove arms (repeatable)")
    parser.add_argument("--own-option", action="append", default=[], metavar="NAME=VALUE",
                        help="extra agent option for this checkout's arms only, not the --baseline "
                             "arms (repeatable): an option the baseline does not know")
    parser.add_argument("--broker-json", type=arg(input_file), default=RESULTS_DIR / "broker.json",
                        help="`bench broker` document giving the measured throughput for the bound")
    parser.add_argument("--timeout", type=arg(positive_seconds), default=600.0,
                        help="give up on one run after this many seconds")
    add_output_arguments(parser)


def _fleet_args(args: argparse.Namespace, env: list[str], options: list[str]) -> argparse.Namespace:
    return argparse.Namespace(rounds=args.rounds, warmup=args.warmup, env=env,
                              agent_option=[*args.agent_option, *options], py_spy=None,
                              py_spy_rate=100, broker_json=args.broker_json, timeout=args.timeout)


def arms_for(nodes: int, args: argparse.Namespace, have_torch: bool) -> list[str]:
    arms = [GLOO] if have_torch else []
    arms.append(EDGEGROVE)
    if nodes in args.fp16_nodes:
        arms.append(FP16)
    if args.baseline is not None and (args.baseline_nodes is None or nodes in args.baseline_nodes):
        arms.append(BEFORE)
        if nodes in args.fp16_nodes:
            arms.append(BEFORE_FP16)
    return arms


def _run_arm(arm: str, nodes: int, args: argparse.Namespace) -> dict[str, Any]:
    if arm == GLOO:
        out = gloo.measure(nodes, PARAM_COUNT, args.gloo_iterations, 3, args.timeout, keep_samples=True)
        if "error" in out:
            return {"error": out["error"]}
        return {"samples_ms": out["samples_ms"]}
    before = arm in (BEFORE, BEFORE_FP16)
    env = [f"PYTHONPATH={args.baseline}"] if before else []
    options = ["wire_dtype=float16"] if arm in (FP16, BEFORE_FP16) else []
    if not before:
        options += args.own_option
    elif (args.baseline / BASELINE_BENCH).is_file():
        return _run_baseline_bench(nodes, args, options)
    # `python -m` puts the working directory first on sys.path, before PYTHONPATH: the agents
    # of the baseline arm must start in the baseline checkout, or they run this one's code.
    where = contextlib.chdir(args.baseline) if before else contextlib.nullcontext()
    with tempfile.TemporaryDirectory(prefix="edgegrove-compare-") as tmp, where:
        try:
            res = round_profile.measure_fleet(nodes, _fleet_args(args, env, options), Path(tmp))
        except SystemExit as exc:  # measure_fleet gives up with a message
            return {"error": str(exc)}
    return _arm_figures(res)


def _arm_figures(res: dict[str, Any]) -> dict[str, Any]:
    """One edgegrove run's figures from its round-profile result (a baseline's has no
    ``after_last_gradient``: its agents did not say when their rounds ended)."""
    after = [p.get("after_last_gradient") for p in res["per_round"]]
    return {"samples_ms": [1000 * p["allreduce_max"] for p in res["per_round"]],
            "after_last_gradient_ms": [1000 * a for a in after if a is not None],
            "degraded_rounds": res["degraded_rounds"], "cpu_agents": res["cpu_s_per_round_agents"],
            "cpu_mosquitto": res["cpu_s_per_round"].get("mosquitto"), "bound_ms": 1000 * res["bound_s"],
            "period_s": res["round_period_s_median"]}


def _run_baseline_bench(nodes: int, args: argparse.Namespace, options: list[str]) -> dict[str, Any]:
    """The baseline checkout measures its own fleet: its round-profile starts its own broker
    (with the credentials and ACL its agents expect; an old checkout's agents are refused by
    this one's broker set-up) and reads its own agents' telemetry. Started in the checkout with
    PYTHONPATH=it, so that every module it imports is its own."""
    command = [sys.executable, "-m", "simulate.bench.round_profile", "--nodes", str(nodes),
               "--rounds", str(args.rounds), "--warmup", str(args.warmup), "--json",
               "--broker-json", str(args.broker_json.resolve()), "--timeout", str(args.timeout)]
    for option in [*args.agent_option, *options]:
        command += ["--agent-option", option]
    env = {**os.environ, "PYTHONPATH": str(args.baseline.resolve())}
    proc = subprocess.Popen(command, cwd=args.baseline, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=args.timeout + BASELINE_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # lets it stop its fleet and broker; then by force
        try:
            proc.communicate(timeout=BASELINE_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        return {"error": f"the baseline's round-profile did not finish within {args.timeout:.0f} s"}
    lines = out.strip().splitlines()
    try:
        res = json.loads(lines[-1])["results"][0] if proc.returncode == 0 and lines else None
    except (ValueError, KeyError, IndexError, TypeError):
        res = None
    if res is None:
        tail = (err.strip().splitlines() or ["no output"])[-1]
        return {"error": f"the baseline's round-profile failed (exit {proc.returncode}): {tail}"}
    return _arm_figures(res)


def measure_size(nodes: int, args: argparse.Namespace, have_torch: bool) -> dict[str, Any]:
    arms = arms_for(nodes, args, have_torch)
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    for i in range(args.alternations):
        for arm in arms:
            progress(f"bench compare: {nodes} nodes, alternation {i + 1}/{args.alternations}, {arm}")
            runs[arm].append(_run_arm(arm, nodes, args))
    return summarize(nodes, runs)


def summarize(nodes: int, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Pool every arm's samples over its alternations; ratios against gloo's median."""
    out: dict[str, Any] = {"nodes": nodes, "arms": {}}
    for arm, parts in runs.items():
        ok = [p for p in parts if "error" not in p]
        samples = [s for p in ok for s in p["samples_ms"]]
        entry: dict[str, Any] = {"runs": len(parts), "errors": [p["error"] for p in parts if "error" in p]}
        if samples:
            entry["ms"] = {k: round(v, 2) if isinstance(v, float) else v for k, v in summary(samples).items()}
            entry["run_medians_ms"] = [round(statistics.median(p["samples_ms"]), 2) for p in ok if p["samples_ms"]]
        after = [s for p in ok for s in p.get("after_last_gradient_ms", [])]
        if after:
            entry["after_last_gradient_ms"] = {k: round(v, 2) if isinstance(v, float) else v
                                               for k, v in summary(after).items()}
        if arm != GLOO and ok:
            entry["degraded_rounds"] = sum(p["degraded_rounds"] for p in ok)
            entry["cpu_s_per_round_agents"] = round(statistics.median(p["cpu_agents"] for p in ok), 4)
            entry["cpu_s_per_round_agents_runs"] = [p["cpu_agents"] for p in ok]
            moz = [p["cpu_mosquitto"] for p in ok if p["cpu_mosquitto"] is not None]
            entry["cpu_s_per_round_mosquitto"] = round(statistics.median(moz), 4) if moz else None
            entry["bound_ms"] = round(ok[0]["bound_ms"], 2)
        out["arms"][arm] = entry
    gloo_ms = out["arms"].get(GLOO, {}).get("ms", {}).get("median")
    for arm, entry in out["arms"].items():
        if arm == GLOO or "ms" not in entry:
            continue
        median = entry["ms"]["median"]
        entry["ratio_to_gloo"] = round(median / gloo_ms, 2) if gloo_ms else None
        entry["ratio_to_bound"] = round(median / entry["bound_ms"], 2) if entry.get("bound_ms") else None
        if "after_last_gradient_ms" in entry:
            after_median = entry["after_last_gradient_ms"]["median"]
            entry["after_last_gradient_ratio_to_gloo"] = round(after_median / gloo_ms, 2) if gloo_ms else None
    return out


def run(args: argparse.Namespace) -> int:
    try:
        input_file(args.broker_json)
    except UsageError as exc:
        progress(f"edgegrove bench compare: --broker-json: {exc} (run `edgegrove bench broker --out` first)")
        return EXIT_USAGE
    if args.warmup >= args.rounds:
        progress("edgegrove bench compare: --warmup must be smaller than --rounds")
        return EXIT_USAGE
    version = gloo.torch_version()
    if version is None:
        progress("edgegrove bench compare: torch is not installed (pip install -e '.[compare]'): "
                 "gloo is skipped, only edgegrove is measured.")
    results = [measure_size(n, args, version is not None) for n in args.nodes]
    doc = document("compare", torch=version, values=PARAM_COUNT, alternations=args.alternations,
                   rounds=args.rounds, warmup=args.warmup, gloo_iterations=args.gloo_iterations,
                   agent_options=args.agent_option, own_options=args.own_option,
                   baseline=str(args.baseline) if args.baseline is not None else None,
                   results=results)
    emit(doc, args, render_table(doc))
    failed = any(e["errors"] for r in results for e in r["arms"].values())
    return 1 if failed else 0


TABLE_HEADERS = ["nodes", "arm", "median ms", "p10 - p90 ms", "x gloo", "after last gradient ms",
                 "after x gloo", "bound ms", "x bound", "agents CPU s/round", "degraded", "samples"]


def table_rows(doc: dict[str, Any]) -> list[list[Any]]:
    rows: list[list[Any]] = []
    for r in doc["results"]:
        for arm, e in r["arms"].items():
            if "ms" not in e:
                rows.append([r["nodes"], arm, "error: " + "; ".join(e["errors"]), "", "", "", "", "", "", "", "", 0])
                continue
            after = e.get("after_last_gradient_ms", {}).get("median")
            rows.append([r["nodes"], arm, e["ms"]["median"], f"{e['ms']['p10']:.1f} - {e['ms']['p90']:.1f}",
                         e.get("ratio_to_gloo"), after, e.get("after_last_gradient_ratio_to_gloo"),
                         e.get("bound_ms"), e.get("ratio_to_bound"),
                         e.get("cpu_s_per_round_agents"), e.get("degraded_rounds"), e["ms"]["n"]])
    return rows


def render_table(doc: dict[str, Any]) -> str:
    return (f"allreduce of {doc['values']} float32 values, fault-free, interleaved x{doc['alternations']}; "
            f"edgegrove: slowest agent per round (and the fleet's time after its last gradient); "
            f"gloo: slowest rank per iteration after a barrier\n"
            + format_table(TABLE_HEADERS, table_rows(doc)))
