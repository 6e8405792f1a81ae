"""`edgegrove bench tta`: wall time, bytes and samples to a target test accuracy, for every link
rate x sync period, each a real `edgegrove simulate` fleet on mosquitto.

    edgegrove bench tta --links 2 6 12.5 --sync-every 1 8 auto --rounds 250 40 40

Every agent's link is limited in the kernel (tbf, as `bench links`; 0: unlimited loopback). Each
run's figures come from its event log (simulate/bench/tta.py: the seconds from the end of the
fleet's first round to the end of the first round whose mean test accuracy reached the target).
Writes the table, the JSON (docs/results/tta.json) and a plot of seconds and bytes to the target
against the link rate, one line per sync period (docs/img/tta.png).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

from agent.config import parse_sync_every
from agent.validate import UsageError, arg
from simulate.bench.common import document, emit, format_table
from simulate.bench.tta import accuracy_at_samples, time_to_accuracy

DESCRIPTION = __doc__


def link_rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"link rate {text!r} is not a number of MB/s (0: unlimited)") from None
    if not 0 <= value <= 10_000:
        raise UsageError(f"link rate {text} must be 0 (unlimited) to 10000 MB/s")
    return value


def sync_every(text: str) -> str:
    try:
        parse_sync_every(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return text.strip()


def rounds(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise UsageError(f"rounds {text!r} must be a whole number, 1 or more")
    return int(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--links", type=arg(link_rate), nargs="+", default=[6.0], metavar="MBS",
                        help="every agent's link rate in MB/s, limited in the kernel; 0: unlimited")
    parser.add_argument("--sync-every", type=arg(sync_every), nargs="+", default=["1", "8", "auto"], metavar="H",
                        help="sync periods to compare (a whole number or auto)")
    parser.add_argument("--rounds", type=arg(rounds), nargs="+", default=[250, 40, 40],
                        help="rounds of each sync period's runs (one for all, or one per --sync-every value)")
    parser.add_argument("--nodes", type=int, default=7, help="agents per fleet")
    parser.add_argument("--target", type=float, default=0.97, help="test accuracy to reach")
    parser.add_argument("--eval-every", type=int, default=2, help="rounds between evaluations")
    parser.add_argument("--agent-option", action="append", default=[], metavar="KEY=VALUE",
                        help="extra agent option for every run, as simulate takes it, e.g. lr=0.003 (repeatable)")
    parser.add_argument("--runs-dir", type=Path, default=Path("runs/tta"), help="where the runs go")
    parser.add_argument("--reuse", action="store_true", help="take runs already in --runs-dir instead of running them")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here (e.g. docs/results/tta.json)")
    parser.add_argument("--plot", type=Path, default=None, help="write the plot here (e.g. docs/img/tta.png)")
    parser.add_argument("--json", action="store_true", help="print the JSON document instead of the table")


def scenario_text(name: str, nodes: int, rounds: int, rate_mbs: float, eval_every: int) -> str:
    """A fault-free scenario whose agents' links are limited to ``rate_mbs`` from round 0."""
    lines = [f'name = "{name}"', "[fleet]", f"nodes = {nodes}", f"rounds = {rounds}", "[agent]",
             f"eval_every = {eval_every}", "eval_samples = 2000"]
    if rate_mbs > 0:
        for node in range(nodes):
            lines += ["[[faults]]", 'kind = "bandwidth"', f"node = {node}",
                      f"bytes_per_second = {int(rate_mbs * 1e6)}", "at_round = 0", 'via = "kernel"']
    return "\n".join(lines) + "\n"


def simulate_command(scenario: Path, run_dir: Path, sync: str, options: list[str] | tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, "-m", "edgegrove.cli", "simulate", "--scenario", str(scenario), "--sync-every", sync,
            "--broker", "mosquitto", "--no-dashboard", "--baseline", "none", "--json", "--stall-timeout", "120",
            *(arg for option in options for arg in ("--agent-option", option)), "--out", str(run_dir)]


def plan(args: argparse.Namespace) -> list[tuple[float, str, int]]:
    """(link rate, sync period, rounds) of every run."""
    if len(args.rounds) not in (1, len(args.sync_every)):
        raise UsageError(f"--rounds takes one value or one per --sync-every value ({len(args.sync_every)})")
    per = dict(zip(args.sync_every, args.rounds * len(args.sync_every) if len(args.rounds) == 1 else args.rounds,
                   strict=True))
    return [(rate, sync, per[sync]) for rate in args.links for sync in args.sync_every]


def run_one(args: argparse.Namespace, rate: float, sync: str, count: int) -> dict[str, Any]:
    name = f"{rate:g}mbs-h{sync}"
    run_dir = args.runs_dir / name
    command = simulate_command(args.runs_dir / f"{name}.toml", run_dir, sync, args.agent_option)
    if not (args.reuse and (run_dir / "events.jsonl").exists()):
        args.runs_dir.mkdir(parents=True, exist_ok=True)
        (args.runs_dir / f"{name}.toml").write_text(scenario_text(name, args.nodes, count, rate, args.eval_every))
        print(f"bench tta: {' '.join(command[2:])}", file=sys.stderr)
        subprocess.run(command, check=False, stdout=subprocess.DEVNULL)
    if not (run_dir / "events.jsonl").exists():  # the run failed before it started: said on stderr
        result: dict[str, Any] = {"run": str(run_dir), "local_steps": None, "round_reached": None, "seconds": None,
                                  "megabytes_sent": None, "samples": None, "final_accuracy": None}
    else:
        result = time_to_accuracy(run_dir, args.target)
    return {"link_mbs": rate, "sync_every": sync, "rounds_planned": count, "command": " ".join(command[2:]), **result}


def matched_samples(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each run's accuracy once it had trained on as many samples as the same link's every-step
    run did in all its rounds: what the sync period costs in accuracy for the same data."""
    for result in results:
        reference = next((r for r in results if r["link_mbs"] == result["link_mbs"] and r["sync_every"] == "1"
                          and r.get("samples_trained")), None)
        if reference is None or result.get("samples_trained") is None:
            continue
        at = accuracy_at_samples(Path(result["run"]), reference["samples_trained"])
        result["matched_samples"], result["accuracy_at_matched"] = reference["samples_trained"], at["accuracy"]
        result["matched_between"] = [at["before"], at["after"]]
    return results


def plot(results: list[dict[str, Any]], target: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (secs, mbytes) = plt.subplots(1, 2, figsize=(10, 4))
    # Categories, slowest link first and unlimited last: 0 on a rate axis would sit left of 2.
    rates = sorted({r["link_mbs"] for r in results}, key=lambda rate: (rate == 0, rate))
    where = {rate: i for i, rate in enumerate(rates)}
    for sync in dict.fromkeys(r["sync_every"] for r in results):
        rows = sorted((r for r in results if r["sync_every"] == sync), key=lambda r: where[r["link_mbs"]])
        label = f"sync-every {sync}"
        secs.plot([where[r["link_mbs"]] for r in rows], [r["seconds"] for r in rows], "o-", label=label)
        mbytes.plot([where[r["link_mbs"]] for r in rows], [r["megabytes_sent"] for r in rows], "o-", label=label)
    for ax, what in ((secs, "seconds"), (mbytes, "MB sent by the fleet")):
        ax.set_xticks(range(len(rates)), ["unlimited" if rate == 0 else f"{rate:g}" for rate in rates])
        ax.set_xlabel("link rate per agent (MB/s)")
        ax.set_ylabel(f"{what} to {target:.0%} test accuracy")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    from simulate.cli import parse_agent_options

    try:
        runs, options = plan(args), parse_agent_options(args.agent_option)
    except (UsageError, ValueError) as exc:  # ScenarioError is a ValueError
        print(f"edgegrove bench tta: {exc}", file=sys.stderr)
        return 2
    results = matched_samples([run_one(args, rate, sync, count) for rate, sync, count in runs])
    doc = document("tta", target_accuracy=args.target, nodes=args.nodes, agent_options=options, results=results,
                   method="time from the end of the fleet's first round to the end of the first round whose "
                          "mean test accuracy reached the target (simulate/bench/tta.py)")
    if args.plot is not None:
        plot(results, args.target, args.plot)
    table = format_table(["link MB/s", "sync every", "local steps", "round reached", "seconds", "MB sent",
                          "samples", "final accuracy", "acc. at H=1's samples"],
                         [[r["link_mbs"], r["sync_every"], r["local_steps"], r["round_reached"], r["seconds"],
                           r["megabytes_sent"], r["samples"], r["final_accuracy"], r.get("accuracy_at_matched")]
                          for r in results])
    emit(doc, args, table)
    return 0
