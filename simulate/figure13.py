"""The thesis's Figure 13 beside ours: the five algorithms' accuracy against wall time on one
plot, and a sentence per algorithm on how its place among the five compares with the thesis's.

The thesis (section 7.3) ran TensorFlow's sync and async parameter servers, Keras's
MultiWorkerMirrored ring, a tree and the FT-tree, one CPU core per node, and says: the
synchronous parameter server has the best accuracy and is the slowest; the asynchronous one
trades accuracy for speed; both are slower than the decentralized ones; the tree is a little
more accurate than the ring, the ring a little faster; the FT-tree's fault tolerance costs time
against the tree. Time here is a run's seconds from all agents online to the end of its last
evaluated round; accuracy its last evaluation's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.protocol.allreduce import Algorithm

METHOD = ("ps-sync and ps-async: the view's lowest id serves; ps-async applies each worker's "
          "gradient (1/N) as it arrives and answers at once, a worker at most one round ahead of the "
          "server. ring: reduce-scatter and all-gather in id order, one link topic per ring link. "
          "Time in the verdicts: seconds from all agents online to the end of the last evaluated "
          "round; accuracy: that evaluation's (mean over the agents).")
FIVE = (Algorithm.PS_SYNC, Algorithm.PS_ASYNC, Algorithm.RING, Algorithm.TREE, Algorithm.FT_TREE)
PARAMETER_SERVERS = (Algorithm.PS_SYNC, Algorithm.PS_ASYNC)

Measures = dict[str, tuple[float, float]]  # algorithm -> (final accuracy, seconds)
Claim = tuple[str, Callable[[Measures], bool]]

CLAIMS: dict[str, Claim] = {
    "ps-sync": ("the best accuracy of the five, at the longest training time",
                lambda m: _best(m, "ps-sync", 0) and _slowest(m, "ps-sync")),
    "ps-async": ("trades accuracy for speed: less accurate than ps-sync, and faster",
                 lambda m: m["ps-async"][0] < m["ps-sync"][0] and m["ps-async"][1] < m["ps-sync"][1]),
    "ring": ("a little faster than the tree, a little less accurate",
             lambda m: m["ring"][1] < m["tree"][1] and m["ring"][0] <= m["tree"][0]),
    "tree": ("decentralized: faster than both parameter servers, with high accuracy",
             lambda m: all(m["tree"][1] < m[p][1] for p in PARAMETER_SERVERS)),
    "ft-tree": ("its fault tolerance costs time against the tree; still faster than the parameter servers",
                lambda m: m["tree"][1] < m["ft-tree"][1] < min(m[p][1] for p in PARAMETER_SERVERS)),
}


def _best(m: Measures, algorithm: str, index: int) -> bool:
    return m[algorithm][index] >= max(v[index] for v in m.values())


def _slowest(m: Measures, algorithm: str) -> bool:
    return m[algorithm][1] >= max(v[1] for v in m.values())


def measures(doc: dict[str, Any]) -> Measures:
    """(final accuracy, seconds to the last evaluation) of each of the five clean runs measured."""
    out: Measures = {}
    for r in doc.get("results", []):
        curve = r.get("curve") or []
        if r["algorithm"] in FIVE and not r.get("chunk_loss") and curve and curve[-1].get("seconds") is not None:
            out[r["algorithm"]] = (float(curve[-1]["accuracy"]), float(curve[-1]["seconds"]))
    return out


def sentences(doc: dict[str, Any]) -> list[str]:
    """One line per algorithm of the five: the thesis's claim, our figures, agrees or differs."""
    m = measures(doc)
    if set(m) != set(FIVE):
        return [f"_(Figure 13 needs all five of {', '.join(FIVE)}; this run has {', '.join(sorted(m)) or 'none'})_"]
    by_acc = sorted(FIVE, key=lambda a: -m[a][0])
    by_time = sorted(FIVE, key=lambda a: m[a][1])
    lines = []
    for algorithm in FIVE:
        claim, holds = CLAIMS[algorithm]
        acc, seconds = m[algorithm]
        lines.append(
            f"- [{'agrees' if holds(m) else '**differs**'}] **{algorithm}**: the thesis: {claim}. Here: "
            f"{100 * acc:.2f} % (#{by_acc.index(algorithm) + 1} of 5 by accuracy) in {seconds:.1f} s "
            f"(#{by_time.index(algorithm) + 1} of 5 by time, fastest first).")
    return lines


def reading(doc: dict[str, Any]) -> str:
    """Why ours may rank otherwise than the thesis's, from what our five do (and this run's spread)."""
    m = measures(doc)
    if set(m) != set(FIVE):
        return ""
    synchronous = [m[a][0] for a in FIVE if a != "ps-async"]
    spread = 100 * (max(synchronous) - min(synchronous))
    lag = 100 * (m["ps-sync"][0] - m["ps-async"][0])
    return (
        "Reading it: the four synchronous ones (ps-sync, ring, tree, ft-tree) apply the same mean of "
        "the same gradients every round (same seeds, same shards), so their accuracies differ by "
        f"float rounding only ({spread:.2f} pp apart here): their accuracy ranks are ties, where the "
        "thesis compared different frameworks' implementations. Only ps-async computes on stale "
        f"models ({lag:.2f} pp below ps-sync here). ps-async's workers still wait for their own "
        "answer, which comes once their gradient reached the server, and the server writes each "
        "worker an answer of its own (ps-sync: one mean for all): with every agent on the same "
        "cores at the same pace nothing waits on a straggler, so nothing is won back; the thesis's "
        "asynchronous gain is the slow workers not waited for. ft-tree's result goes out as the "
        "root's one fan-out publish, the tree's is relayed down level by level (docs/PROFILE.md), "
        "which can make ft-tree the faster of the two here. Times are of one run each.")


def plot(doc: dict[str, Any], path: Path, pyplot: Any) -> None:
    """Accuracy against seconds since the fleet was ready: the five algorithms, one machine."""
    fig, ax = pyplot.subplots(figsize=(7, 4.5))
    for r in doc["results"]:
        if r["algorithm"] in FIVE and not r.get("chunk_loss"):
            timed = [p for p in r.get("curve") or [] if p.get("seconds") is not None]
            ax.plot([p["seconds"] for p in timed], [p["accuracy"] for p in timed], "o-", ms=3, label=r["label"])
    base = doc.get("baseline") or {}
    timed = [p for p in base.get("curve") or [] if p.get("seconds") is not None]
    if timed:
        ax.plot([p["seconds"] for p in timed], [p["accuracy"] for p in timed], "s--", ms=3,
                label=f"single machine (batch {doc['samples_per_step']})")
    ax.set(xlabel="seconds since the fleet was ready", ylabel="test accuracy", ylim=(0.9, 1.0),
           title=f"Figure 13 on MQTT: {doc['nodes']} agents, accuracy against wall time")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    pyplot.close(fig)
