"""The thesis's probabilistic analysis (section 6.4, Figure 11), reproduced.

Links of the FT-tree graph (tree links + backup links, ``Tree.links()``) of a full k-ary tree
fail one at a time, uniformly at random, until some node has lost all of its links (it is
isolated and the thesis's allreduce halts). We report how many links had failed at that
moment, and which fraction of all links that is, averaged over many trials.

Height counts edges from the root to the leaves, as ``Tree.height``: a full binary tree of
height h has 2**(h+1) - 1 nodes (height 2 = the 7-node tree of the thesis's Figure 10).

A trial is one random order of the links. Node v is isolated at the position of its last
incident link in that order; the first isolation is the minimum of that over all nodes.
This is exact for a random permutation and needs no step-by-step removal loop.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from agent.protocol.topology import Tree

MAX_NODES = 1 << 16
MAX_EXACT_LINKS = 21  # 2**21 subsets (tens of MB): the height-3 binary tree, no more


@dataclass(frozen=True)
class IsolationResult:
    height: int
    arity: int
    nodes: int
    links: int
    trials: int
    mean_failed: float
    std_failed: float
    mean_fraction: float
    std_fraction: float
    min_failed: int
    max_failed: int
    exact_mean_failed: float | None = None  # by enumeration, where the graph is small

    def as_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


def full_tree_size(height: int, arity: int) -> int:
    """Nodes of a full ``arity``-ary tree of ``height`` (edges root to leaf)."""
    if height < 0:
        raise ValueError(f"height must be >= 0, got {height}")
    if arity < 2:
        raise ValueError(f"arity must be >= 2, got {arity}")
    return (arity ** (height + 1) - 1) // (arity - 1)


def full_tree(height: int, arity: int = 2) -> Tree:
    nodes = full_tree_size(height, arity)
    if nodes > MAX_NODES:
        raise ValueError(
            f"a full {arity}-ary tree of height {height} has {nodes} nodes; "
            f"at most {MAX_NODES} are supported, choose a smaller height or arity"
        )
    return Tree(tuple(range(nodes)), arity)


def _incidence(tree: Tree) -> tuple[list[tuple[int, int]], np.ndarray, np.ndarray]:
    """Links in a fixed order, plus each node's incident link indices laid out flat
    (``flat``) with the start offset of each node's run (``starts``)."""
    links = sorted(tree.links())
    incident: dict[int, list[int]] = {m: [] for m in tree.members}
    for index, (a, b) in enumerate(links):
        incident[a].append(index)
        incident[b].append(index)
    runs = [incident[m] for m in tree.members]
    flat = np.fromiter((i for run in runs for i in run), dtype=np.int64)
    starts = np.cumsum([0] + [len(run) for run in runs[:-1]], dtype=np.int64)
    return links, flat, starts


def failed_links_until_isolation(tree: Tree, trials: int, rng: np.random.Generator) -> np.ndarray:
    """For each trial, how many links had failed when the first node became isolated."""
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    if len(tree) < 2:
        raise ValueError("a single node has no links to fail")
    links, flat, starts = _incidence(tree)
    out = np.empty(trials, dtype=np.int64)
    batch = max(1, 2_000_000 // len(links))  # bounds memory to a few tens of MB
    for lo in range(0, trials, batch):
        hi = min(trials, lo + batch)
        # position[t, j]: when link j fails in trial t (a uniform random permutation).
        position = rng.permuted(np.tile(np.arange(len(links)), (hi - lo, 1)), axis=1)
        isolated_at = np.maximum.reduceat(position[:, flat], starts, axis=1)
        out[lo:hi] = isolated_at.min(axis=1) + 1
    return out


def exact_mean_failed(tree: Tree) -> float:
    """E[failed links until the first isolation], by enumerating every set of failed links.

    E[T] = sum_t P(T > t), and P(T > t) = (t-sets of failed links isolating nobody) / C(L, t).
    Only for small graphs (at most MAX_EXACT_LINKS links).
    """
    links, _, _ = _incidence(tree)
    n_links = len(links)
    if n_links > MAX_EXACT_LINKS:
        raise ValueError(f"{n_links} links: too many to enumerate (max {MAX_EXACT_LINKS})")
    subsets = np.arange(1 << n_links, dtype=np.int64)
    isolating = np.zeros(subsets.shape, dtype=bool)
    for node in tree.members:
        mask = sum(1 << i for i, link in enumerate(links) if node in link)
        isolating |= (subsets & mask) == mask
    sizes = np.bitwise_count(subsets)
    safe_counts = np.bincount(sizes[~isolating], minlength=n_links + 1)
    return float(sum(safe_counts[t] / math.comb(n_links, t) for t in range(n_links + 1)))


def isolation(
    height: int, arity: int, trials: int, rng: np.random.Generator
) -> IsolationResult:
    """Figure 11 for one tree height: failed links (count and fraction) until isolation."""
    tree = full_tree(height, arity)
    n_links = len(tree.links())
    failed = failed_links_until_isolation(tree, trials, rng)
    fraction = failed / n_links
    exact = exact_mean_failed(tree) if n_links <= MAX_EXACT_LINKS else None
    return IsolationResult(
        height=height, arity=arity, nodes=len(tree), links=n_links, trials=trials,
        mean_failed=float(failed.mean()), std_failed=float(failed.std()),
        mean_fraction=float(fraction.mean()), std_fraction=float(fraction.std()),
        min_failed=int(failed.min()), max_failed=int(failed.max()), exact_mean_failed=exact,
    )


def isolation_table(
    heights: list[int], arity: int, trials: int, rng: np.random.Generator
) -> list[IsolationResult]:
    return [isolation(h, arity, trials, rng) for h in heights]
