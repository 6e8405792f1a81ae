"""Time and bytes to a target test accuracy, read from `edgegrove simulate` run directories.

    python -m simulate.bench.tta --target 0.92 runs/a runs/b

For each run: its local steps per sync, the first round whose mean test accuracy reached the
target, the seconds from the end of the fleet's first round to the end of that one (start-up
left out: it is the same whatever the sync period), the bytes every agent sent until then, and
the samples trained. Every figure comes from the run's events.jsonl.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from simulate import report
from simulate.bench.common import machine_info


def _rows(run_dir: Path) -> tuple[list[dict[str, Any]], list[report.RoundRow]]:
    records = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line]
    return records, report.rounds_table(records)


def accuracy_at_samples(run_dir: Path, samples: int) -> dict[str, Any]:
    """The fleet's mean test accuracy once it had trained on ``samples`` samples, interpolated
    between the evaluations either side (a long sync period evaluates every 45,000 samples or
    so), with those two: runs of different sync periods compared after the same data."""
    seen, before, after = 0, None, None
    for row in _rows(run_dir)[1]:
        seen += row.samples
        if row.accuracy is None:
            continue
        if seen <= samples:
            before = (seen, row.accuracy)
        if seen >= samples:
            after = (seen, row.accuracy)
            break
    if before is None or after is None:
        return {"accuracy": None, "before": before, "after": after}
    share = 0.0 if after[0] == before[0] else (samples - before[0]) / (after[0] - before[0])
    return {"accuracy": round(before[1] + share * (after[1] - before[1]), 5), "before": before, "after": after}


def time_to_accuracy(run_dir: Path, target: float) -> dict[str, Any]:
    records, rows = _rows(run_dir)
    ends: dict[int, float] = {}
    for rec in records:
        if rec.get("type") == "telemetry":
            ends[int(rec["round"])] = max(ends.get(int(rec["round"]), 0.0), float(rec["t"]))
    reached = next((r for r in rows if r.accuracy is not None and r.accuracy >= target), None)
    upto = [r for r in rows if reached is not None and r.round <= reached.round]
    last_acc = next((r for r in reversed(rows) if r.accuracy is not None), None)
    return {
        "run": str(run_dir), "local_steps": max((r.local_steps for r in rows), default=1),
        "rounds": len(rows), "round_reached": reached.round if reached else None,
        "seconds": round(ends[reached.round] - ends[rows[0].round], 1) if reached else None,
        "megabytes_sent": round(sum(r.bytes_sent for r in upto) / 1e6, 1) if reached else None,
        "samples": sum(r.samples for r in upto) if reached else None,
        "median_round_s": report._median([r.round_s_max for r in rows]),
        "samples_trained": sum(r.samples for r in rows),
        "final_accuracy": last_acc.accuracy if last_acc else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulate.bench.tta", description=__doc__)
    parser.add_argument("--target", type=float, default=0.92, help="test accuracy to reach")
    parser.add_argument("--out", type=Path, default=None,
                        help="also write the figures as JSON (docs/results/periodic.json for `edgegrove bench report`)")
    parser.add_argument("--command", action="append", default=[],
                        help="the simulate command of each run, recorded in the JSON (repeatable)")
    parser.add_argument("runs", type=Path, nargs="+", help="simulate run directories")
    args = parser.parse_args(argv)
    results = [time_to_accuracy(run, args.target) for run in args.runs]
    if args.out is not None:
        doc = {"benchmark": "periodic", "machine": machine_info(), "target_accuracy": args.target,
               "method": "time from the end of the fleet's first round to the end of the first round whose "
                         "mean test accuracy reached the target (python -m simulate.bench.tta)",
               "commands": args.command, "results": results}
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print("| run | local steps | round reached | seconds to target | MB sent | samples | median round s "
          "| final accuracy |\n|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {Path(r['run']).name} | {r['local_steps']} | {r['round_reached']} | {r['seconds']} | "
              f"{r['megabytes_sent']} | {r['samples']} | {r['median_round_s']:.3f} | {r['final_accuracy']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
