"""`edgegrove bench sites`: what crosses the uplinks of a fleet spread over sites, with the
site-aware tree and with the site-blind one, side by side.

The fleet is the in-memory one (simulate/virtual_fleet.py: the agents' own core and round
machines on a deterministic bus), ``--sites`` x agents, the thesis model's vector (407,050
float32 values). Per tree, from the link frames each agent publishes: the bytes that cross
from one site to another per round, beside the minimum (every site but the root's sends its
mean up and takes the result down: 2 vectors per such site, one per direction), and the
busiest uplink's bytes per round (each cross-site frame leaves one site and enters another:
both uplinks carry it) and what that costs at ``--uplink-rate`` plus one RTT per tree level
that crosses sites: the uplink bound of a round. Round times on real brokers and the bridge-
cut figures come from ``--real`` (simulate/bench/sites_real.py): the same comparison on real
bridged mosquittos and real agents, and with ``--faults`` a bridge cut and a site broker restart.
"""

from __future__ import annotations

import argparse
from typing import Any

from agent.protocol.allreduce import AllreduceConfig
from agent.validate import arg, whole
from simulate.bench import sites_real
from simulate.bench.common import add_output_arguments, document, emit, format_table, progress
from simulate.injector import kernel_shaping_supported
from simulate.virtual_fleet import FleetConfig, VirtualFleet

DESCRIPTION = __doc__
THESIS_VALUES = 407_050


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sites", type=arg(whole(2, 16, "a number of sites")), default=3)
    parser.add_argument("--nodes", type=arg(whole(2, 256, "a number of agents")), default=21)
    parser.add_argument("--rounds", type=arg(whole(1, 500, "a number of rounds")), default=None,
                        help="rounds measured (default 4 in memory, 40 with --real)")
    parser.add_argument("--values", type=arg(whole(1000, 10_000_000, "a vector length")),
                        default=THESIS_VALUES, help="values in the averaged vector")
    parser.add_argument("--uplink-rate", type=float, default=10.0, help="MB/s of each uplink, each way")
    parser.add_argument("--uplink-rtt", type=float, default=40.0, help="ms round trip of each uplink")
    parser.add_argument("--real", action="store_true",
                        help="real agents on real bridged mosquittos (edgegrove simulate --sites): "
                             "run it under the fleet lock, 21 agents take minutes")
    parser.add_argument("--faults", action="store_true",
                        help="with --real: also a bridge cut of site s1 and a restart of its broker")
    parser.add_argument("--faults-only", action="store_true",
                        help="with --real --faults: the two fault runs alone (not the trees' runs)")
    parser.add_argument("--cut-seconds", type=arg(whole(1, 600, "seconds")), default=20)
    parser.add_argument("--outage", type=arg(whole(1, 120, "seconds")), default=5,
                        help="with --faults: seconds the site broker is down")
    parser.add_argument("--fault-rounds", type=arg(whole(20, 2000, "a number of rounds")), default=120,
                        help="with --faults: rounds of each fault run (the fault at round 10)")
    parser.add_argument("--shaper", choices=("proxy", "kernel"), default="proxy",
                        help="with --real: what limits each uplink's rate. proxy: the uplink's "
                             "user-space TCP proxy, on the host's CPU; kernel: tbf on the veth of a "
                             "network namespace per site (simulate --site-netns: each site's broker "
                             "and agents in it; needs root, ip and tc). The RTT is the proxy's either way")
    parser.add_argument("--work-dir", default=None, metavar="DIR",
                        help="with --real: where the runs go (default: a new temporary directory)")
    add_output_arguments(parser)


def _measure(args: argparse.Namespace, aware: bool) -> dict[str, Any]:
    config = FleetConfig(nodes=args.nodes, rounds=args.rounds, length=args.values, sites=args.sites,
                         site_aware=aware, allreduce=AllreduceConfig(broadcast="tree"),
                         adapt_broadcast=False, adapt_chunks=False)
    fleet = VirtualFleet(config)
    records = fleet.run()
    uplink: dict[str, int] = {}
    for (src, dst), nbytes in fleet.cross_site.items():
        uplink[src] = uplink.get(src, 0) + nbytes
        uplink[dst] = uplink.get(dst, 0) + nbytes
    fleet.release()
    rounds = len(records)
    vector = args.values * 4
    minimum = 2 * (args.sites - 1) * vector
    per_round = fleet.cross_site_bytes / rounds
    busiest = max(uplink.values()) / rounds / 2  # each way
    return {
        "tree": "site-aware" if aware else "site-blind",
        "cross_site_bytes_per_round": round(per_round),
        "minimum_bytes_per_round": minimum,
        "over_minimum": round(per_round / minimum, 3),
        "busiest_uplink_bytes_per_round_each_way": round(busiest),
        "uplink_bound_s": round(busiest / (args.uplink_rate * 1e6) + 2 * args.uplink_rtt / 1000, 3),
        "degraded_rounds": sum(r.degraded for r in records),
    }


def run(args: argparse.Namespace) -> int:
    if (args.faults and not args.real) or (args.faults_only and not args.faults):
        progress("edgegrove bench sites: --faults needs --real, --faults-only needs --faults")
        return 2
    if not args.uplink_rate > 0 or not 0 <= args.uplink_rtt <= 10_000:
        progress(f"edgegrove bench sites: --uplink-rate {args.uplink_rate} MB/s > 0, --uplink-rtt "
                 f"{args.uplink_rtt} ms in 0..10000")
        return 2
    if args.nodes < args.sites:
        progress(f"edgegrove bench sites: --nodes {args.nodes} < --sites {args.sites}: every site needs an agent")
        return 2
    if args.real:
        return _run_real(args)
    args.rounds = args.rounds or 4
    rows = []
    for aware in (True, False):
        progress(f"bench sites: {args.sites} sites x {args.nodes} agents, "
                 f"{'site-aware' if aware else 'site-blind'} tree, {args.rounds} rounds")
        rows.append(_measure(args, aware))
    doc = document("sites", sites=args.sites, nodes=args.nodes, values=args.values,
                   uplink_rate_mb_s=args.uplink_rate, uplink_rtt_ms=args.uplink_rtt, trees=rows)
    table = format_table(
        ["tree", "cross-site MB/round", "minimum MB", "x minimum", "busiest uplink MB each way",
         "uplink bound s", "degraded"],
        [[r["tree"], r["cross_site_bytes_per_round"] / 1e6, r["minimum_bytes_per_round"] / 1e6,
          r["over_minimum"], r["busiest_uplink_bytes_per_round_each_way"] / 1e6, r["uplink_bound_s"],
          r["degraded_rounds"]] for r in rows])
    emit(doc, args, table)
    return 0


def _parts(parts: dict[str, Any]) -> list[Any]:
    """A round's median in-site start, crossing and in-site end (sites_real.round_parts)."""
    return [parts.get("in_site_start_s"), parts.get("crossing_s"), parts.get("in_site_end_s")]


def _run_real(args: argparse.Namespace) -> int:
    if args.values != THESIS_VALUES:
        progress("edgegrove bench sites: --values is the in-memory fleet's; --real trains the thesis MLP")
        return 2
    if args.shaper == "kernel" and (problem := kernel_shaping_supported()):
        progress(f"edgegrove bench sites: --shaper kernel: {problem}")
        return 2
    args.rounds = args.rounds or 40
    workdir = sites_real.work_directory(args)
    progress(f"bench sites --real: {args.sites} sites x {args.nodes} agents, uplinks "
             f"{args.uplink_rate} MB/s {args.uplink_rtt} ms ({args.shaper} shaper), runs in {workdir}")
    trees = [] if args.faults_only else [sites_real.measure_tree(args, workdir, aware) for aware in (True, False)]
    faults = ([sites_real.measure_fault(args, workdir, kind) for kind in ("bridge-cut", "site-broker-restart")]
              if args.faults else [])
    doc = document("sites-real", sites=args.sites, nodes=args.nodes, rounds=args.rounds, values=args.values,
                   uplink_rate_mb_s=args.uplink_rate, uplink_rtt_ms=args.uplink_rtt, shaper=args.shaper,
                   warmup_rounds=sites_real.WARMUP_ROUNDS, trees=trees, faults=faults,
                   cut_seconds=args.cut_seconds, outage_s=args.outage)
    table = "" if not trees else format_table(
        ["tree", "into sites MB/round", "minimum MB", "x minimum", "both ways MB", "busiest uplink MB",
         "uplink bound s", "median round s", "x bound", "in-site start s", "crossing s", "in-site end s",
         "compute s", "degraded", "load", "CPU busy"],
        [[r["tree"], r.get("into_sites_bytes_per_round", 0) / 1e6, r.get("minimum_bytes_per_round", 0) / 1e6,
          r.get("over_minimum"), r.get("both_ways_bytes_per_round", 0) / 1e6,
          r.get("busiest_uplink_bytes_per_round_each_way", 0) / 1e6, r.get("uplink_bound_s"),
          r.get("median_round_s"), r.get("over_bound"), *_parts(r.get("round_parts") or {}),
          r.get("compute_s_median"), r.get("degraded_rounds"),
          f"{r['load_1min']['before']:.1f}-{r['load_1min']['after']:.1f}", r["load_1min"].get("cpu_busy")]
         for r in trees])
    if faults:
        table += ("\n\n" if table else "") + format_table(
            ["fault", "seconds", "rounds in it", "others degraded", "split rounds", "site heard after s",
             "back in rounds", "back in s", "back after heard", "load"],
            [[f["fault"], f.get("fault_s"), f.get("rounds_in_fault"), len(f.get("others_degraded_rounds", [])),
              len(f.get("split_rounds", [])), f.get("site_heard_s"), f.get("back_in_rounds"), f.get("back_in_s"),
              f.get("back_after_heard_rounds"), f"{f['load_1min']['before']:.1f}-{f['load_1min']['after']:.1f}"] for f in faults])
    emit(doc, args, table)
    errors = [r["error"] for r in trees + faults if r.get("error")]
    return 1 if errors else 0
