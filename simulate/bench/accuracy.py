"""`edgegrove bench accuracy`: MNIST test accuracy and time to accuracy of real fleets.

Each variant is one real run (mosquitto, one agent process per node, `edgegrove simulate`):
``tree``, ``ft-tree``, ``rps`` and the thesis's Figure 13 baselines ``ps-sync``, ``ps-async``
and ``ring`` without faults, and ``ft-tree`` with chunk loss p (default 10 %) on every link
frame. Every agent trains the thesis MLP on its shard with batch
``--batch``; the fleet evaluates the full test set every ``--eval-every`` rounds. The
single-machine baseline is `edgegrove train-local` with the same samples per step (nodes x
batch) and the same optimizer and learning rate, evaluated once per epoch.

Time to accuracy: seconds from the fleet being ready (every agent online) to the end of the
first evaluated round at or above the target (the baseline: its own training time to the
first epoch at or above it). Chunk loss p means each link frame (data, ACK, NACK) is lost
end to end with probability p: every agent drops sent and received link frames with
q = 1 - sqrt(1 - p).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from agent.model.optim import LR_SCHEDULES
from agent.protocol.allreduce import Algorithm
from agent.validate import arg, output_dir, positive_seconds
from simulate.bench.common import add_output_arguments, document, emit, format_table, progress
from simulate.bench.fleetrun import FleetRun, FleetScenario, per_node_loss_for, run_fleet

DESCRIPTION = __doc__
ALGORITHMS = tuple(a.value for a in Algorithm)  # the names, as the command line takes them
# The five of the thesis's Figure 13 (sync and async parameter server, Keras's ring, tree,
# FT-tree), in its order: the figure of accuracy against wall time plots these.
FIGURE_13 = (Algorithm.PS_SYNC, Algorithm.PS_ASYNC, Algorithm.RING, Algorithm.TREE, Algorithm.FT_TREE)
TARGET = 0.98
MAX_DROP_PP = 0.5  # must-show: 10 % loss costs at most 0.5 percentage points


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=7, help="agents in each fleet")
    parser.add_argument("--rounds", type=int, default=600, help="training rounds of each run")
    parser.add_argument("--lr", type=float, default=0.003,
                        help="Adam learning rate (the fleet's effective batch is nodes x batch)")
    parser.add_argument("--lr-schedule", choices=LR_SCHEDULES, default="linear",
                        help="constant, or linear decay to lr x --lr-final at the last round "
                             "(fleets and baseline alike)")
    parser.add_argument("--lr-final", type=float, default=0.1,
                        help="the linear schedule's last rate as a fraction of --lr")
    parser.add_argument("--batch", type=int, default=100, help="batch per agent per round")
    parser.add_argument("--eval-every", type=int, default=50, help="rounds between test evaluations")
    parser.add_argument("--algorithms", nargs="+", choices=ALGORITHMS, default=list(ALGORITHMS),
                        help="algorithms to run without faults")
    parser.add_argument("--loss", type=float, default=0.1,
                        help="chunk loss p of the extra ft-tree run (0 = no such run)")
    parser.add_argument("--target", type=float, default=TARGET, help="accuracy for time-to-accuracy")
    parser.add_argument("--no-baseline", action="store_true", help="skip the single-machine baseline")
    parser.add_argument("--agent-option", action="append", default=[], metavar="KEY=VALUE",
                        help="extra agent option for every run, e.g. round_deadline=1.5 (repeatable)")
    parser.add_argument("--budget", type=arg(positive_seconds), default=1800.0,
                        help="wall-clock budget of one run in seconds (interrupted after it)")
    parser.add_argument("--keep", type=arg(output_dir), default=None,
                        help="keep the run directories here (default: a temporary directory)")
    add_output_arguments(parser)


def variants(args: argparse.Namespace) -> list[tuple[str, str, float]]:
    """(label, algorithm, chunk loss) of each run."""
    out = [(algo, algo, 0.0) for algo in args.algorithms]
    if args.loss > 0:
        # right after the clean ft-tree run: the must-show pair comes first
        at = next((i + 1 for i, v in enumerate(out) if v[1] == Algorithm.FT_TREE), len(out))
        out.insert(at, (f"ft-tree, loss {args.loss:g}", "ft-tree", args.loss))
    return out


def scenario_for(args: argparse.Namespace, label: str, algorithm: str, loss: float) -> FleetScenario:
    agent = {"algorithm": algorithm, "lr": args.lr, "lr_schedule": args.lr_schedule,
             "lr_final": args.lr_final, "batch": args.batch, "optimizer": "adam",
             "eval_every": args.eval_every, "eval_samples": 10000, "timeout_mode": "adaptive",
             **agent_options(args.agent_option)}
    name = label.replace(", ", "-").replace(" ", "")
    return FleetScenario(name, args.nodes, args.rounds, agent,
                         per_node_loss=per_node_loss_for(loss) if loss > 0 else 0.0)


def agent_options(items: list[str]) -> dict[str, Any]:
    """KEY=VALUE pairs as the simulator's --agent-option reads them."""
    from simulate.cli import parse_agent_options

    return parse_agent_options(items)


def curve(run: FleetRun) -> list[dict[str, Any]]:
    """Evaluated rounds: round, mean test accuracy over the agents, seconds since ready."""
    t0 = run.ready_t or 0.0
    points = []
    for row in run.rows:
        if row.get("accuracy") is None:
            continue
        end = run.round_end_t.get(int(row["round"]))
        points.append({"round": int(row["round"]), "accuracy": float(row["accuracy"]),
                       "seconds": None if end is None else round(end - t0, 2)})
    return points


def time_to(points: list[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """The first point at or above ``target`` (None: never reached)."""
    return next(({"round": p["round"], "seconds": p["seconds"]} for p in points
                 if p["accuracy"] >= target), None)


def run_result(label: str, algorithm: str, loss: float, run: FleetRun, target: float) -> dict[str, Any]:
    points = curve(run)
    rows = run.rows
    return {
        "label": label, "algorithm": algorithm, "chunk_loss": loss,
        "per_node_drop": round(run.scenario.per_node_loss, 5),
        "rounds": len(rows), "finished": run.finished, "error": run.error,
        "final_accuracy": points[-1]["accuracy"] if points else None,
        "final_round": points[-1]["round"] if points else None,
        "best_accuracy": max((p["accuracy"] for p in points), default=None),
        "time_to_target": time_to(points, target),
        "wall_seconds": round(run.wall_seconds, 1),
        "degraded_rounds": sum(1 for r in rows if (r.get("degraded_nodes") or 0) > 0),
        "missing_chunks": sum(int(r.get("missing_chunks") or 0) for r in rows),
        "nacks": sum(int(r.get("nacks") or 0) for r in rows),
        "round_seconds_median": _median([float(r["round_s_max"]) for r in rows[2:]]),
        "models_identical_at_end": run.summary.get("models_identical_at_end"),
        "curve": points,
    }


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def baseline(args: argparse.Namespace, epochs: int) -> dict[str, Any]:
    """`edgegrove train-local` with the fleet's samples per step."""
    command = [sys.executable, "-m", "edgegrove.cli", "train-local", "--json", "--batch",
               str(args.nodes * args.batch), "--lr", str(args.lr), "--lr-schedule", args.lr_schedule,
               "--lr-final", str(args.lr_final), "--optimizer", "adam",
               "--epochs", str(epochs), "--target", str(args.target)]
    progress(f"  baseline: {' '.join(command[3:])}")
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"error": f"train-local exited {done.returncode}: {done.stderr.strip()[-400:]}"}
    report: dict[str, Any] = json.loads(done.stdout)
    return {"command": "edgegrove " + " ".join(command[3:]), "report": report}


def baseline_points(base: dict[str, Any], steps_per_epoch: int) -> list[dict[str, Any]]:
    """The baseline's per-epoch history as (round = steps so far, accuracy, seconds)."""
    points = []
    for i, epoch in enumerate(base.get("report", {}).get("history", [])):
        acc = epoch.get("test_accuracy")
        if acc is not None:
            points.append({"round": (i + 1) * steps_per_epoch - 1, "accuracy": float(acc),
                           "seconds": epoch.get("elapsed_s")})
    return points


def must_show(results: list[dict[str, Any]], target: float, loss: float) -> dict[str, Any]:
    """ft-tree >= target without faults; with loss within MAX_DROP_PP at the same rounds."""
    clean = next((r for r in results if r["label"] == Algorithm.FT_TREE), None)
    lossy = next((r for r in results if r["algorithm"] == Algorithm.FT_TREE and r["chunk_loss"] > 0), None)
    out: dict[str, Any] = {"target": target, "max_drop_pp": MAX_DROP_PP, "loss": loss}
    if clean and clean["final_accuracy"] is not None:
        out["ft_tree_accuracy"] = clean["final_accuracy"]
        out["ft_tree_reaches_target"] = clean["final_accuracy"] >= target
    if clean and lossy and clean["final_accuracy"] is not None:
        lossy_acc = accuracy_at(lossy["curve"], clean["final_round"])
        if lossy_acc is not None:
            drop = 100 * (clean["final_accuracy"] - lossy_acc)
            out.update(round=clean["final_round"], lossy_accuracy=lossy_acc, drop_pp=round(drop, 3),
                       loss_within_bound=drop <= MAX_DROP_PP)
    return out


def accuracy_at(points: list[dict[str, Any]], rnd: int | None) -> float | None:
    """The accuracy evaluated at round ``rnd`` exactly (None: not evaluated there)."""
    return next((p["accuracy"] for p in points if p["round"] == rnd), None)


def run(args: argparse.Namespace) -> int:
    if args.nodes < 2 or args.rounds < 1 or args.eval_every < 1 or not 0 <= args.loss < 1:
        progress("edgegrove bench accuracy: --nodes >= 2, --rounds >= 1, --eval-every >= 1, "
                 "0 <= --loss < 1")
        return 2
    results = []
    with tempfile.TemporaryDirectory(prefix="edgegrove-bench-accuracy-") as tmp:
        root = args.keep or Path(tmp)
        for label, algorithm, loss in variants(args):
            fleet_run = run_fleet(scenario_for(args, label, algorithm, loss),
                                  root / label.replace(", ", "-").replace(" ", ""), args.budget)
            results.append(run_result(label, algorithm, loss, fleet_run, args.target))
            progress(f"  {label}: final accuracy {results[-1]['final_accuracy']}")
    steps_per_epoch = 60000 // (args.nodes * args.batch)
    base: dict[str, Any] | None = None
    if not args.no_baseline:
        base = baseline(args, max(1, -(-args.rounds // steps_per_epoch)))
        if "report" in base:
            base["curve"] = baseline_points(base, steps_per_epoch)
            base["time_to_target"] = time_to(base["curve"], args.target)
    doc = document("accuracy", nodes=args.nodes, agent_options=agent_options(args.agent_option), rounds=args.rounds, lr=args.lr,
                   lr_schedule=args.lr_schedule, lr_final=args.lr_final, batch=args.batch,
                   optimizer="adam", eval_every=args.eval_every, target=args.target,
                   samples_per_step=args.nodes * args.batch, results=results, baseline=base,
                   must_show=must_show(results, args.target, args.loss),
                   method=("real mosquitto, one agent process per node via `edgegrove simulate`; "
                           "accuracy = mean over agents of the full 10,000-image test set; "
                           "time = seconds from all agents online to the end of the round"))
    emit(doc, args, render_table(doc))
    return 1 if any(r["error"] for r in results) else 0


def table_rows(doc: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for r in doc["results"]:
        ttt = r.get("time_to_target")
        rows.append([r["label"], r["final_round"], pct(r["final_accuracy"]), pct(r["best_accuracy"]),
                     None if ttt is None else ttt["round"], None if ttt is None else ttt["seconds"],
                     r["round_seconds_median"], r["degraded_rounds"], r["missing_chunks"]])
    base = doc.get("baseline") or {}
    if base.get("curve"):
        ttt = base.get("time_to_target")
        last = base["curve"][-1]
        rows.append([f"single machine (batch {doc['samples_per_step']})", last["round"],
                     pct(last["accuracy"]), pct(max(p["accuracy"] for p in base["curve"])),
                     None if ttt is None else ttt["round"], None if ttt is None else ttt["seconds"],
                     None, None, None])
    return rows


def pct(accuracy: float | None) -> str | None:
    """An accuracy as a percentage with two decimals (0.9798 -> '97.98 %'): 3 significant
    digits would round 97.98 % up to 98 %."""
    return None if accuracy is None else f"{100 * accuracy:.2f} %"


TABLE_HEADERS = ["run", "last eval round", "final acc", "best acc", "rounds to target",
                 "s to target", "round s (median)", "degraded rounds", "missing chunks"]


def render_table(doc: dict[str, Any]) -> str:
    schedule = doc.get("lr_schedule", "constant")
    decay = f" ({schedule} to x{doc.get('lr_final')})" if schedule != "constant" else ""
    text = (f"{doc['nodes']} agents x batch {doc['batch']}, Adam lr {doc['lr']}{decay}, {doc['rounds']} "
            f"rounds, target {doc['target']}\n")
    text += format_table(TABLE_HEADERS, table_rows(doc))
    shown = doc.get("must_show", {})
    text += "\n\nmust show: " + json.dumps(shown)
    return text
