"""`edgegrove analyze isolation`: the thesis's probabilistic analysis (section 6.4, Figure 11).

Links of the FT-tree graph (tree + backup links) of a full k-ary tree fail one by one at
random until some node has lost all its links. The table gives, per tree height (edges from
root to leaf; height 2 = 7 nodes for k = 2), the mean and standard deviation of the number
of failed links at that moment and of their fraction of all links; where the graph is small
enough, also the exact expectation by enumeration. The thesis shows Figure 11 only as a
plot (no numbers in its text), so its stated trends are checked instead.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from agent.protocol.isolation import IsolationResult, full_tree, full_tree_size, isolation
from agent.validate import arg, output_file

DESCRIPTION = __doc__
MAX_WORK = 300_000_000  # trials x links; beyond this a run takes minutes

# What the thesis says about Figure 11 (its numbers exist only as bars in the figure).
THESIS_CLAIMS = {
    "count_increases_with_height": "Figure 11a: the average number of tolerated failed links "
                                   "increases with the tree height",
    "fraction_decreases_with_height": "Figure 11b: the percentage of tolerated failed links "
                                      "decreases with the tree height",
    "two_root_links_can_halt": "two failed links (those of the root) can halt the allreduce",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--heights", type=int, nargs="+", default=[2, 3, 4, 5, 6],
                        help="tree heights to analyse (edges root to leaf, >= 1)")
    parser.add_argument("--arity", type=int, default=2, help="children per node (k of the k-ary tree)")
    parser.add_argument("--trials", type=int, default=20_000, help="random link-failure orders per height")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random generator (same seed, same table)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    parser.add_argument("--plot", type=arg(output_file), default=None, metavar="PATH",
                        help="also write Figure 11 (a: count, b: fraction) as an image (needs matplotlib)")


def _problem(args: argparse.Namespace) -> str | None:
    if args.arity < 2:
        return f"--arity must be >= 2, got {args.arity}"
    if args.trials < 1:
        return f"--trials must be >= 1, got {args.trials}"
    if any(h < 1 for h in args.heights):
        return "--heights must all be >= 1 (a tree of height 0 is one node with no links)"
    for h in args.heights:
        nodes = full_tree_size(h, args.arity)
        if nodes > 1 << 16 or args.trials * 2 * nodes > MAX_WORK:
            return (f"height {h} with arity {args.arity} ({nodes} nodes) x {args.trials} trials "
                    "is too much work; lower --heights or --trials")
    return None


def _root_degree(height: int, arity: int) -> int:
    tree = full_tree(height, arity)
    return len(tree.neighbours(tree.root))


def claims_hold(results: list[IsolationResult]) -> dict[str, bool]:
    by_height = sorted(results, key=lambda r: r.height)
    counts = [r.mean_failed for r in by_height]
    fractions = [r.mean_fraction for r in by_height]
    return {
        "count_increases_with_height": all(a < b for a, b in itertools.pairwise(counts)),
        "fraction_decreases_with_height": all(a > b for a, b in itertools.pairwise(fractions)),
        # Structural, not sampled: the root has exactly two links in every binary FT tree.
        "two_root_links_can_halt": all(_root_degree(r.height, r.arity) == 2 for r in by_height),
    }


def _table(results: list[IsolationResult]) -> str:
    header = (f"{'height':>6} {'nodes':>6} {'links':>6} {'failed links (mean ± std)':>26} "
              f"{'exact mean':>10} {'fraction (mean ± std)':>22} {'min':>4} {'max':>4}")
    lines = [header, "-" * len(header)]
    for r in results:
        exact = "-" if r.exact_mean_failed is None else f"{r.exact_mean_failed:.3f}"
        lines.append(
            f"{r.height:>6} {r.nodes:>6} {r.links:>6} "
            f"{f'{r.mean_failed:.2f} ± {r.std_failed:.2f}':>26} {exact:>10} "
            f"{f'{100 * r.mean_fraction:.1f}% ± {100 * r.std_fraction:.1f}%':>22} "
            f"{r.min_failed:>4} {r.max_failed:>4}"
        )
    return "\n".join(lines)


def _claims_text(holds: dict[str, bool]) -> str:
    lines = ["", "thesis (figure values are not given in its text; its stated trends):"]
    for key, text in THESIS_CLAIMS.items():
        lines.append(f"  [{'agrees' if holds[key] else 'DIFFERS'}] {text}")
    return "\n".join(lines)


def write_plot(results: list[IsolationResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heights = [r.height for r in results]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.bar(heights, [r.mean_failed for r in results], yerr=[r.std_failed for r in results], capsize=4)
    left.set(title="(a) failed links until a node is isolated", xlabel="tree height", ylabel="links")
    right.bar(heights, [100 * r.mean_fraction for r in results],
              yerr=[100 * r.std_fraction for r in results], capsize=4, color="tab:orange")
    right.set(title="(b) failed links until isolation, % of all", xlabel="tree height", ylabel="%")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def _document(args: argparse.Namespace, results: list[IsolationResult]) -> dict[str, Any]:
    return {
        "analysis": "isolation",
        "arity": args.arity,
        "trials": args.trials,
        "seed": args.seed,
        "results": [r.as_dict() for r in results],
        "thesis": {"figure_values": None, "claims": THESIS_CLAIMS, "claims_hold": claims_hold(results)},
        "plot": None if args.plot is None else str(args.plot),
    }


def run(args: argparse.Namespace) -> int:
    problem = _problem(args)
    if problem is not None:
        print(f"edgegrove analyze isolation: {problem}", file=sys.stderr)
        return 2
    rng = np.random.default_rng(args.seed)
    results = []
    for height in args.heights:
        print(f"height {height}: {args.trials} trials ...", file=sys.stderr)
        results.append(isolation(height, args.arity, args.trials, rng))
    if args.plot is not None:
        try:
            write_plot(results, args.plot)
        except ModuleNotFoundError:
            print("edgegrove analyze isolation: --plot needs matplotlib: "
                  "pip install 'edgegrove[simulate]'", file=sys.stderr)
            return 2
        except OSError as exc:
            print(f"edgegrove analyze isolation: cannot write {args.plot}: {exc}", file=sys.stderr)
            return 2
        print(f"wrote {args.plot}", file=sys.stderr)
    if args.json:
        print(json.dumps(_document(args, results)))
    else:
        print(_table(results) + _claims_text(claims_hold(results)))
    return 0
