"""`edgegrove bench loss`: test accuracy after a fixed number of rounds under chunk loss.

The RPS paper's claim: SGD converges when each message is dropped with probability p, if a
worker keeps its own value for what it did not receive. For every fleet size in ``--nodes``
and every p in ``--p``, one real run (mosquitto, one agent process per node, ft-tree,
`edgegrove simulate`) trains ``--rounds`` rounds with every link frame (data, ACK, NACK) lost
end to end with probability p (each agent drops sent and received link frames with
q = 1 - sqrt(1 - p)), then the accuracy of the last evaluation (the full test set, mean over
the agents) is compared with p = 0 at the same round.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from agent.validate import arg, output_dir, positive_seconds
from simulate.bench.accuracy import accuracy_at, agent_options, curve, pct
from simulate.bench.common import add_output_arguments, document, emit, format_table, progress
from simulate.bench.fleetrun import FleetRun, FleetScenario, per_node_loss_for, run_fleet

DESCRIPTION = __doc__
DEFAULT_P = (0.0, 0.05, 0.1, 0.2, 0.3)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, nargs="+", default=[7, 15], help="fleet sizes")
    parser.add_argument("--p", type=float, nargs="+", default=list(DEFAULT_P),
                        help="end-to-end chunk loss probabilities (0 is the reference)")
    parser.add_argument("--rounds", type=int, default=100, help="training rounds of each run")
    parser.add_argument("--lr", type=float, default=0.003, help="Adam learning rate")
    parser.add_argument("--batch", type=int, default=100, help="batch per agent per round")
    parser.add_argument("--eval-every", type=int, default=25, help="rounds between test evaluations")
    parser.add_argument("--agent-option", action="append", default=[], metavar="KEY=VALUE",
                        help="extra agent option for every run, e.g. round_deadline=1.0 (repeatable)")
    parser.add_argument("--budget", type=arg(positive_seconds), default=900.0,
                        help="wall-clock budget of one run in seconds (interrupted after it)")
    parser.add_argument("--keep", type=arg(output_dir), default=None, help="keep the run directories here")
    add_output_arguments(parser)


def scenario_for(args: argparse.Namespace, nodes: int, p: float) -> FleetScenario:
    agent = {"algorithm": "ft-tree", "lr": args.lr, "batch": args.batch, "optimizer": "adam",
             "eval_every": args.eval_every, "eval_samples": 10000, **agent_options(args.agent_option)}
    return FleetScenario(f"loss-{nodes}-p{p:g}", nodes, args.rounds, agent,
                         per_node_loss=per_node_loss_for(p) if p > 0 else 0.0)


def run_result(nodes: int, p: float, run: FleetRun) -> dict[str, Any]:
    points = curve(run)
    rows = run.rows
    return {
        "nodes": nodes, "p": p, "per_node_drop": round(run.scenario.per_node_loss, 5),
        "rounds": len(rows), "finished": run.finished, "error": run.error,
        "final_round": points[-1]["round"] if points else None,
        "final_accuracy": points[-1]["accuracy"] if points else None,
        "curve": points, "wall_seconds": round(run.wall_seconds, 1),
        "round_seconds_median": _median([float(r["round_s_max"]) for r in rows[2:]]),
        "degraded_rounds": sum(1 for r in rows if (r.get("degraded_nodes") or 0) > 0),
        "missing_chunks": sum(int(r.get("missing_chunks") or 0) for r in rows),
        "nacks": sum(int(r.get("nacks") or 0) for r in rows),
        "max_distinct_models": max((int(r.get("distinct_hashes") or 0) for r in rows), default=0),
    }


def _median(values: list[float]) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def add_drops(results: list[dict[str, Any]]) -> None:
    """Each result's accuracy drop (percentage points) from p = 0 of the same fleet size, at
    the reference's last evaluated round."""
    for r in results:
        ref = next((x for x in results if x["nodes"] == r["nodes"] and x["p"] == 0), None)
        r["drop_pp"] = None
        if ref is None or ref["final_accuracy"] is None:
            continue
        acc = accuracy_at(r["curve"], ref["final_round"])
        if acc is not None:
            r["accuracy_at_reference_round"] = acc
            r["drop_pp"] = round(100 * (ref["final_accuracy"] - acc), 3)


def run(args: argparse.Namespace) -> int:
    if any(n < 2 for n in args.nodes) or any(not 0 <= p < 1 for p in args.p) or args.rounds < 1:
        progress("edgegrove bench loss: --nodes >= 2, 0 <= p < 1, --rounds >= 1")
        return 2
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="edgegrove-bench-loss-") as tmp:
        root = args.keep or Path(tmp)
        for nodes in args.nodes:
            for p in sorted(args.p):
                spec = scenario_for(args, nodes, p)
                results.append(run_result(nodes, p, run_fleet(spec, root / spec.name, args.budget)))
                progress(f"  -> {nodes} agents, p={p:g}: accuracy {results[-1]['final_accuracy']}")
    add_drops(results)
    doc = document("loss", rounds=args.rounds, lr=args.lr, batch=args.batch, optimizer="adam",
                   eval_every=args.eval_every, agent_options=agent_options(args.agent_option),
                   results=results,
                   method=("real mosquitto, one agent process per node via `edgegrove simulate`, "
                           "ft-tree; p = end-to-end loss of each link frame (per-agent drop q = "
                           "1 - sqrt(1 - p) on send and on receive)"))
    emit(doc, args, render_table(doc))
    return 1 if any(r["error"] for r in results) else 0


TABLE_HEADERS = ["nodes", "p", "eval round", "accuracy", "drop (pp)", "round s (median)",
                 "degraded rounds", "missing chunks", "NACKs", "max distinct models"]


def table_rows(doc: dict[str, Any]) -> list[list[Any]]:
    """Accuracy at the p = 0 run's last evaluated round (where there is one), as the drop."""
    return [[r["nodes"], r["p"], *_compared(r, doc["results"]), r.get("drop_pp"),
             r["round_seconds_median"], r["degraded_rounds"], r["missing_chunks"], r["nacks"],
             r["max_distinct_models"]] for r in doc["results"]]


def _compared(result: dict[str, Any], results: list[dict[str, Any]]) -> tuple[Any, Any]:
    if result.get("accuracy_at_reference_round") is not None:
        ref = next(x for x in results if x["nodes"] == result["nodes"] and x["p"] == 0)
        return ref["final_round"], pct(result["accuracy_at_reference_round"])
    return result["final_round"], pct(result["final_accuracy"])


def render_table(doc: dict[str, Any]) -> str:
    return (f"ft-tree, {doc['rounds']} rounds, Adam lr {doc['lr']}, batch {doc['batch']} per agent\n"
            + format_table(TABLE_HEADERS, table_rows(doc)))
