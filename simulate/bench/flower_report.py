"""The EVALUATION section of `edgegrove bench flower` (docs/results/flower.json)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simulate.bench.common import markdown_table
from simulate.evaluation_context import Context, pyplot

FAULT_TEXT = {
    "none": "no fault",
    "client-restart": "a client killed mid-round, restarted",
    "server-restart": "Flower's SuperLink / our coordinator (agent 0) killed mid-round, restarted",
    "link-6mbps": "one client's link limited to 6 MB/s each way",
}


def render(doc: dict[str, Any], ctx: Context) -> str:
    from simulate.bench.flower import TABLE_HEADERS, table_rows

    plan = doc["plan"]
    machine = doc.get("machine") or {}
    parts = [
        f"{doc['nodes']} clients on one host ({machine.get('cpu_model', '?')}, "
        f"{machine.get('cpu_count', '?')} cores), target {doc['target']:.0%} test accuracy, "
        f"partition {plan['partition']}. Flower {doc['flwr']}: {plan['flower_local_steps']} local "
        f"steps of batch {plan['batch']} per round, Adam lr {plan['flower_lr']}, FedAvg. Edgegrove: "
        f"ft-tree, one step of batch {plan['batch']} per round, Adam lr {plan['edgegrove_lr']} "
        f"(linear decay), evaluated every {plan['eval_every']} rounds. {doc.get('method', '')}",
        markdown_table(TABLE_HEADERS, table_rows(doc)),
        _faults(doc),
        _tuning(doc),
    ]
    load = doc.get("load_average") or {}
    if load:
        parts.insert(1, f"Host load average (1, 5, 15 min) before the runs {load.get('before')}, "
                        f"after {load.get('after')}, on {machine.get('cpu_count', '?')} cores.")
    done, planned = doc.get("arms_done"), doc.get("arms_planned")
    if done is not None and planned is not None and done < planned:
        parts.insert(1, f"**Incomplete sitting: {done} of {planned} pairs of runs measured** "
                        "(the rest were not run; nothing below stands for them).")
    if doc.get("host_note"):
        parts.insert(1, f"**{doc['host_note']}**")
    clean = [r for r in doc["results"] if r["fault"] == "none"]
    if any(r[s].get("curve") for r in clean for s in ("flower", "edgegrove")):
        parts.append(ctx.image("flower.png", lambda p: _plot(clean, doc["target"], p),
                               "test accuracy vs seconds, Flower and Edgegrove"))
    return "\n\n".join(p for p in parts if p)


def _faults(doc: dict[str, Any]) -> str:
    lines = []
    for r in doc["results"]:
        if r["fault"] == "none":
            continue
        for system in ("flower", "edgegrove"):
            e = r[system]
            spread = e.get("round_s") or {}
            how = FAULT_TEXT.get(r["fault"], r["fault"])
            where = f"at round {e['fault_at_round']}" if e.get("fault_at_round") is not None else ""
            back = (f"; every client's update again from round {e['all_back_at_round']}"
                    if e.get("all_back_at_round") is not None else "")
            done = "finished" if e.get("finished") else (
                f"**did not end** (no round after {e.get('stalled_after_round')}"
                + (f"; {e['gave_up']})" if e.get("gave_up") else ")")
                if not e.get("error") else f"**error**: {e['error']}")
            lines.append(f"- {system}, {how} {where}: {done}; {e.get('rounds')} rounds, slowest "
                         f"{spread.get('max')} s (median {spread.get('median')} s); "
                         f"rounds without every client's update: "
                         f"{len(e.get('rounds_missing_updates') or [])}{back}.")
    return ("Faults (same clients, same partition):\n\n" + "\n".join(lines)) if lines else ""


def _tuning(doc: dict[str, Any]) -> str:
    rows = [[_cell(t[k]) for k in ("setting", "options", "used", "why")] for t in doc.get("tuning", [])]
    if not rows:
        return ""
    return ("Flower's speed settings (from its documentation and code) and what the bench used:\n\n"
            + markdown_table(["setting", "options", "used", "why"], rows))


def _cell(text: str) -> str:
    """A markdown table cell: a '|' inside it would split the cell."""
    return str(text).replace("|", "\\|")


def _plot(clean: list[dict[str, Any]], target: float, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in clean:
        for system in ("flower", "edgegrove"):
            points = [p for p in r[system].get("curve") or [] if (p.get("seconds") or 0) > 0]
            ax.plot([p["seconds"] for p in points], [p["accuracy"] for p in points], "o-", ms=3,
                    label=f"{system} ({r['partition']})")
    ax.axhline(target, color="grey", ls=":", lw=1)
    ax.set(xlabel="seconds since all clients were online", ylabel="test accuracy",
           xscale="log", title="Flower (FedAvg) and Edgegrove (ft-tree), same clients and data")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
