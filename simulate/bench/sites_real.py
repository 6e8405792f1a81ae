"""`edgegrove bench sites --real`: the sites fleet on real bridged mosquittos, shaped uplinks.

Runs `edgegrove simulate --sites S --nodes N` (real agents, a core broker and one broker per
site, each bridge through a proxy shaped to ``--uplink-rate`` and ``--uplink-rtt``) twice: with
the site-aware tree and with ``--site-blind`` (given the 32,768-value chunks the site-aware
fleet's views choose, so only the trees differ). Per run, from the uplink counters the
simulator logs each round: the bytes that entered the sites through their uplinks per round
(every cross-site delivery enters its site once) against the minimum (2 vectors per site but
the root's: its mean up, the result down), both directions together, the busiest uplink's
bytes each way and its bound (bytes / rate, plus one RTT for the reduce and one for the
broadcast: a hop between sites crosses two uplinks, half an RTT each); the median round
against that bound, the agents' compute in it and the degraded rounds. With ``--faults``, two
more site-aware runs: site s1's bridge cut for ``--cut-seconds`` and s1's broker restarted
(``--outage``): degraded rounds outside s1 in the fault, rounds with more than one model among
the members, rounds from the heal until s1 is back with the fleet's model.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from agent.protocol.chunking import SLOW_LINK_CHUNK_VALUES
from simulate.bench.fleetrun import FleetRun, FleetScenario, run_events, run_fleet

WARMUP_ROUNDS = 3  # the fleet settles its chunks and timeouts in these: not measured
# An uplink write this large carries vector chunks (a proxy reads up to 64 KiB at once), not
# the statuses, telemetry and ACKs that also cross (a site's telemetry of a round: ~15 KB).
VECTOR_WRITE_BYTES = 32 * 1024
RUN_BUDGET_S = 600.0
FAULT_AT_ROUND = 10
FAULT_SITE = "s1"
ROOT_SITE = "s0"  # the root is the lowest id, and make-sites puts the lowest ids in s0


def vector_bytes(values: int) -> int:
    return values * 4  # float32 on the wire


def uplink_figures(snapshots: list[tuple[int, dict[str, list[int]]]], rounds: int, sites: int,
                   values: int, rate: float, rtt: float) -> dict[str, Any]:
    """Per round, between the first snapshot past the warm-up and the last one of the run:
    bytes into the sites (sum of the downlinks), both ways, the busiest uplink each way."""
    steady = [(r, b) for r, b in snapshots if WARMUP_ROUNDS <= r <= rounds]
    if len(steady) < 2 or steady[-1][0] == steady[0][0]:
        return {"error": "too few rounds with uplink counts"}
    (r0, first), (r1, last) = steady[0], steady[-1]
    n = r1 - r0
    delta = {site: (last[site][0] - first[site][0], last[site][1] - first[site][1]) for site in last}
    into = sum(down for _, down in delta.values()) / n
    both = sum(up + down for up, down in delta.values()) / n
    busiest = max(max(up, down) for up, down in delta.values()) / n
    minimum = 2 * (sites - 1) * vector_bytes(values)
    return {
        "measured_rounds": [r0, r1],
        "into_sites_bytes_per_round": round(into),
        "minimum_bytes_per_round": minimum,
        "over_minimum": round(into / minimum, 3),
        "both_ways_bytes_per_round": round(both),
        "busiest_uplink_bytes_per_round_each_way": round(busiest),
        "uplink_bound_s": round(busiest / rate + 2 * rtt, 3),
        "per_site_bytes_per_round": {s: [round(u / n), round(d / n)] for s, (u, d) in delta.items()},
    }


def round_figures(rows: list[dict[str, Any]], bound: float | None) -> dict[str, Any]:
    """Median round (the slowest agent's, past the warm-up), its share of compute, degraded."""
    steady = [r for r in rows if r["round"] >= WARMUP_ROUNDS and r.get("round_s_max") is not None]
    if not steady:
        return {"error": "no rounds past the warm-up"}
    median = statistics.median(r["round_s_max"] for r in steady)
    compute = statistics.median(r.get("compute_s_median") or 0.0 for r in steady)
    return {
        "median_round_s": round(median, 3),
        "over_bound": round(median / bound, 3) if bound else None,
        "compute_s_median": round(compute, 4),
        "compute_share": round(compute / median, 3),
        "degraded_rounds": sum(1 for r in rows if (r.get("degraded_nodes") or 0) > 0),
        "rounds": len(rows),
    }


def round_parts(trace: dict[str, dict[str, list[list[float]]]], events: list[dict[str, Any]],
                root_site: str) -> dict[str, Any]:
    """Each round past the warm-up, laid beside what the uplinks carried when (the simulator's
    ``--uplink-trace``): from the round's start (its first agent's) until vector bytes first
    leave a site other than the root's ("in-site start": the agents compute and reduce in
    their site), until the last result bytes enter such a site ("crossing": what the uplink
    bound counts), until the round's end (its last agent's; "in-site end": the result spreads
    in the site). Medians in seconds, and the rounds they come from."""
    others = [site for site in trace if site != root_site]
    ups = sorted(t for site in others for t, n in trace[site]["up"] if n >= VECTOR_WRITE_BYTES)
    downs = sorted(t for site in others for t, n in trace[site]["down"] if n >= VECTOR_WRITE_BYTES)
    spans: dict[int, list[float]] = {}
    for e in events:
        if e.get("type") == "telemetry" and isinstance(e.get("round"), int) and e["round"] >= WARMUP_ROUNDS:
            end = float(e["wall_time"])
            start = end - float((e.get("phase_seconds") or {}).get("total", 0.0))
            span = spans.setdefault(e["round"], [start, end])
            span[0], span[1] = min(span[0], start), max(span[1], end)
    parts: list[tuple[float, float, float]] = []
    for start, end in spans.values():
        i, j = bisect.bisect_left(ups, start), bisect.bisect_right(downs, end)
        if i < len(ups) and j > 0 and ups[i] <= downs[j - 1]:
            parts.append((ups[i] - start, downs[j - 1] - ups[i], end - downs[j - 1]))
    if not parts:
        return {"error": "no round with vector bytes both ways in the uplink trace"}
    return {
        "in_site_start_s": round(statistics.median(p[0] for p in parts), 3),
        "crossing_s": round(statistics.median(p[1] for p in parts), 3),
        "in_site_end_s": round(statistics.median(p[2] for p in parts), 3),
        "rounds": len(parts),
    }


def load_trace(run_dir: Path) -> dict[str, dict[str, list[list[float]]]]:
    try:
        trace: dict[str, dict[str, list[list[float]]]] = json.loads((run_dir / "uplink-trace.json").read_text())
    except (OSError, ValueError):
        return {}
    return trace


def uplink_snapshots(events: list[dict[str, Any]]) -> list[tuple[int, dict[str, list[int]]]]:
    return [(e["round"], e["bytes"]) for e in events
            if e.get("type") == "uplinks" and isinstance(e.get("round"), int)]


def fault_window(events: list[dict[str, Any]]) -> tuple[float, float] | None:
    """Event-log times the fault began and ended (bridge healed, site broker started)."""
    start = [e["t"] for e in events if e.get("type") == "fault" and e.get("action") == "inject"]
    end = [e["t"] for e in events if (e.get("type") == "site" and e.get("event") == "healed")
           or (e.get("type") == "broker" and e.get("event") == "started")]
    if not start or not end:
        return None
    return min(start), min(t for t in end if t >= min(start))


def fault_figures(events: list[dict[str, Any]], site_nodes: set[int], nodes: int) -> dict[str, Any]:
    """Around the fault on ``site_nodes``' site: degraded rounds of the other agents from the
    fault until the site is back, rounds whose members (reporters averaging with others) hold
    more than one model, and rounds from the heal until every agent reports the fleet's model."""
    window = fault_window(events)
    if window is None:
        return {"error": "the fault did not begin and end"}
    start, end = window
    rounds: dict[int, dict[int, dict[str, Any]]] = defaultdict(dict)
    for e in events:
        if e.get("type") == "telemetry" and isinstance(e.get("round"), int):
            rounds[e["round"]][e["node"]] = e
    first_at = {r: min(x["t"] for x in by.values()) for r, by in rounds.items()}
    after = [r for r in sorted(rounds) if first_at[r] >= end]
    whole = [r for r in after if len(rounds[r]) == nodes
             and len({x["model_hash"] for x in rounds[r].values()}) == 1]
    back = whole[0] if whole else None
    last = back if back is not None else max(rounds, default=0)
    fault_rounds = [r for r in sorted(rounds) if first_at[r] >= start - 5.0 and r <= last]
    others_degraded = [r for r in fault_rounds
                       if any(x.get("degraded") for n, x in rounds[r].items() if n not in site_nodes)]
    split = [r for r in sorted(rounds) if len({x["model_hash"] for x in rounds[r].values() if _averaged(x)}) > 1]
    # The site's first status after the heal: its bridge has dialled the core again.
    heard = [e["t"] for e in events if e.get("type") == "status" and e.get("node") in site_nodes and e["t"] >= end]
    # Rounds from the first round begun once the site is heard: the fleet's part of the return,
    # apart from how long the bridge took to dial the core again.
    after_heard = [r for r in after if heard and first_at[r] >= min(heard)]
    return {
        "fault_s": round(end - start, 1),
        "site_heard_s": round(min(heard) - end, 2) if heard else None,
        "rounds_in_fault": sum(1 for r in rounds if start <= first_at[r] < end),
        "others_degraded_rounds": others_degraded,
        "split_rounds": split,
        "first_round_after_heal": after[0] if after else None,
        "back_in_rounds": None if back is None or not after else back - after[0],
        "back_in_s": None if back is None else round(first_at[back] - end, 1),
        "back_after_heard_rounds": None if back is None or not after_heard else max(0, back - after_heard[0]),
    }


def _averaged(report: dict[str, Any]) -> bool:
    """The reporter's model came from averaging with others. Not a round cut short that kept
    part of the whole fleet's mean (its root went down mid-broadcast: the chunks that had not
    come were skipped): that member holds no other fleet's model, and it resyncs."""
    contributors = report.get("contributors") or 0
    members = report.get("members")
    partial_of_all = bool(report.get("degraded")) and members is not None and contributors >= members
    return contributors > 1 and not partial_of_all


def site_nodes(nodes: int, sites: int, site: str) -> set[int]:
    """The agent ids of ``site``, split as make-sites splits them (contiguous blocks)."""
    from simulate.site_brokers import split_sites

    return set(split_sites(list(range(nodes)), sites)[site])


def cpu_jiffies(stat: str | None = None) -> tuple[int, int]:
    """(busy, total) CPU time of the whole host so far, from /proc/stat's first line (idle
    and iowait are not busy); (0, 0) where there is none."""
    if stat is None:
        try:
            stat = Path("/proc/stat").read_text()
        except OSError:
            return 0, 0
    fields = [int(v) for v in stat.split("\n", 1)[0].split()[1:]]
    idle = sum(fields[3:5])
    return sum(fields) - idle, sum(fields)


def busy_share(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    """The host's CPU busy share between two ``cpu_jiffies``: 1.0 is every core busy."""
    total = after[1] - before[1]
    return round((after[0] - before[0]) / total, 3) if total > 0 else None


def _agent_options() -> dict[str, Any]:
    return {"eval_samples": 1000}


def _run(args: argparse.Namespace, workdir: Path, name: str, aware: bool, rounds: int,
         faults: str = "") -> tuple[FleetRun, dict[str, float]]:
    agent = _agent_options() if aware else {**_agent_options(), "chunk_size": SLOW_LINK_CHUNK_VALUES}
    scenario = FleetScenario(name=name, nodes=args.nodes, rounds=rounds, agent=agent, faults_toml=faults)
    extra = ("--sites", str(args.sites), "--uplink-rate", str(args.uplink_rate),
             "--uplink-rtt", str(args.uplink_rtt), "--uplink-trace") + (() if aware else ("--site-blind",))
    if args.shaper == "kernel":
        extra += ("--site-netns",)
    load = {"before": os.getloadavg()[0]}
    jiffies = cpu_jiffies()
    run = run_fleet(scenario, workdir / name, RUN_BUDGET_S, extra)
    load["after"] = os.getloadavg()[0]
    # How busy the host's cores were over the run: near 1.0, rounds wait for CPU, not uplinks.
    if (busy := busy_share(jiffies, cpu_jiffies())) is not None:
        load["cpu_busy"] = busy
    return run, load


def measure_tree(args: argparse.Namespace, workdir: Path, aware: bool) -> dict[str, Any]:
    name = "site-aware" if aware else "site-blind"
    run, load = _run(args, workdir, name, aware, args.rounds)
    events = run_events(run.run_dir)
    links = uplink_figures(uplink_snapshots(events), args.rounds, args.sites, args.values,
                           args.uplink_rate * 1e6, args.uplink_rtt / 1000)
    rows = round_figures(run.rows, links.get("uplink_bound_s"))
    parts = round_parts(load_trace(run.run_dir), events, ROOT_SITE)
    return {"tree": name, **links, **rows, "round_parts": parts, "load_1min": load, "run_dir": str(run.run_dir),
            "finished": run.finished, "error": run.error}


def measure_fault(args: argparse.Namespace, workdir: Path, kind: str) -> dict[str, Any]:
    if kind == "bridge-cut":
        toml = (f'[[faults]]\nkind = "bridge-cut"\nsite = "{FAULT_SITE}"\nat_round = {FAULT_AT_ROUND}\n'
                f"seconds = {args.cut_seconds}\n")
    else:
        toml = (f'[[faults]]\nkind = "site-broker-restart"\nsite = "{FAULT_SITE}"\n'
                f"at_round = {FAULT_AT_ROUND}\noutage = {args.outage}\n")
    run, load = _run(args, workdir, kind, True, args.fault_rounds, toml)
    figures = fault_figures(run_events(run.run_dir), site_nodes(args.nodes, args.sites, FAULT_SITE), args.nodes)
    return {"fault": kind, "site": FAULT_SITE, **figures, "degraded_rounds": run.summary.get("degraded_rounds"),
            "load_1min": load, "run_dir": str(run.run_dir), "finished": run.finished, "error": run.error}


def work_directory(args: argparse.Namespace) -> Path:
    if args.work_dir is not None:
        return Path(args.work_dir)
    return Path(tempfile.mkdtemp(prefix="edgegrove-bench-sites-"))
