"""Where a fault-free round's time goes: a real fleet on real mosquitto, measured in one run.

Per round (from the agents' telemetry): the slowest and the median agent's allreduce phase,
the fleet's collective time after its last gradient (from the last agent's gradient to the last
agent's result: what a barrier-then-allreduce bench such as gloo's times; an agent's own phase
also holds its wait for the others' gradients), gradient compute, and the round period (time between the root's consecutive reports, the
fleet's real step rate). Per process (psutil, over the measured rounds only): CPU seconds per
round of every agent and of mosquitto, so the figure can be held against what 2 cores give.
Optionally each agent runs under ``py-spy record`` (collapsed stacks, one file per agent).

Run: ``python -m simulate.bench.round_profile --nodes 7 --rounds 40`` (``--json`` for one
JSON document; ``--py-spy DIR`` for stacks; ``--env OPENBLAS_NUM_THREADS=1`` to compare).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psutil

from agent.protocol.messages import Telemetry
from agent.protocol.topics import Topics
from agent.validate import (
    EXIT_USAGE,
    UsageError,
    arg,
    input_file,
    output_dir,
    positive_seconds,
    whole,
)
from simulate.bench.broker import allreduce_traffic, bound_seconds, throughput_from
from simulate.bench.common import (
    RESULTS_DIR,
    add_output_arguments,
    document,
    emit,
    format_table,
    progress,
)
from simulate.brokers import start_mosquitto
from simulate.fleet import AgentSpec, Fleet
from simulate.report import after_last_gradient
from simulate.telemetry import Collector, EventLog, FleetWatch

JOB = "bench-round"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=arg(whole(2, 256, "a fleet size")), nargs="+", default=[7],
                        help="fleet sizes to measure")
    parser.add_argument("--rounds", type=arg(whole(1, None, "a number of rounds")), default=40,
                        help="rounds per fleet")
    parser.add_argument("--warmup", type=arg(whole(0, None, "a number of rounds")), default=5, help="first rounds left out of the figures")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="environment for the agents (repeatable), e.g. OPENBLAS_NUM_THREADS=1")
    parser.add_argument("--agent-option", action="append", default=[], metavar="NAME=VALUE",
                        help="extra agent option (repeatable), e.g. chunk_size=32768")
    parser.add_argument("--py-spy", type=arg(output_dir), default=None, metavar="DIR",
                        help="run each agent under `py-spy record` and write collapsed stacks to DIR")
    parser.add_argument("--py-spy-rate", type=arg(whole(1, 10000, "a sampling rate")), default=250, help="py-spy samples per second")
    parser.add_argument("--broker-json", type=arg(input_file), default=RESULTS_DIR / "broker.json",
                        help="`bench broker` document giving the measured throughput for the bound")
    parser.add_argument("--timeout", type=arg(positive_seconds), default=600.0, help="give up after this many seconds")
    add_output_arguments(parser)


class _AllTelemetry(FleetWatch):
    """FleetWatch that keeps every report (the base keeps only the latest per node)."""

    def __init__(self) -> None:
        super().__init__()
        self.reports: list[Telemetry] = []

    def on_telemetry(self, tel: Telemetry) -> None:
        with self.cond:
            self.reports.append(tel)
        super().on_telemetry(tel)


def _pairs(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"expected NAME=VALUE, got {item!r}")
        out[name] = value
    return out


def _cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """User and system CPU seconds so far of each process and its children (py-spy wraps):
    keys ``<name>`` (user + system) and ``<name>:sys``."""
    out: dict[str, float] = {}
    for name, pid in pids.items():
        try:
            proc = psutil.Process(pid)
            times = [p.cpu_times() for p in (proc, *proc.children(recursive=True))]
            out[name] = sum(t.user + t.system for t in times)
            out[f"{name}:sys"] = sum(t.system for t in times)
        except psutil.Error:
            out[name] = out[f"{name}:sys"] = float("nan")
    return out


def measure_fleet(nodes: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    env_extra = _pairs(args.env)
    options: dict[str, Any] = {"job": JOB, "fleet_size": nodes, "rounds": args.rounds,
                               "eval_every": 0, **_pairs(args.agent_option)}
    with ExitStack() as stack:
        broker = stack.enter_context(start_mosquitto(work / "broker", job=JOB, nodes=nodes))
        options["credentials"] = str(broker.credentials_path)
        creds = broker.dashboard_credentials
        watch = _AllTelemetry()
        collector = Collector(broker.url, Topics(JOB), EventLog(None), watch, creds.username, creds.password)
        collector.start()
        stack.callback(collector.stop)
        specs = [AgentSpec(n, broker.url, options, work / f"ckpt-{n}", work / f"agent-{n}.log",
                           prefix=_py_spy_prefix(args, nodes, n)) for n in range(nodes)]
        fleet = Fleet(specs, env={**os.environ, **env_extra})
        fleet.start_all()
        stack.callback(fleet.stop_all)
        pids = {f"agent-{n}": a.pid for n, a in fleet.agents.items() if a.pid is not None}
        if broker.pid is not None:
            pids["mosquitto"] = broker.pid
        every = range(nodes)
        reached = lambda r: lambda: all(watch.last_round.get(n, -1) >= r for n in every)  # noqa: E731
        warm = reached(args.warmup - 1)
        # _wait_done: agents that all exit early (e.g. refused by the broker) end the wait at once.
        if not _wait_done(watch, fleet, warm, args.timeout) or not warm():
            raise SystemExit(f"the fleet of {nodes} did not finish its warm-up rounds in time "
                             f"(or its agents exited: see {work}/agent-*.log)")
        cpu0, t0 = _cpu_seconds(pids), time.monotonic()
        if not _wait_done(watch, fleet, reached(args.rounds - 1), args.timeout):
            raise SystemExit(f"the fleet of {nodes} did not finish {args.rounds} rounds in time")
        cpu1, t1 = _cpu_seconds(pids), time.monotonic()
        if args.py_spy is not None:
            _wait_exited(fleet, 60.0)
    return _summarize(nodes, args, watch.reports, cpu0, cpu1, t1 - t0)


def _wait_done(watch: FleetWatch, fleet: Fleet, reached: Any, timeout: float) -> bool:
    """Every agent reported the last round, or every agent has exited (one that skipped the
    last round's report, e.g. by installing the fleet's state, would otherwise be waited for
    until the timeout). Exits send no telemetry, so the wait polls."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if watch.wait_for(reached, 1.0) or not fleet.running_nodes():
            return True
    return False


def _py_spy_prefix(args: argparse.Namespace, nodes: int, node: int) -> tuple[str, ...]:
    if args.py_spy is None:
        return ()
    binary = shutil.which("py-spy")
    if binary is None:
        raise SystemExit("py-spy is not installed: pip install py-spy")
    args.py_spy.mkdir(parents=True, exist_ok=True)
    out = args.py_spy / f"n{nodes}-agent-{node}.txt"
    return (binary, "record", "--format", "raw", "--threads", "--rate", str(args.py_spy_rate),
            "--output", str(out), "--")


def _wait_exited(fleet: Fleet, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while fleet.running_nodes() and time.monotonic() < deadline:
        time.sleep(0.2)


def _summarize(nodes: int, args: argparse.Namespace, reports: list[Telemetry],
               cpu0: dict[str, float], cpu1: dict[str, float], seconds: float) -> dict[str, Any]:
    by_round: dict[int, list[Telemetry]] = {}
    for tel in reports:
        by_round.setdefault(tel.round, []).append(tel)
    measured = [r for r in sorted(by_round) if args.warmup <= r < args.rounds and len(by_round[r]) == nodes]
    per_round = []
    for r in measured:
        tels = by_round[r]
        ar = [t.phase_seconds["allreduce"] for t in tels]
        comp = [t.phase_seconds["compute"] for t in tels]
        after = after_last_gradient([(t.reduced_at, t.phase_seconds["allreduce"]) for t in tels])
        per_round.append({"round": r, "allreduce_max": max(ar), "allreduce_median": statistics.median(ar),
                          "after_last_gradient": after,
                          "compute_max": max(comp), "compute_median": statistics.median(comp),
                          "degraded": any(t.degraded for t in tels)})
    root_times = sorted((t.round, t.wall_time) for t in reports if t.node == 0 and t.round in measured)
    periods = [b[1] - a[1] for a, b in itertools.pairwise(root_times) if b[0] == a[0] + 1]
    rounds_measured = max(1, args.rounds - args.warmup)
    cpu = {k: round((cpu1[k] - cpu0[k]) / rounds_measured, 4) for k in cpu0}
    agents_cpu = sum(v for k, v in cpu.items() if k.startswith("agent-") and ":" not in k)
    agents_sys = sum(v for k, v in cpu.items() if k.startswith("agent-") and k.endswith(":sys"))
    traffic = allreduce_traffic(nodes)
    throughput = throughput_from(json.loads(args.broker_json.read_text()))

    def med(key: str) -> float:
        values: list[float] = [v for p in per_round if (v := p[key]) is not None]
        return round(statistics.median(values), 4) if values else float("nan")

    return {
        "nodes": nodes, "rounds_measured": len(per_round),
        "degraded_rounds": sum(p["degraded"] for p in per_round),
        "allreduce_s_max_median": med("allreduce_max"),
        "allreduce_s_median_median": med("allreduce_median"),
        "after_last_gradient_s_median": med("after_last_gradient"),
        "compute_s_max_median": med("compute_max"),
        "compute_s_median_median": med("compute_median"),
        "round_period_s_median": round(statistics.median(periods), 4) if periods else None,
        "cpu_s_per_round": cpu, "cpu_s_per_round_agents": round(agents_cpu, 4),
        "cpu_s_per_round_agents_sys": round(agents_sys, 4),
        "cpu_s_per_round_total": round(sum(v for k, v in cpu.items() if ":" not in k), 4),
        "wall_s_per_round": round(seconds / rounds_measured, 4),
        "broker_bytes_per_round": traffic.total_bytes,
        "bound_s": round(bound_seconds(traffic.total_bytes, throughput), 4),
        "throughput_mb_s": round(throughput / 1e6, 1),
        "per_round": per_round,
    }


def run(args: argparse.Namespace) -> int:
    try:  # the default is not parsed by argparse: check it here, before any fleet runs
        input_file(args.broker_json)
    except UsageError as exc:
        progress(f"edgegrove bench round-profile: --broker-json: {exc} (run `edgegrove bench broker --out` first)")
        return EXIT_USAGE
    if args.warmup >= args.rounds:
        progress("edgegrove bench round-profile: --warmup must be smaller than --rounds")
        return EXIT_USAGE
    results = []
    for nodes in args.nodes:
        progress(f"round profile: {nodes} agents, {args.rounds} rounds ({args.warmup} warm-up)")
        with tempfile.TemporaryDirectory(prefix="edgegrove-round-profile-") as tmp:
            results.append(measure_fleet(nodes, args, Path(tmp)))
    doc = document("round_profile", env=_pairs(args.env), agent_options=_pairs(args.agent_option),
                   results=results)
    headers = ["nodes", "allreduce max", "allreduce med", "after last gradient", "compute max", "period", "bound",
               "ratio", "agents cpu/round", "mosquitto cpu/round", "wall/round"]
    rows = [[r["nodes"], r["allreduce_s_max_median"], r["allreduce_s_median_median"],
             r["after_last_gradient_s_median"], r["compute_s_max_median"], r["round_period_s_median"], r["bound_s"],
             round(r["allreduce_s_max_median"] / r["bound_s"], 2), r["cpu_s_per_round_agents"],
             r["cpu_s_per_round"].get("mosquitto"), r["wall_s_per_round"]] for r in results]
    emit(doc, args, format_table(headers, rows) + "\n(seconds; medians over rounds)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="round_profile", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
