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
cut figures come from `edgegrove simulate --sites` (tests/integration/test_simulate_sites.py).
"""

from __future__ import annotations

import argparse
from typing import Any

from agent.protocol.allreduce import AllreduceConfig
from agent.validate import arg, whole
from simulate.bench.common import add_output_arguments, document, emit, format_table, progress
from simulate.virtual_fleet import FleetConfig, VirtualFleet

DESCRIPTION = __doc__
THESIS_VALUES = 407_050


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sites", type=arg(whole(2, 16, "a number of sites")), default=3)
    parser.add_argument("--nodes", type=arg(whole(2, 256, "a number of agents")), default=21)
    parser.add_argument("--rounds", type=arg(whole(1, 50, "a number of rounds")), default=4)
    parser.add_argument("--values", type=arg(whole(1000, 10_000_000, "a vector length")),
                        default=THESIS_VALUES, help="values in the averaged vector")
    parser.add_argument("--uplink-rate", type=float, default=10.0, help="MB/s of each uplink, each way")
    parser.add_argument("--uplink-rtt", type=float, default=40.0, help="ms round trip of each uplink")
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
