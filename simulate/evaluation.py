"""`edgegrove bench report`: docs/EVALUATION.md and its plots, from the benches' JSON.

Reads docs/results/<bench>.json (written by `edgegrove bench <bench> --out ...`), renders one
section per bench (tables, plots in docs/img/), says which machine each figure came from,
and leaves a clearly marked "not yet measured" section, with the command that fills it, for
every bench whose JSON is missing. A file that cannot be read is reported in its section and
on stderr; the rest of the document is still written.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.validate import arg, output_dir, output_file
from simulate.bench import flower_report
from simulate.bench.common import REPO_ROOT, machine_info, markdown_table
from simulate.evaluation_context import Context, pyplot
from simulate.thesis import THESIS_COLUMNS, THESIS_STEP_S

DESCRIPTION = __doc__


Renderer = Callable[[dict[str, Any], Context], str]


@dataclass(frozen=True)
class Section:
    bench: str
    title: str
    command: str  # how to measure it (and store the JSON where the report looks)
    why: str
    render: Renderer | None = None  # None: a generic table of its results


# ---------------------------------------------------------------------------------------
# Renderers of the benches whose JSON we know
# ---------------------------------------------------------------------------------------

def render_broker(doc: dict[str, Any], ctx: Context) -> str:
    from simulate.bench.broker import MODEL_VALUES

    ok = [r for r in doc.get("results", []) if "error" not in r]
    rows = [[r["broker"], r["payload_bytes"], r["subscribers"], r["messages"], r["repeats"],
             r["delivered_mb_s"]["median"], r["broker_mb_s"]["median"],
             f"{r['broker_mb_s']['p10']:.0f} – {r['broker_mb_s']['p90']:.0f}", r["lost"]] for r in ok]
    parts = [markdown_table(["broker", "payload (B)", "subscribers", "messages / repeat", "repeats",
                             "delivered MB/s (median)", "broker MB/s in+out (median)",
                             "broker MB/s p10 – p90", "lost"], rows)]
    parts += [f"- **error** {r['broker']} {r['payload_bytes']} B x{r['subscribers']}: {r['error']}"
              for r in doc.get("results", []) if "error" in r]
    if ok:
        parts.append(ctx.image("broker.png", lambda p: _plot_broker(ok, p), "broker throughput"))
    bound = doc.get("bound")
    if bound:
        parts.append(f"**The physical bound of one fault-free allreduce** ({MODEL_VALUES:,} float32 "
                     f"values in chunks of 16,384, every chunk ACKed; each tree edge carries the "
                     f"gradient up once and down once; bytes counted in and out of the broker), at "
                     f"{bound['throughput_mb_s']} MB/s ({bound['basis']}):")
        parts.append(markdown_table(["nodes", "MQTT messages", "bytes through the broker", "bound (ms)",
                                     "thesis, no faults (ms)"],
                                    [[t["nodes"], t["messages"], f"{t['total_bytes']:,}", t["bound_ms"],
                                      _thesis_ms(t["nodes"])] for t in bound["trees"]]))
    return "\n\n".join(parts)


def _thesis_ms(nodes: int) -> str:
    row = THESIS_STEP_S[0.5].get(nodes)
    return "-" if row is None else f"{1000 * row[0]:.0f}"


def _plot_broker(rows: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    labels = [f"{r['broker']}\n{_size_label(r['payload_bytes'])} x{r['subscribers']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows)), 4))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["delivered_mb_s"]["median"] for r in rows], 0.4, label="delivered")
    ax.bar([x + 0.2 for x in xs], [r["broker_mb_s"]["median"] for r in rows], 0.4,
           label="through the broker (in+out)")
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set(ylabel="MB/s (median)", title="raw broker throughput, paho QoS 0 (payload x subscribers)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _size_label(size: int) -> str:
    return f"{size / 1e6:.2f} MB" if size >= 1e6 else f"{size / 1024:.0f} KiB"


def render_isolation(doc: dict[str, Any], ctx: Context) -> str:
    from agent.commands.isolation_cmd import write_plot
    from simulate.bench.isolation import TABLE_HEADERS, results_from, table_rows

    holds = doc["thesis"]["claims_hold"]
    claims = [f"- [{'agrees' if holds[k] else '**DIFFERS**'}] {text}"
              for k, text in doc["thesis"]["claims"].items()]
    plot = ctx.image("isolation.png", lambda p: write_plot(results_from(doc), p),
                     "Figure 11: failed links until isolation vs tree height")
    return "\n\n".join([
        f"{doc['trials']:,} random failure orders per height (seed {doc['seed']}, arity {doc['arity']}); "
        "exact expectation by enumeration where the graph has at most 21 links.",
        markdown_table(TABLE_HEADERS, table_rows(doc)), plot,
        "The thesis shows Figure 11 only as bars (no numbers in its text); its stated trends:",
        "\n".join(claims)])


def render_gloo(doc: dict[str, Any], ctx: Context) -> str:
    if not doc.get("available"):
        return f"_Not available when measured: {doc.get('reason', 'torch is not installed')}._"
    ok = [r for r in doc["results"] if "error" not in r]
    bound = {t["nodes"]: t["bound_ms"] for t in ctx.docs.get("broker", {}).get("bound", {}).get("trees", [])}
    rows = [[r["nodes"], r["ms"]["median"], f"{r['ms']['p10']:.1f} – {r['ms']['p90']:.1f}",
             r["iterations"], bound.get(r["nodes"]), _thesis_ms(r["nodes"])] for r in ok]
    parts = [f"torch {doc['torch']}, backend gloo, {doc['transport']}, one CPU thread per process; "
             "an iteration lasts until its slowest rank is done.",
             markdown_table(["nodes", "gloo median (ms)", "p10 – p90 (ms)", "iterations",
                             "MQTT broker bound (ms)", "thesis FT-tree, no faults (ms)"], rows)]
    parts += [f"- **error** at {r['nodes']} nodes: {r['error']}" for r in doc["results"] if "error" in r]
    if ok:
        parts.append(ctx.image("gloo.png", lambda p: _plot_gloo(ok, bound, p),
                               "gloo allreduce vs the MQTT broker bound"))
    return "\n\n".join(parts)


def _plot_gloo(rows: list[dict[str, Any]], bound: dict[int, float], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    nodes = [r["nodes"] for r in rows]
    ax.plot(nodes, [r["ms"]["median"] for r in rows], "o-", label="gloo (direct TCP), median")
    if bound:
        ns = sorted(n for n in bound if n <= max(nodes) * 2)
        ax.plot(ns, [bound[n] for n in ns], "s--", label="MQTT broker bound")
    thesis = sorted(THESIS_STEP_S[0.5].items())
    ax.plot([n for n, _ in thesis], [1000 * v[0] for _, v in thesis], "^:", label="thesis FT-tree (32 cores)")
    ax.set(xlabel="nodes", ylabel="ms per allreduce of 1.63 MB", title="allreduce of the thesis model's gradient")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def render_compare(doc: dict[str, Any], ctx: Context) -> str:
    from simulate.bench.compare import TABLE_HEADERS, table_rows

    parts = [f"Interleaved x{doc['alternations']} per fleet size (gloo, edgegrove, ...), "
             f"edgegrove {doc['rounds'] - doc['warmup']} measured rounds per run (slowest agent's "
             f"allreduce phase), gloo {doc['gloo_iterations']} iterations per run (slowest rank); "
             f"torch {doc.get('torch') or 'absent (no gloo arm)'}. 'x gloo': the arm's median over "
             "gloo's median in the same run. 'after last gradient': per round, from the moment the "
             "fleet's last agent had its gradient to the moment its last agent had the result (the "
             "agents' wall clocks, one host), the span gloo's barrier-then-allreduce times; the "
             "agent's own phase also holds its wait for the other agents' gradients, computed on "
             "the same 2 cores ('-': an arm whose agents do not report it). 'bound': bytes through the broker / its measured "
             "throughput; CPU: all agents' user + system seconds per round (median over runs)."]
    if doc.get("baseline"):
        parts.append("Arm `before`: the agents of the code before this change "
                     f"(`{doc['baseline']}`), measured in the same run.")
    if doc.get("agent_options"):
        parts.append(f"Agent options: `{' '.join(doc['agent_options'])}`.")
    if doc.get("own_options"):
        parts.append(f"Arms `edgegrove` and `edgegrove-fp16` only (not `before`): "
                     f"`{' '.join(doc['own_options'])}`.")
    if doc.get("note"):
        parts.append(str(doc["note"]))  # what the sitting's JSON alone does not say
    parts.append(markdown_table(TABLE_HEADERS, table_rows(doc)))
    return "\n\n".join(parts)


def render_model(doc: dict[str, Any], ctx: Context) -> str:
    rows = [[r["backend"], "error: " + r["error"]] + [""] * 6 if "error" in r else
            [r["backend"], r["step_ms_median"], r["step_ms_p90"], r["gradients_ms_median"],
             r["apply_ms_median"], r["create_ms"], r["peak_rss_mb"], r["rss_increase_mb"]]
            for r in doc.get("results", [])]
    first: dict[str, Any] = next((r for r in doc.get("results", []) if "error" not in r), {})
    return (f"Batch {first.get('batch', '?')}, optimizer {first.get('optimizer', '?')}, "
            f"{first.get('steps', '?')} timed steps per backend, each backend in its own process.\n\n"
            + markdown_table(["backend", "step ms (median)", "p90", "gradients ms", "apply ms",
                              "create ms", "peak RSS MB", "+MB"], rows))


def render_agent(doc: dict[str, Any], ctx: Context) -> str:
    peaks = ", ".join(f"{n}: {v} MB" for n, v in doc.get("peak_rss_mb", {}).items())
    rows = [[doc.get("nodes"), doc.get("backend"), doc.get("broker"), doc.get("rounds"),
             doc.get("peak_rss_mb_max"), doc.get("pi_budget_mb"), doc.get("round_seconds_median"),
             doc.get("round_seconds_p90")]]
    return (markdown_table(["agents", "backend", "broker", "rounds", "peak RSS max (MB)",
                            "Pi budget (MB)", "round s (median)", "round s (p90)"], rows)
            + f"\n\nPeak resident memory per agent: {peaks or '-'}.")


def render_allreduce(doc: dict[str, Any], ctx: Context) -> str:
    from simulate.bench.allreduce import BOUND_HEADERS, STEP_HEADERS, bound_table_rows, step_rows

    parts = [f"Each row is one real run: mosquitto, one agent process per node (ft-tree, MNIST), "
             f"{doc['rounds']} rounds, link cuts ({doc.get('via', 'broker')} side) in force from round "
             f"{doc['fault_window'][0]} to {doc['fault_window'][1]}. Measured: {doc['measure']}; "
             "median and p10-p90 over the rounds with the cut in force for the whole round (fault "
             "rows) or over the fault-free rounds. *extra* = fault median - fault-free median of the "
             "same run; *extra / T* in fixed timeouts; *transition max* = the slowest of the rounds "
             "in which a cut was made or healed. Fixed-T rows run with `remember_dead_links = false`: "
             "every round with the cut detects it again, as the thesis measured. Adaptive rows run "
             "as agents do by default: a dead link is remembered after the round that found it, so "
             "their fault rows show the steady cost of a permanent cut and the one detection shows in "
             "*transition max*; it also holds the cost of the cut itself: mosquitto's dynamic "
             "security disconnects a client whose role changes (once, about 0.2 s), and the frames "
             "in flight are lost (`--via agent` cuts in the agents instead). The thesis's figures "
             "(32-core server) beside.",
             markdown_table(STEP_HEADERS, step_rows(doc))]
    first: dict[Any, str] = {}
    for r in doc["results"]:  # a pass = one throughput measurement; its first cell's date
        date = str(r.get("measured") or "?")
        first[r.get("broker_mb_s")] = min(first.get(r.get("broker_mb_s"), date), date)
    passes = sorted((d, m) for m, d in first.items())
    if len(passes) > 1:
        parts.append("Cells come from several passes of the bench (`--merge`); a later pass replaced "
                     "the same cells of an earlier one. Passes (start, raw mosquitto MB/s measured at "
                     "its start): " + "; ".join(f"{d}, {m if m is not None else '?'} MB/s" for d, m in passes)
                     + ". Which cell came from which pass: the `measured` field of each result in "
                     "docs/results/allreduce.json.")
    bad = [r for r in doc["results"] if r.get("error") or not r.get("finished", True)]
    parts += [f"- **incomplete** {r['nodes']} {r['scenario']} {r['timeout']} {r['wire_dtype']}: "
              f"{'over its time budget; ' if not r.get('finished', True) else ''}{r.get('error') or ''}"
              for r in bad]
    parts.append(f"**The physical bound in the same run.** Raw mosquitto throughput "
                 f"{doc.get('throughput_mb_s')} MB/s (in + out; one publisher, one subscriber, one "
                 "chunk frame; `bench broker`'s measurement). Bytes per fault-free allreduce from the "
                 "model (`allreduce_traffic`) and from the agents' telemetry (link bytes sent + "
                 "received, summed over agents, median round):")
    parts.append(markdown_table(BOUND_HEADERS, bound_table_rows(doc)))
    ok = [r for r in doc["results"] if r.get("step_s")]
    if ok:
        parts.append(ctx.image("allreduce.png", lambda p: _plot_allreduce(ok, p),
                               "allreduce step time per scenario, ours vs the thesis"))
    return "\n\n".join(parts)


def _plot_allreduce(rows: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    scenarios = ["no_faults", "one_fault", "two_parallel", "two_serial"]
    timeouts = sorted({r["timeout"] for r in rows if r["scenario"] != "no_faults"}) or ["adaptive"]
    sizes = sorted({r["nodes"] for r in rows if r["scenario"] != "no_faults"}) or sorted({r["nodes"] for r in rows})
    fig, axes = plt.subplots(1, len(sizes), figsize=(5 * len(sizes), 4), squeeze=False)
    for ax, nodes in zip(axes[0], sizes, strict=True):
        width = 0.8 / (len(timeouts) + 1)
        for i, label in enumerate(timeouts):
            ys = []
            for sc in scenarios:
                match = [r for r in rows if r["nodes"] == nodes and r["scenario"] == sc and r["wire_dtype"] == "float32"
                         and (r["timeout"] == label or sc == "no_faults")]
                ys.append(match[0]["step_s"]["median"] if match else 0.0)
            ax.bar([x + i * width for x in range(len(scenarios))], ys, width, label=f"ours, {label}")
        thesis = THESIS_STEP_S[0.5].get(nodes)
        if thesis:
            ax.bar([x + len(timeouts) * width for x in range(len(scenarios))], list(thesis), width,
                   label="thesis, 0.5 s", color="grey", alpha=0.6)
        ax.set_xticks([x + 0.4 for x in range(len(scenarios))], [s.replace("_", " ") for s in scenarios], fontsize=8)
        ax.set(title=f"{nodes} agents", ylabel="allreduce step (s), median")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _decay(doc: dict[str, Any]) -> str:
    schedule = doc.get("lr_schedule", "constant")
    if schedule == "constant":
        return ""
    return f", decaying {schedule}ly to {doc.get('lr_final')}x by the last round (the baseline alike)"


def _agent_options(doc: dict[str, Any]) -> str:
    """The extra agent options a bench ran with, as a sentence fragment."""
    return ", ".join(f"{k}={v}" for k, v in (doc.get("agent_options") or {}).items()) or "none"


def render_accuracy(doc: dict[str, Any], ctx: Context) -> str:
    from simulate.bench.accuracy import TABLE_HEADERS, table_rows

    opts = _agent_options(doc)
    parts = [f"{doc['nodes']} agents x batch {doc['batch']} = {doc['samples_per_step']} samples per "
             f"round, Adam lr {doc['lr']} (the single-machine lr 1e-3 for batch 100, raised for the "
             f"7x larger effective batch){_decay(doc)}, {doc['rounds']} rounds, test set evaluated every "
             f"{doc['eval_every']} rounds. Extra agent options: {opts}. {doc.get('method', '')}. "
             f"Target {doc['target']:.0%}.",
             markdown_table(TABLE_HEADERS, table_rows(doc))]
    shown = doc.get("must_show") or {}
    if "ft_tree_accuracy" in shown:
        parts.append(f"- ft-tree without faults: {shown['ft_tree_accuracy']:.4f} at its last evaluation "
                     f"({'reaches' if shown['ft_tree_reaches_target'] else '**misses**'} {shown['target']:.0%}).")
    if "drop_pp" in shown:
        parts.append(f"- ft-tree with {shown['loss']:.0%} chunk loss at the same round {shown['round']}: "
                     f"{shown['lossy_accuracy']:.4f}, a drop of {shown['drop_pp']:.2f} percentage points "
                     f"({'within' if shown['loss_within_bound'] else '**beyond**'} {shown['max_drop_pp']} pp).")
    if any(r.get("curve") for r in doc["results"]):
        parts.append(ctx.image("accuracy.png", lambda p: _plot_accuracy(doc, p),
                               "test accuracy vs round and vs wall time"))
    return "\n\n".join(parts)


def render_figure13(doc: dict[str, Any], ctx: Context) -> str:
    """The thesis's Figure 13 reproduced: its five algorithms, accuracy against wall time."""
    from simulate import figure13
    from simulate.bench.accuracy import TABLE_HEADERS, table_rows

    parts = [f"{doc['nodes']} agents x batch {doc['batch']} = {doc['samples_per_step']} samples per "
             f"round, Adam lr {doc['lr']}{_decay(doc)}, {doc['rounds']} rounds, test set evaluated every "
             f"{doc['eval_every']} rounds, each algorithm one run, one after the other in one sitting. "
             f"Extra agent options: {_agent_options(doc)}. {doc.get('method', '')}. Target "
             f"{doc['target']:.0%}. {figure13.METHOD}",
             *([str(doc["note"])] if doc.get("note") else []),  # what the sitting's JSON alone does not say
             markdown_table(TABLE_HEADERS, table_rows(doc)),
             ctx.image("figure13.png", lambda p: figure13.plot(doc, p, pyplot()),
                       "test accuracy vs wall time: ps-sync, ps-async, ring, tree, ft-tree"),
             "\n".join(figure13.sentences(doc)),
             figure13.reading(doc),
             ctx.image("figure13-rounds.png", lambda p: _plot_accuracy(doc, p),
                       "the same runs: test accuracy vs round and vs wall time")]
    return "\n\n".join(parts)


def render_tta(doc: dict[str, Any], ctx: Context) -> str:
    """Time and bytes to a target accuracy per link rate and sync period (issue 39)."""
    from simulate import tta_report
    from simulate.bench import tta_runs

    parts = [f"{doc['nodes']} agents, target {doc['target_accuracy']:.0%} test accuracy, each run one real "
             f"fleet on mosquitto, one after the other in one sitting. Extra agent options: {_agent_options(doc)}. "
             f"Seconds: {doc.get('method', '')}.",
             *([str(doc["note"])] if doc.get("note") else []),
             markdown_table(tta_report.HEADERS, tta_report.table_rows(doc)),
             "\n".join(tta_report.verdicts(doc)),
             ctx.image("tta.png", lambda p: tta_runs.plot(doc["results"], doc["target_accuracy"], p),
                       "seconds and bytes to the target against the link rate, per sync period")]
    return "\n\n".join(p for p in parts if p)


def _plot_accuracy(doc: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    fig, (by_round, by_time) = plt.subplots(1, 2, figsize=(11, 4))
    series = [(r["label"], r["curve"]) for r in doc["results"] if r.get("curve")]
    base = doc.get("baseline") or {}
    if base.get("curve"):
        series.append((f"single machine (batch {doc['samples_per_step']})", base["curve"]))
    for label, points in series:
        by_round.plot([p["round"] for p in points], [p["accuracy"] for p in points], "o-", ms=3, label=label)
        timed = [p for p in points if p.get("seconds") is not None]
        by_time.plot([p["seconds"] for p in timed], [p["accuracy"] for p in timed], "o-", ms=3, label=label)
    for ax, xlabel in ((by_round, "round"), (by_time, "seconds since the fleet was ready")):
        ax.axhline(doc["target"], color="grey", ls=":", lw=1)
        ax.set(xlabel=xlabel, ylabel="test accuracy", ylim=(0.9, 1.0))
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def render_loss(doc: dict[str, Any], ctx: Context) -> str:
    from simulate.bench.loss import TABLE_HEADERS, table_rows

    opts = _agent_options(doc)
    parts = [f"ft-tree, {doc['rounds']} rounds, Adam lr {doc['lr']}, batch {doc['batch']} per agent, "
             f"extra agent options: {opts}. {doc.get('method', '')}. *drop* = accuracy at p = 0 minus "
             "accuracy at p, same fleet size, same round (percentage points).",
             markdown_table(TABLE_HEADERS, table_rows(doc))]
    if any(r.get("final_accuracy") is not None for r in doc["results"]):
        parts.append(ctx.image("loss.png", lambda p: _plot_loss(doc, p), "accuracy vs chunk loss p"))
    return "\n\n".join(parts)


def _plot_loss(doc: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for nodes in sorted({r["nodes"] for r in doc["results"]}):
        rows = sorted((r for r in doc["results"] if r["nodes"] == nodes and r["final_accuracy"] is not None),
                      key=lambda r: r["p"])
        ax.plot([r["p"] for r in rows], [r["final_accuracy"] for r in rows], "o-", label=f"{nodes} agents")
    ax.set(xlabel="chunk loss p (each link frame)", ylabel=f"test accuracy after {doc['rounds']} rounds",
           title="ft-tree under chunk loss")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def render_silent(doc: dict[str, Any], ctx: Context) -> str:
    from simulate.bench.silent import TABLE_HEADERS, table_rows

    return "\n\n".join([
        f"{doc.get('method', '')}. A short hang of {doc['short_rounds']} rounds, a long one of "
        f"~{doc['long_seconds']:.0f} s (longer than the broker's Will); *silent round* = the "
        "slowest survivor's allreduce, plus any wait for the round to start (a dead root's tree "
        "waiting for the view without it), in the round the node froze in (and the next); the "
        "p90 and worst while silent stand beside the fault-free run's, whose checkpoint and "
        "evaluation rounds are as slow; *rounds to rejoin* = rounds after the resume/restart "
        "until the node reports a round with the fleet's model hash (a restart counts the "
        "process's start-up), *after its start-up* the same from the fleet's round when the "
        "restarted agent was online again; *rounds over 1.5x median* while silent stand beside "
        "the fault-free run's share of such rounds (the checkpoint and evaluation rounds); "
        "*ordinary* rounds are those that are not a checkpoint round (every 20th) or one of the "
        "two evaluation rounds (every 25th): *ordinary rounds over 1.5x median* counts only "
        "those, *worst ordinary* is the slowest of them while silent and in the 20 rounds after "
        "the rejoin; *median before, same run* is the median of the ordinary rounds in the 20 "
        "before the episode, in the fault run itself (a shared host's load can differ between "
        "the fault-free run and the fault run), with the ordinary rounds while silent over 1.5x "
        "that one; *accuracy drop* against the fault-free run of the same size.",
        markdown_table(TABLE_HEADERS, table_rows(doc))])


def render_links(doc: dict[str, Any], ctx: Context) -> str:
    from simulate.bench.links import (
        FLOOR_RATE_MB_S,
        TABLE_HEADERS,
        criteria_lines,
        incomplete,
        run_label,
        table_rows,
    )

    kernel = doc.get("shaper") == "kernel"
    path_word = "link" if kernel else "proxy"
    opts = _agent_options(doc)
    loads = [r["load_1m_at_start"] for r in doc["results"] if r.get("load_1m_at_start") is not None]
    parts = [f"{doc['nodes']} agents, {doc['rounds']} rounds per run, every agent's link limited from "
             f"round 1; {doc.get('method', '')}. Extra agent options: {opts}. *median allreduce*: the "
             f"slowest agent's allreduce phase, median over the rounds from round "
             f"{doc['measured_from_round']} on. *bound*: the busiest link's bound, the most bytes "
             "(MQTT packets: data chunks and their ACKs) one fault-free allreduce moves through one "
             f"agent's {path_word} in one direction, over the rate: an inner node of the binary tree, ~3 x "
             "the vector each way at the wire's bytes per value (with the root's fan-out, which a "
             "fleet on links below 100 MB/s switches to by a view, the same 3 vectors cross an inner "
             "node's downlink: its children's units and the fan-out). *after last gradient*: per "
             "round, from the moment the last agent had its gradient to the moment the last agent "
             "had the result (the agents' wall clocks, one host), median over the same rounds, and "
             "its ratio to the bound; the agent's own phase also holds its wait for the other "
             "agents' gradients, computed on the same cores. *bytes/model*: link bytes the agents "
             "sent per round over the wire frames of one fault-free allreduce relayed down the tree "
             "(median and max over the same rounds; a fan-out round sends ~0.6 of them). *accuracy*: the full test set after the last round, the same rounds "
             "for every wire format; *vs float32*: minus float32's at the same rate (pp). *auto*: "
             "each agent picks every frame's format from its links' measured rates (the link's drains, "
             "and its own link's rate from large messages' arrival); its bound and "
             "bytes/model are those of the format its agents sent most frames in (in brackets)."
             + (f" The host's 1-minute load average at the runs' starts: {min(loads):.1f} – "
                f"{max(loads):.1f} on {(doc.get('machine') or {}).get('cpu_count', '?')} cores "
                "(other processes, such as other fleets, shared the CPU)." if loads else ""),
             markdown_table(TABLE_HEADERS, table_rows(doc))]
    if floors := doc.get("floor"):
        through = ("the same namespaces and qdiscs" if kernel else "the same proxies")
        cores = "the broker and every agent" if kernel else "the broker, every agent and the simulator's proxies"
        parts.append(f"*no limit*: the same fleet and rounds through {through} limiting nothing "
                     f"({FLOOR_RATE_MB_S / 1000:g} GB/s), "
                     f"run first in the same sitting (the host's own floor: its cores run {cores}); *x max(bound, "
                     "no limit)*: the median over the larger of the link's bound and that floor. Where the bound "
                     "is below the floor the link is not what limits the round on this host.\n\n"
                     + markdown_table(["wire, no link limit", "median allreduce s", "after last gradient s",
                                       "degraded rounds"],
                                      [[f["wire_dtype"], f["allreduce_s_median"], f.get("after_last_gradient_s_median"),
                                        f"{f['degraded_rounds']} of {f['rounds']}"] for f in floors]))
    if lines := [f"- **incomplete** {run_label(r, doc.get('repeats', 1))}: {why}"
                 for r in doc["results"] if (why := incomplete(r))]:
        parts.append("\n".join(lines))
    if doc["results"]:
        parts.append("Issue 19's *must show* items these runs decide:\n\n"
                     + "\n".join(f"- {line}" for line in criteria_lines(doc)))
    if any(r.get("allreduce_s_median") is not None for r in doc["results"]):
        image = ("links-kernel" if kernel else "links") + ("" if doc["nodes"] == 7 else f"-{doc['nodes']}")
        parts.append(ctx.image(f"{image}.png", lambda p: _plot_links(doc, p),
                               "median allreduce and its ratio to the busiest link's bound vs link rate"))
    return "\n\n".join(parts)


def _plot_links(doc: dict[str, Any], path: Path) -> None:
    from simulate.bench.links import MAX_RATIO_TO_BOUND

    plt = pyplot()
    fig, (times, ratios) = plt.subplots(1, 2, figsize=(11, 4))
    for i, dtype in enumerate(dict.fromkeys(r["wire_dtype"] for r in doc["results"])):
        rows = [r for r in doc["results"] if r["wire_dtype"] == dtype and r.get("allreduce_s_median")
                and r.get("ratio_to_bound") is not None]  # (an auto run whose agents named no format: none)
        color = f"C{i}"
        by_rate = sorted({r["rate_mb_s"] for r in rows})
        for ax, key in ((times, "allreduce_s_median"), (ratios, "ratio_to_bound")):
            ax.plot([r["rate_mb_s"] for r in rows], [r[key] for r in rows], "o", color=color, alpha=0.5)
            ax.plot(by_rate, [statistics.median(r[key] for r in rows if r["rate_mb_s"] == x) for x in by_rate],
                    "-", color=color, label=dtype if ax is ratios else f"{dtype}, median")
            bad = [r for r in rows if r["degraded_rounds"]]
            ax.plot([r["rate_mb_s"] for r in bad], [r[key] for r in bad], "o", ms=11, mfc="none", mec="red")
        bounds = sorted({(r["rate_mb_s"], r["bound_s"]) for r in rows})
        times.plot([b[0] for b in bounds], [b[1] for b in bounds], "x:", color=color, label=f"{dtype}, bound")
    ratios.axhline(MAX_RATIO_TO_BOUND, color="grey", ls="--", lw=1, label=f"{MAX_RATIO_TO_BOUND}x (issue 19)")
    times.set(xscale="log", yscale="log", xlabel="link rate per agent, each way (MB/s)",
              ylabel="allreduce (s)", title=f"{doc['nodes']} agents, every link limited")
    if any(r["degraded_rounds"] for r in doc["results"]):
        ratios.plot([], [], "o", ms=11, mfc="none", mec="red", label="run with degraded rounds")
    ratios.set(xscale="log", xlabel="link rate per agent, each way (MB/s)",
               ylabel="median allreduce / busiest link's bound", ylim=(0, None))
    rates = sorted({r["rate_mb_s"] for r in doc["results"]})
    for ax in (times, ratios):
        ax.minorticks_off()
        ax.set_xticks(rates, [f"{x:g}" for x in rates])
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def render_flower(doc: dict[str, Any], ctx: Context) -> str:
    return flower_report.render(doc, ctx)


def render_allreduce_reference() -> str:
    rows = [[f"{timeout} s", nodes, *(f"{v:.3f}" for v in values)] for timeout, table in THESIS_STEP_S.items()
            for nodes, values in table.items()]
    return ("The thesis's Tables 1 and 2 (allreduce step in seconds, 32-core server), the "
            "figures to print beside ours:\n\n"
            + markdown_table(["timeout", "nodes", *THESIS_COLUMNS], rows))


def render_generic(doc: dict[str, Any], ctx: Context) -> str:
    """A bench this generator does not know yet: its scalar fields and results as tables."""
    scalars = [[k, v] for k, v in doc.items() if k not in ("benchmark", "machine") and _scalar(v)]
    parts = [markdown_table(["field", "value"], scalars)] if scalars else []
    results = doc.get("results")
    if isinstance(results, list) and results and all(isinstance(r, dict) for r in results):
        keys = [k for k in results[0] if _scalar(results[0][k]) or _has_median(results[0][k])]
        parts.append(markdown_table(keys, [[_flat(r.get(k)) for k in keys] for r in results]))
    elif results is not None:
        parts.append("```json\n" + json.dumps(results, indent=1)[:4000] + "\n```")
    return "\n\n".join(parts) or "_(the document holds no figures)_"


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _has_median(value: Any) -> bool:
    return isinstance(value, dict) and "median" in value


def _flat(value: Any) -> Any:
    return value["median"] if _has_median(value) else value


SECTIONS: tuple[Section, ...] = (
    Section("broker", "The physical bound: raw broker throughput",
            "edgegrove bench broker --out docs/results/broker.json",
            "What mosquitto (and the embedded broker) can move on this machine with plain paho "
            "clients, for the payloads the allreduce sends; the bound of one allreduce.",
            render_broker),
    Section("allreduce", "Allreduce step duration (thesis Tables 1 and 2)",
            "edgegrove bench allreduce --out docs/results/allreduce.json",
            "Step time for 7, 15, 31 (63) agents with no fault, 1 fault, 2 parallel and 2 serial "
            "faults, fixed 0.5 s / 1 s and adaptive timeouts; ratio to the broker bound.",
            render_allreduce),
    Section("accuracy", "Accuracy and time to accuracy (thesis Figure 13)",
            "edgegrove bench accuracy --out docs/results/accuracy.json",
            "MNIST test accuracy for tree, ft-tree and rps and the single-machine baseline.",
            render_accuracy),
    Section("figure13", "Figure 13 reproduced: parameter servers, ring, tree and FT-tree (issue 42)",
            "edgegrove bench accuracy --nodes 7 --rounds 300 --eval-every 25 --algorithms ps-sync "
            "ps-async ring tree ft-tree --loss 0 --target 0.97 --out docs/results/figure13.json",
            "The thesis compares FT-tree with a synchronous and an asynchronous parameter server and "
            "Keras's ring allreduce (its Figure 13); here all five run on our transport (MQTT, one "
            "agent process per node), accuracy against rounds and against wall time.",
            render_figure13),
    Section("loss", "Accuracy under chunk loss (the RPS paper's claim)",
            "edgegrove bench loss --out docs/results/loss.json",
            "Accuracy after a fixed number of rounds for chunk loss p in {0, 0.05, 0.1, 0.2, 0.3}.",
            render_loss),
    Section("silent", "Silent and crashed nodes: a frozen root, inner node or leaf",
            "edgegrove bench silent --out docs/results/silent.json",
            "A node frozen with SIGSTOP (its connection open, no Will for 15 s) or killed: what "
            "the round it goes silent in costs, the rounds while it is silent, and how fast it "
            "is back with the fleet's model.",
            render_silent),
    Section("links", "Slow links: every agent's link limited, by wire format (issue 19)",
            "edgegrove bench links --out docs/results/links.json",
            "Every agent's link limited to 2, 6, 12.5 or 50 MB/s each way from round 1 (its TCP "
            "proxy), float32, float16 and int8 on the wire: allreduce time against the busiest "
            "link's bound, degraded rounds (a congestion collapse), bytes per round, accuracy.",
            render_links),
    Section("links-kernel", "Slow links limited in the kernel: no proxy in the path (issue 19)",
            "edgegrove bench links --shaper kernel --out docs/results/links-kernel.json",
            "The same grid with every agent in a network namespace of its own and a tbf qdisc on "
            "each direction of its veth link, as on a real link: the figures without the cost of "
            "the simulator's proxies, whose CPU shares the host's cores with the fleet.",
            render_links),
    Section("links-kernel-15", "Slow links limited in the kernel, 15 agents (issue 19)",
            "edgegrove bench links --nodes 15 --shaper kernel --out docs/results/links-kernel-15.json",
            "The kernel-limited grid at 15 agents, where the host allows: the same busiest link "
            "(an inner node of the binary tree), a deeper tree, twice the processes on the same cores.",
            render_links),
    Section("periodic", "Periodic averaging: time to accuracy with --sync-every (issue 39)",
            "edgegrove simulate --sync-every H ... per run, then python -m simulate.bench.tta "
            "--out docs/results/periodic.json RUN_DIRS",
            "7 agents, every agent's link limited in the kernel (tbf): wall time, bytes and samples "
            "to a target test accuracy with the gradient averaged every step and with H local steps "
            "per sync; each run's simulate command is in the JSON.",
            None),
    Section("tta", "Time to accuracy on slow links: every-step against periodic averaging (issue 39)",
            "edgegrove bench tta --links 0 6 2 --sync-every 1 auto --rounds 420 40 --agent-option lr=0.003 "
            "--out docs/results/tta.json --plot docs/img/tta.png",
            "7 agents, every agent's link limited in the kernel (tbf) or unlimited: wall time, bytes and "
            "samples to 97 % test accuracy averaging every step and with --sync-every auto, and the "
            "accuracy of each after the same data.",
            render_tta),
    Section("isolation", "Failed links until a node is isolated (thesis Figure 11)",
            "edgegrove bench isolation --out docs/results/isolation.json",
            "From the protocol core: how many random link failures the FT-tree survives.",
            render_isolation),
    Section("compare", "Fault-free speed side by side: gloo and edgegrove in one run",
            "edgegrove bench compare --baseline DIR --out docs/results/compare.json",
            "gloo and an edgegrove fleet interleaved on the same host, same N, same vector: "
            "median step, ratio, broker bound, agents' CPU per round (issue 13).",
            render_compare),
    Section("flower", "Side by side with Flower: the framework users would pick instead (issue 42)",
            "edgegrove bench flower --nodes 7 --out docs/results/flower.json",
            "A real Flower 1.42 deployment (SuperLink, one SuperNode per client, FedAvg) and an "
            "Edgegrove fleet with the same clients, model, data and target, alternating in one "
            "sitting: round time, time and bytes to the target, memory per client, and the same "
            "faults (a client, the server/coordinator restarted; a 6 MB/s link).",
            render_flower),
    Section("gloo", "For scale: torch.distributed gloo allreduce",
            "edgegrove bench gloo --out docs/results/gloo.json",
            "A fault-intolerant direct-TCP allreduce of the same 1.63 MB vector among the same "
            "number of local processes (optional: needs torch).",
            render_gloo),
    Section("model", "Model: training step time and memory",
            "edgegrove bench model --json > docs/results/model.json",
            "ms per training step of the numpy and litert backends.", render_model),
    Section("agent", "Agent: memory and round time in a small real fleet",
            "edgegrove bench agent --json > docs/results/agent.json",
            "Peak resident memory per agent against the Raspberry Pi budget.", render_agent),
)


# ---------------------------------------------------------------------------------------
# Loading and assembling
# ---------------------------------------------------------------------------------------

def load_results(results_dir: Path) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Documents by bench name (the file's stem), and the files that could not be read."""
    docs: dict[str, dict[str, Any]] = {}
    problems: dict[str, str] = {}
    for path in sorted(results_dir.glob("*.json")) if results_dir.is_dir() else []:
        try:
            doc = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            problems[path.stem] = f"{path.name} is not valid JSON ({exc})"
            continue
        if not isinstance(doc, dict):
            problems[path.stem] = f"{path.name} holds a JSON {type(doc).__name__}, not an object"
            continue
        docs[path.stem] = doc
    return docs, problems


def machine_line(machine: dict[str, Any] | None) -> str:
    if not machine:
        return "machine not recorded in the JSON"
    return (f"{machine.get('date', '?')} on {machine.get('cpu_model', '?')} "
            f"({machine.get('cpu_count', '?')} cores), Python {machine.get('python', '?')}, "
            f"mosquitto {machine.get('mosquitto') or 'absent'}")


def render_section(section: Section, ctx: Context, problems: dict[str, str]) -> tuple[str, str]:
    """(status, markdown) of one bench: measured, missing or unreadable."""
    head = f"## {section.title}\n\n{section.why}\n\n"
    if section.bench in problems:
        return "unreadable", head + (f"> **Could not be read:** {problems[section.bench]}. "
                                     f"Measure again: `{section.command}`\n")
    doc = ctx.docs.get(section.bench)
    if doc is None:
        extra = "\n\n" + render_allreduce_reference() if section.bench == "allreduce" else ""
        return "missing", head + (f"> **Not yet measured.** Run `{section.command}`, then "
                                  f"`edgegrove bench report`.{extra}\n")
    render = section.render or render_generic
    try:
        body = render(doc, ctx)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        body = (f"> **Could not render** its JSON ({type(exc).__name__}: {exc}); raw figures "
                f"below.\n\n{render_generic(doc, ctx)}")
    if section.bench == "allreduce":
        body += "\n\n" + render_allreduce_reference()
    return "measured", head + f"_Measured {machine_line(doc.get('machine'))}._\n\n{body}\n"


def build(results_dir: Path, out: Path, img_dir: Path) -> tuple[str, dict[str, str], list[Path]]:
    """The markdown, the status of each section, and the images drawn."""
    docs, problems = load_results(results_dir)
    prefix = _relative(img_dir, out.parent)
    ctx = Context(docs, img_dir, prefix)
    statuses: dict[str, str] = {}
    bodies = []
    for section in SECTIONS:
        statuses[section.bench], text = render_section(section, ctx, problems)
        bodies.append(text)
    known = {s.bench for s in SECTIONS}
    for name in sorted((set(docs) | set(problems)) - known):
        extra = Section(name, f"Other: {name}", f"edgegrove bench {name} --out docs/results/{name}.json",
                        f"`{name}.json`, a bench this report has no special layout for.")
        statuses[name], text = render_section(extra, ctx, problems)
        bodies.append(text)
    return _header(statuses, docs) + "\n".join(bodies), statuses, ctx.images


def _relative(img_dir: Path, base: Path) -> str:
    try:
        return str(img_dir.resolve().relative_to(base.resolve())) + "/"
    except ValueError:
        return str(img_dir.resolve()) + "/"


def _header(statuses: dict[str, str], docs: dict[str, dict[str, Any]]) -> str:
    here = machine_info()
    machines = {machine_line(d.get("machine")) for d in docs.values() if d.get("machine")}
    rows = [[name, {"measured": "measured", "missing": "**not yet measured**",
                    "unreadable": "**unreadable**"}[status]] for name, status in statuses.items()]
    return "\n\n".join([
        "# Edgegrove — evaluation",
        "_Generated by `edgegrove bench report` from `docs/results/*.json`; do not edit by hand: "
        "measure again and regenerate._",
        f"Report generated {here['date']} on {here['cpu_model']} ({here['cpu_count']} cores, "
        f"{here['platform']}), Python {here['python']}, mosquitto {here['mosquitto'] or 'absent'}. "
        "Each section says where its own figures were measured"
        + (":\n\n" + "\n".join(f"- {m}" for m in sorted(machines)) if machines else "."),
        "Machine noise: the development machine has 2 shared cores; medians over repeats are "
        "given with their spread, and figures from different runs are not exactly comparable.",
        markdown_table(["bench", "status"], rows), ""])


# ---------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results", type=Path, default=REPO_ROOT / "docs" / "results",
                        help="directory of the benches' JSON documents (<bench>.json)")
    parser.add_argument("--out", type=arg(output_file), default=REPO_ROOT / "docs" / "EVALUATION.md",
                        help="the markdown file to write")
    parser.add_argument("--img", type=arg(output_dir), default=None,
                        help="directory for the plots (default: img/ beside --out)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON document (what was written, each section's status)")


def run(args: argparse.Namespace) -> int:
    img_dir = args.img if args.img is not None else args.out.parent / "img"
    if not args.results.is_dir():
        print(f"edgegrove bench report: no results directory {args.results}: run the benches "
              "with --out docs/results/<bench>.json first (every section will say "
              "'not yet measured')", file=sys.stderr)
    text, statuses, images = build(args.results, args.out, img_dir)
    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    except OSError as exc:
        print(f"edgegrove bench report: cannot write {args.out}: {exc}", file=sys.stderr)
        return 2
    for name, status in statuses.items():
        if status == "unreadable":
            print(f"edgegrove bench report: {name}: unreadable JSON in {args.results}",
                  file=sys.stderr)
    if args.json:
        print(json.dumps({"written": str(args.out), "sections": statuses,
                          "images": [str(p) for p in images]}))
    else:
        print(f"wrote {args.out} ({sum(s == 'measured' for s in statuses.values())} measured, "
              f"{sum(s == 'missing' for s in statuses.values())} not yet measured) and "
              f"{len(images)} plot(s) in {img_dir}")
    return 0
