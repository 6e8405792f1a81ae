"""`edgegrove bench flower`: Flower 1.42 and Edgegrove side by side on this host, alternating.

Flower: a real deployment (Flower's deployment engine: one ``flower-superlink``, N
``flower-supernode`` processes, insecure mode, free ports on 127.0.0.1) running the Flower App
in simulate/bench/flower_app: its ClientApp trains Edgegrove's numpy MLP (agent.model) with our
Adam on the node's MNIST shard (agent.model.data, the same shards as our agents), its ServerApp
runs FedAvg over all N nodes and evaluates the global model on the full test set after every
round. Edgegrove: a real fleet (mosquitto, N agent processes, ft-tree, `edgegrove simulate`)
training the same model on the same shards, evaluated every --eval-every rounds.

Arms alternate (Flower, Edgegrove, Flower, ...) so that a noisy neighbour hits both alike:
per partition a clean run of each to --target, then per fault one run of each:
  client-restart  a client killed (SuperNode and its processes / the agent) mid-round and
                  started again (Flower after --restart-after s, Edgegrove
                  --restart-after-rounds later)
  server-restart  Flower's SuperLink / our coordinator (agent 0) killed and restarted
  link-6mbps      one client's link limited to 6 MB/s each way (user-space proxy, both)
Figures: round time (Flower: from the messages out to the last reply; Edgegrove: the slowest
agent's round), seconds and bytes (sent + received by all clients) from all clients online
to the end of the first round at the target, peak resident memory of each client's process
tree (psutil RSS sampled every second), and each fault's outcome. Progress goes to stderr.

Flower is an optional extra (``peers``), installed by ``scripts/setup.sh --dev`` into
.venv-peers (its pins would downgrade the project's fastapi, starlette, uvicorn and protobuf).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from agent.validate import arg, output_dir, positive_seconds, whole
from simulate.bench.common import add_output_arguments, document, emit, format_table, progress
from simulate.bench.flower_arms import ArmPlan, Fault, run_edgegrove, run_flower
from simulate.bench.flower_deploy import (
    FLWR_VERSION,
    FlowerMissing,
    FlowerSettings,
    find_flower_bin,
)

DESCRIPTION = __doc__
PARTITIONS = ("iid", "label", "dirichlet")
FAULTS = tuple(f.value for f in Fault if f is not Fault.NONE)
# What Flower 1.42 offers for speed, what the bench sets, and why (also in the JSON and in
# docs/EVALUATION.md). Found in Flower's docs and code.
TUNING = [
    {"setting": "SuperNode/SuperLink --isolation", "options": "subprocess (default) | process",
     "used": "subprocess",
     "why": "process only means an externally started flwr-clientapp/flower-superexec; the "
            "ClientApp is still a new process per message either way"},
    {"setting": "long-running ClientApp", "options": "none for ClientApps",
     "used": "-", "why": "Flower 1.42's warm executor pools exist only for agent/model/"
            "connector tasks under the Kubernetes executor; a ClientApp is started per round"},
    {"setting": "FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "options": "0.01-60 s, stock 1.0 s",
     "used": "--superexec-poll (0.1 s)", "why": "how often each SuperExec asks for a task to start"},
    {"setting": "ServerApp reply polling", "options": "Grid.send_and_receive sleeps 3 s",
     "used": "--server-poll (0.1 s)", "why": "our ServerApp pushes and pulls through the public "
            "Grid API with this interval instead"},
    {"setting": "SuperNode message polling", "options": "hard-coded 3 s sleep when idle",
     "used": "stock", "why": "not configurable (flwr/supernode/start_client_internal.py)"},
    {"setting": "node heartbeat", "options": "hard-coded 30 s interval",
     "used": "stock", "why": "not configurable; it decides when a dead SuperNode's reply is given up"},
    {"setting": "SuperLink --database", "options": "in memory (default) | file",
     "used": "file", "why": "documented way to keep the SuperLink's state across a restart"},
    {"setting": "numpy threads", "options": "-", "used": "1 (OPENBLAS_NUM_THREADS)",
     "why": "as our agents: N clients share the cores"},
    {"setting": "runtime dependency installation", "options": "on by default (uv sync)",
     "used": "off", "why": "no downloads during a run; the peers venv already has everything"},
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=arg(whole(2, 64, "a number of clients")), default=7,
                        help="clients of each system (Flower SuperNodes, Edgegrove agents)")
    parser.add_argument("--partitions", nargs="+", choices=PARTITIONS, default=["iid"],
                        help="data partitions (iid; label = sorted by label, the agents' non_iid; "
                             "dirichlet is not on the agents yet and is refused)")
    parser.add_argument("--target", type=float, default=0.97, help="test accuracy to reach")
    parser.add_argument("--batch", type=arg(whole(1, 60000, "a batch size")), default=100,
                        help="batch per client per step (both systems)")
    parser.add_argument("--local-steps", type=arg(whole(1, None, "a number of steps")), default=85,
                        help="Flower: local steps per round (85 = one epoch of a 7-client shard)")
    parser.add_argument("--flower-lr", type=float, default=0.001, help="Flower clients' Adam rate")
    parser.add_argument("--flower-rounds", type=arg(whole(1, None, "a number of rounds")), default=20,
                        help="Flower: most rounds of a clean run (it stops at the target)")
    parser.add_argument("--lr", type=float, default=0.003,
                        help="Edgegrove: Adam rate (linear decay to 0.1x; as `bench accuracy`)")
    parser.add_argument("--rounds", type=arg(whole(2, None, "a number of rounds")), default=500,
                        help="Edgegrove: rounds of a clean run (one step each)")
    parser.add_argument("--eval-every", type=arg(whole(1, None, "a number of rounds")), default=25,
                        help="Edgegrove: rounds between test evaluations")
    parser.add_argument("--faults", nargs="*", choices=FAULTS, default=list(FAULTS),
                        help="faults to run on both systems (none: clean runs only)")
    parser.add_argument("--fault-rounds", type=arg(whole(2, None, "a number of rounds")), default=5,
                        help="Flower rounds of a fault run (the fault strikes in round 3)")
    parser.add_argument("--edgegrove-fault-rounds", type=arg(whole(10, None, "a number of rounds")),
                        default=60, help="Edgegrove rounds of a fault run (the fault strikes in round 20)")
    parser.add_argument("--restart-after", type=arg(positive_seconds), default=5.0,
                        help="Flower: seconds from a kill to the restart")
    parser.add_argument("--restart-after-rounds", type=arg(whole(1, None, "a number of rounds")),
                        default=10, help="Edgegrove: rounds from a crash to the restart")
    parser.add_argument("--superexec-poll", type=arg(positive_seconds), default=0.1,
                        help="Flower: FLWR_SUPEREXEC_TASK_POLL_INTERVAL (stock 1.0)")
    parser.add_argument("--server-poll", type=arg(positive_seconds), default=0.1,
                        help="Flower: the ServerApp's reply polling (Grid.send_and_receive: 3.0)")
    parser.add_argument("--peers-venv", type=Path, default=None, metavar="DIR",
                        help=f"virtual environment with flwr=={FLWR_VERSION} (default: "
                             "$EDGEGROVE_PEERS_VENV, .venv-peers, then this interpreter's)")
    parser.add_argument("--budget", type=arg(positive_seconds), default=900.0,
                        help="wall-clock budget of one run in seconds")
    parser.add_argument("--stall", type=arg(positive_seconds), default=180.0,
                        help="give a Flower run that a fault struck up after this many seconds "
                             "without a new round (or three of its earlier rounds, if longer)")
    parser.add_argument("--note", default=None, metavar="TEXT",
                        help="a sentence stored with the figures, e.g. how loaded the host was")
    parser.add_argument("--keep", type=arg(output_dir), default=None,
                        help="keep every run's directory (logs) here (default: a temporary one)")
    add_output_arguments(parser)


def plan_for(args: argparse.Namespace, partition: str) -> ArmPlan:
    return ArmPlan(nodes=args.nodes, partition=partition, target=args.target, batch=args.batch,
                   seed=0, flower_local_steps=args.local_steps, flower_lr=args.flower_lr,
                   flower_rounds=args.flower_rounds, flower_fault_rounds=args.fault_rounds,
                   edgegrove_lr=args.lr, edgegrove_rounds=args.rounds,
                   edgegrove_fault_rounds=args.edgegrove_fault_rounds, eval_every=args.eval_every,
                   flower_fault_round=3, edgegrove_fault_round=20, restart_after_s=args.restart_after,
                   restart_after_rounds=args.restart_after_rounds, budget_s=args.budget,
                   stall_s=args.stall)


def usage_problem(args: argparse.Namespace) -> str | None:
    if "dirichlet" in args.partitions:
        return ("--partitions dirichlet: Dirichlet partitions are not in the agents yet "
                "(agent/model/data.py shards IID or by label); use iid or label")
    if not 0 < args.target <= 1:
        return f"--target must be an accuracy in (0, 1], got {args.target}"
    if args.fault_rounds < 4:
        return f"--fault-rounds must be at least 4 (the fault strikes in round 3), got {args.fault_rounds}"
    if args.edgegrove_fault_rounds <= 20 + args.restart_after_rounds:
        return "--edgegrove-fault-rounds must leave rounds after the restart (20 + --restart-after-rounds)"
    return None


def arms(args: argparse.Namespace) -> list[tuple[str, Fault]]:
    """(partition, fault) of each pair of runs, in the order they alternate."""
    out = [(p, Fault.NONE) for p in args.partitions]
    out += [(args.partitions[0], Fault(f)) for f in args.faults]
    return out


def run(args: argparse.Namespace) -> int:
    problem = usage_problem(args)
    if problem is None:
        try:
            bin_dir = find_flower_bin(args.peers_venv)
        except FlowerMissing as exc:
            problem = str(exc)
    if problem is not None:
        progress(f"edgegrove bench flower: {problem}")
        return 2
    settings = FlowerSettings(superexec_poll_s=args.superexec_poll, server_poll_s=args.server_poll)
    results: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="edgegrove-bench-flower-") as tmp:
        root = args.keep or Path(tmp)
        for i, (partition, fault) in enumerate(arms(args)):
            plan = plan_for(args, partition)
            name = f"{i}-{partition}-{fault.value}"
            progress(f"bench flower: {partition}, fault {fault.value}: Flower ...")
            flower = _guarded(partial(run_flower, plan, fault, root / f"{name}-flower", bin_dir, settings))
            progress(f"bench flower: {partition}, fault {fault.value}: Edgegrove ...")
            edgegrove = _guarded(partial(run_edgegrove, plan, fault, root / f"{name}-edgegrove"))
            results.append({"partition": partition, "fault": fault.value,
                            "flower": flower, "edgegrove": edgegrove})
            if args.out is not None:  # what is measured so far survives an interrupted sitting
                _write(make_doc(args, settings, results, load_before), args.out)
    doc = make_doc(args, settings, results, load_before)
    emit(doc, args, render_table(doc))
    failed = any(r[s].get("error") for r in results for s in ("flower", "edgegrove"))
    return 1 if failed else 0


def _write(doc: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")


def make_doc(args: argparse.Namespace, settings: FlowerSettings, results: list[dict[str, Any]],
             load_before: tuple[float, float, float]) -> dict[str, Any]:
    return document("flower", flwr=FLWR_VERSION, nodes=args.nodes, target=args.target,
                   batch=args.batch, plan=asdict(plan_for(args, args.partitions[0])),
                   flower_settings=asdict(settings), tuning=TUNING, results=results,
                   method=METHOD, host_note=args.note,
                   load_average={"before": [round(v, 1) for v in load_before],
                                 "after": [round(v, 1) for v in os.getloadavg()]},
                   arms_planned=len(arms(args)), arms_done=len(results))


def _guarded(arm: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """One arm's figures, or what went wrong in it: the other arms still run."""
    try:
        return arm()
    except Exception as exc:  # any failure of one run is a figure of that run, not the end
        progress(f"  arm failed: {type(exc).__name__}: {exc}")
        return {"error": f"{type(exc).__name__}: {exc}", "finished": False}


METHOD = (
    "Flower 1.42 deployment engine (one SuperLink, one SuperNode per client, insecure, "
    "127.0.0.1), ClientApp = Edgegrove's numpy MLP + Adam on the client's MNIST shard, "
    "ServerApp = FedAvg over all clients, global model evaluated on the 10,000 test images after "
    "every round; Edgegrove = mosquitto + one agent process per client, ft-tree, one step per "
    "round, evaluated every eval_every rounds. Runs alternate Flower, Edgegrove. Time to target: "
    "from all clients online to the end of the first round at the target. Bytes: sent + "
    "received by all clients (Flower: counted by a TCP proxy in front of each SuperNode; "
    "Edgegrove: the agents' own counters). Memory: peak RSS of each client's process tree "
    "(psutil, 1 s samples)."
)

TABLE_HEADERS = ["partition / fault", "system", "rounds", "round s (median)", "s to target",
                 "MB to target", "RSS MB / client", "final acc", "outcome"]


def outcome(entry: dict[str, Any], fault: str) -> str:
    if entry.get("error"):
        return "error: " + str(entry["error"])[:80]
    parts = [] if entry.get("finished", True) else [
        f"did not end (last round {entry.get('stalled_after_round')}"
        + (f": {entry['gave_up']})" if entry.get("gave_up") else ")")]
    missing = entry.get("rounds_missing_updates") or []
    if fault != Fault.NONE.value:
        parts.append(f"rounds without every update: {len(missing)}")
    if entry.get("all_back_at_round") is not None:
        parts.append(f"all back at round {entry['all_back_at_round']}")
    return "; ".join(parts) or "ok"


def table_rows(doc: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for r in doc["results"]:
        for system in ("flower", "edgegrove"):
            e = r[system]
            ttt = e.get("time_to_target") or {}
            rows.append([f"{r['partition']} / {r['fault']}", system, e.get("rounds"),
                         (e.get("round_s") or {}).get("median"), ttt.get("seconds"),
                         e.get("bytes_to_target_mb"), (e.get("memory") or {}).get("median_mb"),
                         _pct(e.get("final_accuracy")), outcome(e, r["fault"])])
    return rows


def _pct(value: float | None) -> str | None:
    return None if value is None else f"{100 * value:.2f} %"


def render_table(doc: dict[str, Any]) -> str:
    return (f"Flower {doc['flwr']} vs Edgegrove, {doc['nodes']} clients, target "
            f"{100 * doc['target']:.0f} %\n" + format_table(TABLE_HEADERS, table_rows(doc)))
