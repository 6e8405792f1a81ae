"""`edgegrove bench silent`: what a silent (frozen) or crashed node costs a real fleet.

For every fleet size in ``--nodes``: one fault-free run, then one run per case on real
mosquitto (`edgegrove simulate`, one agent process per node, default adaptive timeouts):
  hang-<role>   the root, an inner node or a leaf is frozen with SIGSTOP (its connection stays
                open, so no Will comes) for ``--short`` rounds, later for ``--long-seconds``
                (longer than the broker's Will, 1.5 x keepalive), and resumed each time;
  crash-root    the root and coordinator is killed with SIGKILL and restarted from its
                checkpoint;
  flap-inner    an inner node's broker connection drops 10 times in 15 s (its TCP proxy cuts
                it; the agent reconnects), the episode ends at its last Will.
Each hang or crash is one "episode". Per episode, from the agents' own telemetry: the silent
round (the longest survivor's allreduce, plus any wait for the round to start, of the round
the node went silent in, and the next),
the median, the 90th percentile and the worst while it is silent (beside the fault-free run's
90th percentile and worst: its checkpoint and evaluation rounds are slow too), degraded
survivor rounds and distinct survivor model hashes while silent, the rounds until it is back
in the view with the fleet's model hash after the resume/restart (a restarted process's start-
up counts: ~1.5-2 s of Python, data and model on this host) and after the restarted agent was
up (its first "online" status), the rounds while silent over 1.5x the fault-free median beside
the fault-free run's share of such rounds, and the same for "ordinary" rounds only (not a
checkpoint round, not the evaluation's two: those are as slow in the fault-free run), the
worst ordinary round while silent and after, and the median after that; the median of the
same run's ordinary rounds in the 20 rounds before the episode, and the ordinary rounds while
silent over 1.5x that one (the load of a shared host can change between the fault-free run
and this one: then the fault-free run's median compares rounds of two different hosts); per
run, identical models at the end and the final accuracy against the fault-free run.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from agent.validate import arg, output_dir, positive_seconds
from simulate.bench.common import add_output_arguments, document, emit, format_table, progress
from simulate.bench.fleetrun import FleetRun, FleetScenario, run_events, run_fleet

DESCRIPTION = __doc__
FLAP_SECONDS = 15.0  # 10 drops, 1.5 s apart
CASES = ("hang-root", "hang-inner", "hang-leaf", "crash-root", "flap-inner")
EVAL_EVERY = 25  # the agents' test-set evaluation (the default, 10, would make every 10th round slow)
CHECKPOINT_EVERY = 20  # the agents' default


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, nargs="+", default=[7, 15], help="fleet sizes")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES), help="which faults")
    parser.add_argument("--short", type=int, default=5, help="rounds of the short hang")
    parser.add_argument("--long-seconds", type=arg(positive_seconds), default=30.0,
                        help="seconds of the long hang (longer than the Will at the default keepalive 10 s)")
    parser.add_argument("--budget", type=arg(positive_seconds), default=900.0,
                        help="wall-clock budget of one run in seconds (interrupted after it)")
    parser.add_argument("--keep", type=arg(output_dir), default=None, help="keep the run directories here")
    add_output_arguments(parser)


def _role_node(case: str, nodes: int) -> int:
    """Root 0; inner: the root's first child; leaf: the last id (a leaf of the heap tree)."""
    return {"root": 0, "inner": 1, "leaf": nodes - 1}[case.split("-")[1]]


def _scenario(case: str, nodes: int, rounds: int, episodes: list[tuple[int, int]]) -> FleetScenario:
    agent = {"eval_every": EVAL_EVERY, "checkpoint_every": CHECKPOINT_EVERY}
    node = _role_node(case, nodes) if case != "fault-free" else 0
    lines: list[str] = []
    for start, end in episodes:
        if case.startswith("flap"):
            lines += ["", "[[faults]]", 'kind = "flap"', f"node = {node}", "times = 10", "every = 1.5",
                      f"at_round = {start}"]
            continue
        kind, end_field = ("crash", "restart_round") if case.startswith("crash") else ("hang", "resume_round")
        lines += ["", "[[faults]]", f'kind = "{kind}"', f"node = {node}", f"at_round = {start}",
                  f"{end_field} = {end}"]
    return FleetScenario(f"{case}-{nodes}", nodes, rounds, agent,
                         faults_toml="\n".join(lines) + ("\n" if lines else ""))


def _telemetry(records: list[dict[str, Any]]) -> dict[int, dict[int, dict[str, Any]]]:
    """round -> node -> its telemetry record."""
    out: dict[int, dict[int, dict[str, Any]]] = defaultdict(dict)
    for rec in records:
        if rec.get("type") == "telemetry":
            out[int(rec["round"])][int(rec["node"])] = rec
    return out


def _flap_end(records: list[dict[str, Any]], node: int, start: int) -> int:
    """The fleet's round at the node's last Will (the end of its flapping), plus one."""
    wills = [r["t"] for r in records if r.get("type") == "status" and r.get("node") == node
             and r.get("state") == "offline"]
    if not wills:
        return start + 1
    # The drops of the flapping (10 x 1.5 s), not the clean exit at the end of the run.
    wills = [t for t in wills if t <= wills[0] + FLAP_SECONDS + 5.0]
    rounds = [int(r["round"]) for r in records if r.get("type") == "telemetry" and r["t"] <= wills[-1]]
    return max([start, *rounds]) + 1


def _started_round(records: list[dict[str, Any]], node: int, restart: int) -> int | None:
    """The fleet's round when the agent restarted at round ``restart`` was up again (its
    first "online" status after the respawn): a Python process's start-up (~1.5-2 s here, 15-20
    rounds of a 7-agent fleet) is the host's, not the protocol's."""
    spawned = [r["t"] for r in records if r.get("type") == "fault" and r.get("kind") == "crash"
               and r.get("round") == restart]
    if not spawned:
        return None
    online = [r["t"] for r in records if r.get("type") == "status" and r.get("node") == node
              and r.get("state") == "online" and r["t"] >= spawned[0]]
    if not online:
        return None
    rounds = [int(r["round"]) for r in records if r.get("type") == "telemetry" and r["t"] <= online[0]
              and r.get("node") != node]
    return max([restart, *rounds])


def _survivors(tel: dict[int, dict[str, Any]], node: int) -> list[dict[str, Any]]:
    return [t for n, t in tel.items() if n != node]


def _allreduce_max(recs: list[dict[str, Any]]) -> float | None:
    """The slowest agent's allreduce, with the time the round could not start (waiting on a
    dead root's tree for the view without it): that wait is the fault's cost too."""
    values = [float(t.get("phase_seconds", {}).get("allreduce", 0.0))
              + float(t.get("phase_seconds", {}).get("wait", 0.0)) for t in recs]
    return max(values) if values else None


def periodic(round: int) -> bool:
    """A round the host's periodic work slows in any run: the checkpoint written as it starts,
    the test-set evaluation before it (agents evaluate after the round that is a multiple of
    EVAL_EVERY) and the round after that."""
    return round % CHECKPOINT_EVERY == 0 or round % EVAL_EVERY in (0, 1)


def _ordinary_max(times: dict[int, float]) -> float | None:
    """The worst round that is not ``periodic``."""
    values = [v for r, v in times.items() if not periodic(r)]
    return max(values) if values else None


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def _p90(values: list[float]) -> float | None:
    """The 90th percentile: checkpoint and evaluation rounds are slow in a fault-free run too,
    so the worst round alone compares a fault with the host's periodic work."""
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)], 4)


BEFORE_ROUNDS = 20  # rounds before an episode whose median is its own run's fault-free median


def episode_result(tels: dict[int, dict[int, dict[str, Any]]], node: int, start: int, end: int,
                   last: int, started: int | None = None) -> dict[str, Any]:
    """One hang or crash from round ``start`` to ``end`` (the resume or restart); ``started``:
    the fleet's round when a restarted agent was up again."""
    silent = [v for r in (start, start + 1) if (v := _allreduce_max(_survivors(tels.get(r, {}), node))) is not None]
    during = [r for r in range(start + 2, end) if tels.get(r)]
    by_round = {r: v for r in during if (v := _allreduce_max(_survivors(tels[r], node))) is not None}
    times = list(by_round.values())
    degraded = sum(1 for r in during if any(t.get("degraded") for t in _survivors(tels[r], node)))
    hashes = max((len({t.get("model_hash") for t in _survivors(tels[r], node)}) for r in during), default=0)
    back = None
    for r in range(end, last + 1):
        tel = tels.get(r, {})
        fleet = {t.get("model_hash") for t in _survivors(tel, node)}
        mine = tel.get(node)
        if mine is not None and not mine.get("degraded") and len(fleet) == 1 and mine.get("model_hash") in fleet:
            back = r
            break
    after_rounds = {r: v for r in range((back or last) + 1, min(last, (back or last) + 20) + 1)
                    if (v := _allreduce_max(list(tels.get(r, {}).values()))) is not None}
    after = list(after_rounds.values())
    # The same run's ordinary rounds just before the fault: on a shared host the load can
    # change between the fault-free run and this one (a 0.067 s median there, 0.104 s here).
    before = [v for r in range(max(3, start - BEFORE_ROUNDS), start)
              if not periodic(r) and (v := _allreduce_max(list(tels.get(r, {}).values()))) is not None]
    return {"start": start, "end": end, "silent_round_s": max(silent) if silent else None,
            "before_median_s": _median(before),
            "silent_median_s": _median(times), "silent_max_s": max(times) if times else None,
            "silent_p90_s": _p90(times), "silent_ordinary_max_s": _ordinary_max(by_round),
            "after_ordinary_max_s": _ordinary_max(after_rounds), "silent_rounds": len(during), "degraded_while_silent": degraded,
            "max_survivor_hashes": hashes, "rounds_to_rejoin": None if back is None else back - end,
            "rounds_to_rejoin_after_start": None if back is None else back - (started or end),
            "silent_times_s": [round(v, 4) for v in times],
            "silent_ordinary_times_s": [round(v, 4) for r, v in by_round.items() if not periodic(r)],
            "after_median_s": _median(after)}


def run_result(case: str, nodes: int, run: FleetRun, episodes: list[tuple[int, int]]) -> dict[str, Any]:
    records = run_events(run.run_dir)
    tels = _telemetry(records)
    last = max(tels) if tels else 0
    node = _role_node(case, nodes) if case != "fault-free" else -1
    if case.startswith("flap"):
        episodes = [(s, _flap_end(records, node, s)) for s, _ in episodes]
    base_rounds = {r: v for r in sorted(tels)[3:] if (v := _allreduce_max(list(tels[r].values()))) is not None}
    base = list(base_rounds.values())
    final = tels.get(last, {})
    accs = [float(t["accuracy"]) for t in final.values() if t.get("accuracy") is not None]
    by_round = {r: round(statistics.mean(a), 4) for r in sorted(tels)
                if (a := [float(t["accuracy"]) for t in tels[r].values() if t.get("accuracy") is not None])}
    return {"case": case, "nodes": nodes, "node": node, "finished": run.finished, "error": run.error,
            "rounds": len(tels), "median_s": _median(base), "p90_s": _p90(base),
            "max_s": max(base) if base else None, "ordinary_max_s": _ordinary_max(base_rounds),
            "identical_at_end": len({t.get("model_hash") for t in final.values()}) == 1 if final else False,
            "final_accuracy": round(statistics.mean(accs), 4) if accs else None,
            "accuracy_by_round": by_round,
            "round_times_s": [round(v, 4) for v in base],
            "ordinary_round_times_s": [round(v, 4) for r, v in base_rounds.items() if not periodic(r)],
            "episodes": [episode_result(tels, node, s, e, last,
                                        _started_round(records, node, e) if case.startswith("crash") else None)
                         for s, e in episodes],
            "wall_seconds": round(run.wall_seconds, 1)}


def add_accuracy_drops(results: list[dict[str, Any]]) -> None:
    """Each run's accuracy against the fault-free run of its size at the same round: the
    last round both evaluated (the runs with faults are longer)."""
    for r in results:
        ref = next((x for x in results if x["nodes"] == r["nodes"] and x["case"] == "fault-free"), None)
        r["accuracy_drop_pp"] = None
        if ref is None or not ref.get("accuracy_by_round"):
            continue
        theirs = {int(k): v for k, v in ref["accuracy_by_round"].items()}
        mine = {int(k): v for k, v in (r.get("accuracy_by_round") or {}).items()}
        if common := set(theirs) & set(mine):
            at = max(common)
            r["accuracy_drop_pp"] = round(100 * (theirs[at] - mine[at]), 2)
            r["accuracy_compared_at_round"] = at


def run(args: argparse.Namespace) -> int:
    if any(n < 3 for n in args.nodes) or args.short < 1:
        progress("edgegrove bench silent: --nodes >= 3 and --short >= 1")
        return 2
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="edgegrove-bench-silent-") as tmp:
        root = args.keep or Path(tmp)
        for nodes in args.nodes:
            spec = _scenario("fault-free", nodes, 80, [])
            clean = run_result("fault-free", nodes, run_fleet(spec, root / spec.name, args.budget), [])
            results.append(clean)
            round_s = max(clean["median_s"] or 0.2, 0.05) + 0.05  # + compute and apply
            long_rounds = math.ceil(args.long_seconds / round_s)
            for case in args.cases:
                if case.startswith("crash"):
                    episodes = [(30, 30 + args.short * 4)]
                elif case.startswith("flap"):
                    episodes = [(30, 30 + long_rounds)]  # ends at the last Will, read back
                else:
                    episodes = [(30, 30 + args.short), (60, 60 + long_rounds)]
                rounds = episodes[-1][1] + 40
                spec = _scenario(case, nodes, rounds, episodes)
                results.append(run_result(case, nodes, run_fleet(spec, root / spec.name, args.budget), episodes))
                brief = [{k: v for k, v in e.items() if not k.endswith("times_s")} for e in results[-1]["episodes"]]
                progress(f"  -> {case}, {nodes} agents: {brief}")
    add_accuracy_drops(results)
    doc = document("silent", short_rounds=args.short, long_seconds=args.long_seconds, results=results,
                   method=("real mosquitto, one agent process per node via `edgegrove simulate`, "
                           "default adaptive timeouts; SIGSTOP/SIGCONT for a hang, SIGKILL and a "
                           "restart from the checkpoint for a crash; times are the slowest "
                           "survivor's allreduce (plus any wait for the round to start) from "
                           "the agents' telemetry"))
    emit(doc, args, render_table(doc))
    return 1 if any(r["error"] for r in results) else 0


TABLE_HEADERS = ["case", "nodes", "hang", "fault-free median s", "silent round s", "median while silent s",
                 "p90 while silent s", "fault-free p90 s", "worst while silent s", "fault-free worst s",
                 "worst ordinary round while silent s", "fault-free worst ordinary s",
                 "rounds over 1.5x median while silent", "fault-free rounds over 1.5x median",
                 "ordinary rounds over 1.5x median while silent", "fault-free ordinary rounds over 1.5x median",
                 "median before, same run s", "ordinary rounds over 1.5x that median while silent",
                 "degraded while silent", "survivor hashes",
                 "rounds to rejoin", "after its start-up", "median after s", "worst ordinary after s",
                 "identical at end",
                 "accuracy drop pp"]


def _over(times: list[float] | None, median: float | None) -> str | None:
    """How many of ``times`` exceed 1.5x the fault-free ``median``, as "k of n (p %)"."""
    if times is None or median is None:
        return None
    slow = sum(1 for t in times if t > 1.5 * median)
    return f"{slow} of {len(times)} ({100 * slow / len(times):.0f} %)" if times else "0 of 0"


def table_rows(doc: dict[str, Any]) -> list[list[Any]]:
    rows: list[list[Any]] = []
    for r in doc["results"]:
        ref: dict[str, Any] = next(
            (x for x in doc["results"] if x["nodes"] == r["nodes"] and x["case"] == "fault-free"), {})
        for e in r["episodes"]:
            length = e["end"] - e["start"]
            rows.append([r["case"], r["nodes"], f"{length} rounds", ref.get("median_s"), e["silent_round_s"],
                         e["silent_median_s"], e.get("silent_p90_s"), ref.get("p90_s"), e["silent_max_s"],
                         ref.get("max_s"), e.get("silent_ordinary_max_s"), ref.get("ordinary_max_s"),
                         _over(e.get("silent_times_s"), ref.get("median_s")),
                         _over(ref.get("round_times_s"), ref.get("median_s")),
                         _over(e.get("silent_ordinary_times_s"), ref.get("median_s")),
                         _over(ref.get("ordinary_round_times_s"), ref.get("median_s")),
                         e.get("before_median_s"), _over(e.get("silent_ordinary_times_s"), e.get("before_median_s")),
                         e["degraded_while_silent"],
                         e["max_survivor_hashes"], e["rounds_to_rejoin"],
                         e.get("rounds_to_rejoin_after_start", e["rounds_to_rejoin"]), e["after_median_s"],
                         e.get("after_ordinary_max_s"),
                         r["identical_at_end"], r["accuracy_drop_pp"]])
    return rows


def render_table(doc: dict[str, Any]) -> str:
    return (f"silent and crashed nodes on real mosquitto; short hang {doc['short_rounds']} rounds, "
            f"long hang ~{doc['long_seconds']:.0f} s\n" + format_table(TABLE_HEADERS, table_rows(doc)))
