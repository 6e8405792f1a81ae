"""PNG plots of a run (matplotlib, Agg backend: no display needed).

- round_time.png: allreduce time per iteration, slowest agent, with each fault's rounds shaded
  (as the thesis's Figures 14-17, where links fail between iterations 5 and 10);
- loss_accuracy.png: training loss and test accuracy per round, with the single-machine
  baseline (same samples per step) when there is one;
- bytes.png: bytes sent per round by the whole fleet;
- labels.png: each agent's training samples per label, stacked (how non-IID the split is).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from simulate.report_rows import FaultOutcome, RoundRow

_FAULT_COLOURS = {"link": "tab:red", "crash": "tab:purple", "hang": "tab:orange", "loss": "tab:olive",
                  "latency": "tab:cyan", "bandwidth": "tab:blue", "isolate": "tab:brown"}


def _shade_faults(ax: Any, faults: Sequence[FaultOutcome], last_round: int) -> None:
    labelled: set[str] = set()
    for fault in faults:
        if fault.status != "injected" or fault.at_round is None:
            continue
        end = fault.end_round if fault.end_round is not None else last_round + 1
        label = None if fault.kind in labelled else f"{fault.kind} fault"
        labelled.add(fault.kind)
        ax.axvspan(fault.at_round - 0.5, end - 0.5, color=_FAULT_COLOURS.get(fault.kind, "grey"),
                   alpha=0.15, label=label)


def plot_round_time(rows: Sequence[RoundRow], faults: Sequence[FaultOutcome], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    rounds = [r.round for r in rows]
    ax.plot(rounds, [r.allreduce_s_max for r in rows], marker="o", ms=3, label="allreduce (slowest agent)")
    ax.plot(rounds, [r.round_s_max for r in rows], lw=0.8, alpha=0.6, label="whole round (slowest agent)")
    degraded = [r for r in rows if r.degraded_nodes]
    if degraded:
        ax.scatter([r.round for r in degraded], [r.allreduce_s_max for r in degraded], marker="x",
                   color="black", zorder=3, label="degraded round")
    _shade_faults(ax, faults, rounds[-1] if rounds else 0)
    ax.set_xlabel("iteration (round)")
    ax.set_ylabel("seconds")
    ax.set_title("Time per iteration (fault windows shaded)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_loss_accuracy(rows: Sequence[RoundRow], faults: Sequence[FaultOutcome],
                       baseline: dict[str, Any] | None, path: Path) -> None:
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4.5))
    losses = [(r.round, r.loss) for r in rows if r.loss is not None]
    ax_loss.plot([x for x, _ in losses], [y for _, y in losses], label="fleet (mean over agents)")
    accs = [(r.round, r.accuracy) for r in rows if r.accuracy is not None]
    ax_acc.plot([x for x, _ in accs], [y for _, y in accs], marker="o", label="fleet")
    if baseline:
        ax_loss.plot(baseline.get("rounds", []), baseline.get("loss", []), ls="--", alpha=0.8,
                     label="single machine, same samples/step")
        eval_rounds = baseline.get("eval_rounds", [])
        ax_acc.plot(eval_rounds, baseline.get("accuracy", []), ls="--", marker="s", ms=3,
                    label="single machine")
    last = rows[-1].round if rows else 0
    for ax in (ax_loss, ax_acc):
        _shade_faults(ax, faults, last)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax_loss.set_ylabel("training loss")
    ax_loss.set_yscale("log")
    ax_acc.set_ylabel("test accuracy")
    ax_loss.set_title("Loss per round")
    ax_acc.set_title("Test accuracy")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_bytes(rows: Sequence[RoundRow], faults: Sequence[FaultOutcome], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar([r.round for r in rows], [r.bytes_sent / 1e6 for r in rows], width=0.8, label="sent by all agents")
    _shade_faults(ax, faults, rows[-1].round if rows else 0)
    ax.set_xlabel("round")
    ax.set_ylabel("MB")
    ax.set_title("Bytes per round")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_labels(histograms: Mapping[int, Sequence[int]], path: Path) -> None:
    """One stacked bar per agent: its training samples of each label."""
    nodes = sorted(histograms)
    classes = max((len(h) for h in histograms.values()), default=0)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * len(nodes) + 3), 4.5))
    cmap = plt.get_cmap("tab10" if classes <= 10 else "tab20")
    bottom = [0] * len(nodes)
    for label in range(classes):
        counts = [histograms[n][label] if label < len(histograms[n]) else 0 for n in nodes]
        ax.bar([str(n) for n in nodes], counts, bottom=bottom, color=cmap(label % cmap.N), label=str(label))
        bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
    ax.set_xlabel("agent")
    ax.set_ylabel("training samples")
    ax.set_title("Labels per agent")
    ax.legend(title="label", fontsize=7, ncol=2 if classes > 10 else 1, bbox_to_anchor=(1.01, 1), loc="upper left")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_all(run_dir: Path, rows: Sequence[RoundRow], faults: Sequence[FaultOutcome],
              baseline: dict[str, Any] | None) -> list[str]:
    """Write the three PNGs; returns their file names."""
    plot_round_time(rows, faults, run_dir / "round_time.png")
    plot_loss_accuracy(rows, faults, baseline, run_dir / "loss_accuracy.png")
    plot_bytes(rows, faults, run_dir / "bytes.png")
    return ["round_time.png", "loss_accuracy.png", "bytes.png"]
