"""`edgegrove bench allreduce`: allreduce step duration of real fleets on real mosquitto,
beside the thesis's Tables 1 and 2 and the broker's physical bound measured in the same run.

Every cell is one run of `edgegrove simulate` (mosquitto from broker-config/, one agent
process per node, ft-tree, MNIST): ``--rounds`` rounds with the scenario's link cuts active
from round 5 until ``--rounds`` - 7 (the thesis cut links between iterations 5 and 10; a
longer window gives more samples). Scenarios, as the thesis's Figure 12 and the shipped
thesis-*.toml: one fault = link 1-3; two parallel = 1-3 and 2-5 (same height); two serial =
0-1 and 1-3 (consecutive heights). Cuts are made at the broker (dynamic-security revoke) by
default, or agent-side (``--via agent``).

What is measured: per round, the **slowest agent's** ``phase_seconds["allreduce"]`` from
telemetry (from the end of its local gradient to having the averaged result: what one step
of the allreduce costs the fleet; the thesis reports "allreduce step duration"). Median and
p10-p90 over rounds:

  fault-free   rounds 2 .. at-2 and from heal+1 on (rounds 0-1 are start-up)
  fault        rounds at+1 .. heal-2 (the cut in force for the whole round)
  transition   rounds at-1, at, heal-1, heal: the simulator cuts (heals) when the fastest
               agent enters round at (heal), while slower agents may still be in the round
               before; reported apart

The bound: raw mosquitto throughput (bytes in + out per second, one publisher to one
subscriber, one chunk-sized payload; simulate.bench.broker's measurement) taken in this run,
the bytes one fault-free allreduce pushes through the broker (``allreduce_traffic``, and as
measured: the agents' telemetry bytes sent + received per round), and the ratio of the
measured step to bytes / throughput. Also fault-free step time with float16 and int8 wire
formats (agent option wire_dtype).

Fixed-timeout cells run with ``remember_dead_links = false``, so every round with the cut
detects it again, as in the thesis's measurement. Adaptive cells run as agents do by
default: a dead link is remembered after the round that found it, so their fault rounds
show the steady cost of a permanent cut, and the detection lands in the transition rounds.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from agent.protocol import wire
from agent.validate import arg, input_file, output_dir, positive_seconds, whole
from simulate.bench.broker import (
    CHUNK_FRAME_BYTES,
    Case,
    allreduce_traffic,
    bound_seconds,
    measure_case,
    messages_per_repeat,
    running_broker,
)
from simulate.bench.common import (
    add_output_arguments,
    document,
    emit,
    format_table,
    machine_info,
    progress,
    summary,
)
from simulate.bench.fleetrun import FleetRun, FleetScenario, LinkCut, run_fleet
from simulate.thesis import THESIS_STEP_S

DESCRIPTION = __doc__
SCENARIOS: dict[str, tuple[LinkCut, ...]] = {
    "no_faults": (),
    "one_fault": (LinkCut(1, 3),),
    "two_parallel": (LinkCut(1, 3), LinkCut(2, 5)),
    "two_serial": (LinkCut(0, 1), LinkCut(1, 3)),
}
THESIS_INDEX = {"no_faults": 0, "one_fault": 1, "two_parallel": 2, "two_serial": 3}
FAULT_AT = 5
TAIL_ROUNDS = 7  # fault-free rounds after the heal
WARMUP_ROUNDS = 2
DTYPES = wire.WIRE_DTYPES


def thesis_seconds(timeout: float | None, nodes: int, scenario: str) -> float | None:
    """The thesis's figure for this cell (Tables 1 and 2), None where it has none."""
    table = THESIS_STEP_S.get(timeout) if timeout is not None else None
    if table is None and scenario == "no_faults":
        table = THESIS_STEP_S[0.5]  # its fault-free figure does not depend on the timeout
    row = table.get(nodes) if table else None
    return None if row is None else row[THESIS_INDEX[scenario]]


# ---------------------------------------------------------------------------------------
# From a run's rows to figures
# ---------------------------------------------------------------------------------------

def split_rounds(rows: list[dict[str, Any]], fault_at: int | None, heal: int | None
                 ) -> dict[str, list[float]]:
    """Slowest agent's allreduce seconds per round, split into fault-free, fault and
    transition rounds (the rounds in which a cut is made or healed)."""
    parts: dict[str, list[float]] = {"fault_free": [], "fault": [], "transition": []}
    for row in rows:
        rnd, seconds = int(row["round"]), row.get("allreduce_s_max")
        if seconds is None or rnd < WARMUP_ROUNDS:
            continue
        if fault_at is None or heal is None:
            parts["fault_free"].append(float(seconds))
        elif rnd in transition_rounds(fault_at, heal):
            parts["transition"].append(float(seconds))
        elif fault_at < rnd < heal:
            parts["fault"].append(float(seconds))
        else:
            parts["fault_free"].append(float(seconds))
    return parts


def transition_rounds(fault_at: int, heal: int) -> set[int]:
    """Rounds a cut or heal can land in: the simulator acts when the FASTEST agent enters
    round ``fault_at`` (``heal``), while slower agents are still in the round before."""
    return {fault_at - 1, fault_at, heal - 1, heal}


def maybe_summary(values: list[float]) -> dict[str, float] | None:
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in summary(values).items()} if values else None


def measured_bytes(rows: list[dict[str, Any]], fault_at: int | None, heal: int | None) -> dict[str, float] | None:
    """Median link bytes per fault-free round from telemetry: sent (into the broker) and
    received (out of it), summed over the agents."""
    clean = [r for r in rows if int(r["round"]) >= WARMUP_ROUNDS
             and (fault_at is None or heal is None or not fault_at - 1 <= int(r["round"]) <= heal)]
    if not clean:
        return None
    sent = sorted(float(r.get("bytes_sent") or 0) for r in clean)
    received = sorted(float(r.get("bytes_received") or 0) for r in clean)
    mid = len(clean) // 2
    return {"ingress": sent[mid], "egress": received[mid], "total": sent[mid] + received[mid]}


def cell(run: FleetRun, scenario: str, timeout_label: str, timeout: float | None, dtype: str) -> dict[str, Any]:
    """One result row: a run's step-time figures beside the thesis's."""
    spec = run.scenario
    has_fault = bool(spec.cuts)
    parts = split_rounds(run.rows, spec.fault_at if has_fault else None, spec.fault_heal if has_fault else None)
    free, fault = maybe_summary(parts["fault_free"]), maybe_summary(parts["fault"])
    step = fault if has_fault else free
    extra = None
    if has_fault and free and fault:
        extra = round(fault["median"] - free["median"], 4)
    return {
        "nodes": spec.nodes, "scenario": scenario, "timeout": timeout_label, "wire_dtype": dtype,
        "rounds": len(run.rows), "finished": run.finished, "error": run.error,
        "wall_seconds": round(run.wall_seconds, 1),
        "step_s": step, "fault_free_s": free, "transition_s": maybe_summary(parts["transition"]),
        "extra_s": extra,
        "extra_in_timeouts": None if extra is None or timeout is None else round(extra / timeout, 2),
        "thesis_s": thesis_seconds(timeout, spec.nodes, scenario) if dtype == "float32" else None,
        "degraded_rounds": sum(1 for r in run.rows if (r.get("degraded_nodes") or 0) > 0),
        "bytes": measured_bytes(run.rows, spec.fault_at if has_fault else None,
                                spec.fault_heal if has_fault else None),
    }


def bound_rows(results: list[dict[str, Any]], throughput: float | None) -> list[dict[str, Any]]:
    """Per fault-free run: bytes per allreduce (model and measured), bound, measured/bound."""
    rows = []
    for r in results:
        if r["scenario"] != "no_faults" or r["step_s"] is None:
            continue
        traffic = allreduce_traffic(r["nodes"], dtype=DTYPES[r["wire_dtype"]])
        measured = r["bytes"]
        row: dict[str, Any] = {"nodes": r["nodes"], "wire_dtype": r["wire_dtype"],
                               "model_bytes": traffic.total_bytes,
                               "measured_bytes": None if measured is None else int(measured["total"]),
                               "step_s": r["step_s"]["median"]}
        if measured:
            row["bytes_measured_over_model"] = round(measured["total"] / traffic.total_bytes, 3)
        row_throughput = r["broker_mb_s"] * 1e6 if r.get("broker_mb_s") else throughput
        row["throughput_mb_s"] = None if not row_throughput else round(row_throughput / 1e6, 1)
        if row_throughput:
            bound = bound_seconds(traffic.total_bytes, row_throughput)
            row["bound_s"] = round(bound, 5)
            row["step_over_bound"] = round(r["step_s"]["median"] / bound, 2)
            if measured:
                row["bound_measured_bytes_s"] = round(bound_seconds(measured["total"], row_throughput), 5)
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------

def plan(args: argparse.Namespace) -> list[tuple[int, str, str, float | None, str]]:
    """(nodes, scenario, timeout label, fixed timeout or None, wire dtype) of every run."""
    cells: list[tuple[int, str, str, float | None, str]] = []
    timeouts: list[tuple[str, float | None]] = [(f"fixed {t:g} s", t) for t in args.timeouts]
    if args.adaptive:
        timeouts.append(("adaptive", None))
    for nodes in args.nodes:
        cells.append((nodes, "no_faults", "adaptive", None, "float32"))
        if nodes > args.faults_up_to:
            continue
        cells += [(nodes, "no_faults", "adaptive", None, d) for d in args.wire_dtypes if d != "float32"]
        cells += [(nodes, s, label, t, "float32") for s in args.scenarios if s != "no_faults"
                  for label, t in timeouts]
    return cells


def scenario_for(args: argparse.Namespace, nodes: int, scenario: str, timeout: float | None,
                 dtype: str) -> FleetScenario:
    agent: dict[str, Any] = {"algorithm": "ft-tree", "eval_every": 0, "wire_dtype": dtype}
    agent |= {"timeout_mode": "fixed", "timeout": timeout} if timeout is not None else {"timeout_mode": "adaptive"}
    # a round must be allowed to outlast two serial recoveries (about 2 x 2.9 T in the thesis)
    agent["round_deadline"] = max(5.0, 8 * (timeout or 0.5))
    # Fixed T reproduces the thesis's tables: each round with the cut pays its detection again.
    # Adaptive runs as agents run by default: a dead link is remembered after its first round.
    agent["remember_dead_links"] = timeout is None
    cuts = SCENARIOS[scenario]
    name = f"ar-{nodes}-{scenario}-{'adaptive' if timeout is None else f'T{timeout:g}'}-{dtype}"
    return FleetScenario(name, nodes, args.rounds, agent, cuts, FAULT_AT,
                         args.rounds - TAIL_ROUNDS if cuts else None, args.via)


def broker_throughput(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """simulate.bench.broker's measurement, one chunk frame, one-to-one, mosquitto."""
    case = Case("mosquitto", CHUNK_FRAME_BYTES, 1, messages_per_repeat(CHUNK_FRAME_BYTES, args.broker_megabytes),
                args.broker_repeats, 1)
    progress(f"bench allreduce: raw mosquitto throughput ({case.messages} x {CHUNK_FRAME_BYTES} B, "
             f"{case.repeats} repeats)")
    try:
        with running_broker("mosquitto", workdir / "throughput") as endpoint:
            return measure_case(case, endpoint, 120.0)
    except Exception as exc:  # a bound we could not measure is reported, not fatal
        return {"error": f"{type(exc).__name__}: {exc}"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, nargs="+", default=[7, 15, 31, 63], help="fleet sizes")
    parser.add_argument("--rounds", type=int, default=24,
                        help="rounds per run; cuts are in force from round 5 to rounds-7")
    parser.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument("--timeouts", type=float, nargs="*", default=[0.5, 1.0],
                        help="fixed link timeouts (s) to measure (thesis: 0.5 and 1)")
    parser.add_argument("--no-adaptive", dest="adaptive", action="store_false",
                        help="skip the adaptive-timeout runs")
    parser.add_argument("--faults-up-to", type=int, default=15,
                        help="fleets larger than this run only fault-free (2 cores cannot host "
                             "31 or 63 agents fast enough for the fault matrix)")
    parser.add_argument("--wire-dtypes", nargs="*", choices=list(DTYPES), default=["float16", "int8"],
                        help="extra fault-free runs with these wire formats")
    parser.add_argument("--via", choices=["broker", "agent"], default="broker",
                        help="cut links at the broker (dynamic security) or in the agents")
    parser.add_argument("--budget", type=arg(positive_seconds), default=300.0,
                        help="wall-clock budget of one run in seconds (then it is interrupted)")
    parser.add_argument("--broker-megabytes", type=float, default=32.0,
                        help="payload per throughput repeat (MB)")
    parser.add_argument("--broker-repeats", type=arg(whole(1, None, "a number of repeats")), default=5, help="throughput repeats")
    parser.add_argument("--keep", type=arg(output_dir), default=None, help="keep the run directories here")
    parser.add_argument("--merge", type=arg(input_file), default=None, metavar="JSON",
                        help="start from the results of an earlier run's JSON; cells measured now "
                             "replace the same cells there (each cell keeps its own throughput and date)")
    add_output_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if args.rounds < FAULT_AT + TAIL_ROUNDS + 2 or any(n < 7 for n in args.nodes):
        progress(f"edgegrove bench allreduce: --rounds must be >= {FAULT_AT + TAIL_ROUNDS + 2} "
                 "and --nodes >= 7 (the scenarios cut links 0-1, 1-3, 2-5)")
        return 2
    results = earlier_results(args.merge)
    with tempfile.TemporaryDirectory(prefix="edgegrove-bench-allreduce-") as tmp:
        root = args.keep or Path(tmp)
        raw = broker_throughput(args, root)
        mb_s = raw["broker_mb_s"]["median"] if "broker_mb_s" in raw else None
        started = machine_info()["date"]
        for nodes, scenario, label, timeout, dtype in plan(args):
            spec = scenario_for(args, nodes, scenario, timeout, dtype)
            fleet_run = run_fleet(spec, root / spec.name, args.budget)
            new = {**cell(fleet_run, scenario, label, timeout, dtype), "broker_mb_s": mb_s,
                   "measured": started}
            results = [r for r in results if cell_key(r) != cell_key(new)] + [new]
            step = results[-1]["step_s"]
            progress(f"  -> {nodes} {scenario} {label} {dtype}: "
                     f"{'-' if step is None else step['median']} s")
            if args.out is not None:  # partial results survive an interrupted bench
                write_json(args.out, make_document(args, raw, results))
    doc = make_document(args, raw, results)
    emit(doc, args, render_table(doc))
    return 0 if results and all(r["step_s"] for r in results) else 1


def cell_key(result: dict[str, Any]) -> tuple[Any, ...]:
    return (result["nodes"], result["scenario"], result["timeout"], result["wire_dtype"])


def cell_order(result: dict[str, Any]) -> tuple[Any, ...]:
    """Table order: fleet size, scenario as in the thesis, wire format, timeout."""
    order = list(SCENARIOS)
    scenario = order.index(result["scenario"]) if result["scenario"] in order else len(order)
    return (result["nodes"], scenario, list(DTYPES).index(result["wire_dtype"]), result["timeout"])


def earlier_results(path: Path | None) -> list[dict[str, Any]]:
    """Cells of an earlier JSON (``--merge``), each stamped with its pass's throughput."""
    if path is None:
        return []
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        progress(f"bench allreduce: --merge {path}: cannot read it ({exc}); starting empty")
        return []
    mb_s, date = doc.get("throughput_mb_s"), doc.get("machine", {}).get("date")
    return [{"broker_mb_s": mb_s, "measured": date, **r} for r in doc.get("results", [])]


def make_document(args: argparse.Namespace, raw: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any]:
    throughput = raw["broker_mb_s"]["median"] * 1e6 if "broker_mb_s" in raw else None
    return document("allreduce", rounds=args.rounds, fault_window=[FAULT_AT, args.rounds - TAIL_ROUNDS],
                    via=args.via, measure="slowest agent's telemetry phase_seconds['allreduce'] per round",
                    broker_throughput=raw,
                    throughput_mb_s=None if throughput is None else round(throughput / 1e6, 1),
                    results=sorted(results, key=cell_order), bound=bound_rows(sorted(results, key=cell_order), throughput))


def write_json(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")


# ---------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------

STEP_HEADERS = ["nodes", "scenario", "timeout", "wire", "median s", "p10-p90 s", "fault-free s",
                "extra s", "extra / T", "transition max s", "thesis s", "rounds", "degraded"]
BOUND_HEADERS = ["nodes", "wire", "bytes/allreduce (model)", "measured (telemetry)", "measured/model",
                 "broker MB/s", "bound s", "step s", "step/bound"]


def _spread(s: dict[str, Any] | None) -> str:
    return "-" if not s else f"{s['p10']:.3f}-{s['p90']:.3f}"


def step_rows(doc: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for r in doc["results"]:
        step, free = r.get("step_s"), r.get("fault_free_s")
        rows.append([r["nodes"], r["scenario"], r["timeout"], r["wire_dtype"],
                     None if not step else step["median"], _spread(step),
                     None if not free else free["median"], r.get("extra_s"), r.get("extra_in_timeouts"),
                     (r.get("transition_s") or {}).get("max"), r.get("thesis_s"), r["rounds"],
                     r["degraded_rounds"]])
    return rows


def bound_table_rows(doc: dict[str, Any]) -> list[list[Any]]:
    return [[b["nodes"], b["wire_dtype"], b["model_bytes"], b.get("measured_bytes"),
             b.get("bytes_measured_over_model"), b.get("throughput_mb_s"), b.get("bound_s"), b["step_s"],
             b.get("step_over_bound")]
            for b in doc.get("bound", [])]


def render_table(doc: dict[str, Any]) -> str:
    text = format_table(STEP_HEADERS, step_rows(doc))
    unfinished = [f"{r['nodes']} {r['scenario']} {r['timeout']} {r['wire_dtype']}: "
                  f"{'over budget' if not r['finished'] else ''} {r.get('error') or ''}".strip()
                  for r in doc["results"] if not r.get("finished", True) or r.get("error")]
    if unfinished:
        text += "\n\nincomplete runs:\n  " + "\n  ".join(unfinished)
    text += (f"\n\nraw mosquitto throughput in this run: {doc.get('throughput_mb_s')} MB/s "
             "(in + out, one chunk frame, one-to-one)\n")
    text += format_table(BOUND_HEADERS, bound_table_rows(doc))
    return text
