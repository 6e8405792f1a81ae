"""`edgegrove bench isolation`: the thesis's Figure 11 from the protocol core.

Links of the FT-tree graph (tree links + backup links) of a full binary tree fail one at a
time, uniformly at random, until a node has lost all of its links. Per tree height: how many
links had failed then (a: count) and which fraction of all links that is (b), mean and
standard deviation over --trials random orders, plus the exact expectation where the graph
is small enough to enumerate. The computation is `agent.protocol.isolation.isolation_table`;
this bench only tabulates it, checks the thesis's stated trends and draws the figure.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from agent.commands.isolation_cmd import MAX_WORK, THESIS_CLAIMS, claims_hold, write_plot
from agent.protocol.isolation import IsolationResult, full_tree_size, isolation_table
from agent.validate import arg, output_file
from simulate.bench.common import add_output_arguments, document, emit, format_table, progress

DESCRIPTION = __doc__
MAX_NODES = 1 << 16


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--heights", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6],
                        help="tree heights (edges root to leaf; height 2 = the thesis's 7 nodes)")
    parser.add_argument("--arity", type=int, default=2, help="children per node")
    parser.add_argument("--trials", type=int, default=20_000, help="random failure orders per height")
    parser.add_argument("--seed", type=int, default=0, help="seed (same seed, same table)")
    parser.add_argument("--plot", type=arg(output_file), default=None, metavar="PNG",
                        help="also draw Figure 11 (a: count, b: fraction vs height) into PNG")
    add_output_arguments(parser)


def problem(args: argparse.Namespace) -> str | None:
    if args.arity < 2:
        return f"--arity must be >= 2, got {args.arity}"
    if args.trials < 1:
        return f"--trials must be >= 1, got {args.trials}"
    if not args.heights or any(h < 1 for h in args.heights):
        return "--heights must all be >= 1 (a tree of height 0 has no links)"
    for height in args.heights:
        nodes = full_tree_size(height, args.arity)
        if nodes > MAX_NODES or args.trials * 2 * nodes > MAX_WORK:
            return (f"height {height} ({nodes} nodes) x {args.trials} trials is too much work: "
                    "lower --heights or --trials")
    return None


def results_from(doc: dict[str, Any]) -> list[IsolationResult]:
    """The IsolationResult rows of a `bench isolation` JSON document (for plots)."""
    return [IsolationResult(**row) for row in doc["results"]]


def run(args: argparse.Namespace) -> int:
    trouble = problem(args)
    if trouble is not None:
        progress(f"edgegrove bench isolation: {trouble}")
        return 2
    heights = sorted(set(args.heights))
    progress(f"bench isolation: heights {heights}, {args.trials} trials each ...")
    results = isolation_table(heights, args.arity, args.trials, np.random.default_rng(args.seed))
    if args.plot is not None:
        try:
            write_plot(results, args.plot)
        except (ModuleNotFoundError, OSError) as exc:
            progress(f"edgegrove bench isolation: cannot draw {args.plot}: {exc}")
            return 2
        progress(f"wrote {args.plot}")
    doc = document("isolation", arity=args.arity, trials=args.trials, seed=args.seed,
                   results=[r.as_dict() for r in results],
                   thesis={"figure_values": None, "claims": THESIS_CLAIMS,
                           "claims_hold": claims_hold(results)})
    emit(doc, args, render_table(doc))
    return 0


def table_rows(doc: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for r in doc["results"]:
        exact = r.get("exact_mean_failed")
        rows.append([r["height"], r["nodes"], r["links"],
                     f"{r['mean_failed']:.2f} ± {r['std_failed']:.2f}",
                     "-" if exact is None else f"{exact:.3f}",
                     f"{100 * r['mean_fraction']:.1f}% ± {100 * r['std_fraction']:.1f}%",
                     r["min_failed"], r["max_failed"]])
    return rows


TABLE_HEADERS = ["height", "nodes", "links", "failed links (mean ± std)", "exact mean",
                 "fraction of links (mean ± std)", "min", "max"]


def render_table(doc: dict[str, Any]) -> str:
    text = format_table(TABLE_HEADERS, table_rows(doc))
    holds = doc["thesis"]["claims_hold"]
    lines = ["", "thesis (Figure 11 gives no numbers in its text; its stated trends):"]
    lines += [f"  [{'agrees' if holds[k] else 'DIFFERS'}] {v}" for k, v in THESIS_CLAIMS.items()]
    return text + "\n".join(["", *lines])
