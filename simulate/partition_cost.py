"""`edgegrove analyze partition RUN_DIR...`: what a partition cost in runs of `edgegrove
simulate` (a scenario with ``isolate`` faults: docs/PARTITIONS.md), from each run's
events.jsonl: the survivors' time of the round in which the nodes were cut off and of the
next (per node, its round's telemetry time minus its previous round's; the slowest survivor),
and the rounds from the heal until every node is back in the view with one model hash."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class PartitionCost:
    run: str
    isolated: list[int]
    cut_round: int
    cut_round_s: float | None  # the slowest survivor's time of the round of the cut
    next_round_s: float | None
    heal_round: int | None  # the round under way at the heal
    whole_round: int | None  # the first round all nodes ran, in one view of all, with one hash
    rounds_to_whole: int | None
    seconds_to_whole: float | None
    halted: bool | None


def read_events(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _round_time(times: dict[tuple[int, int], float], node: int, rnd: int) -> float | None:
    end, start = times.get((node, rnd)), times.get((node, rnd - 1))
    return None if end is None or start is None else end - start


def _slowest(times: dict[tuple[int, int], float], nodes: list[int], rnd: int) -> float | None:
    spans = [s for n in nodes if (s := _round_time(times, n, rnd)) is not None]
    return round(max(spans), 3) if spans else None


def partition_cost(run_dir: Path) -> PartitionCost | None:
    """None: the run isolated nobody."""
    events = read_events(run_dir / "events.jsonl")
    isolated = sorted({int(n) for e in events if e["type"] == "fault" and e.get("action") == "inject"
                       and e.get("kind") == "isolate" for n in e.get("targets", [])})  # type: ignore[attr-defined]
    if not isolated:
        return None
    cut_round = min(int(e["round"]) for e in events  # type: ignore[call-overload]
                    if e["type"] == "fault" and e.get("action") == "inject" and e.get("kind") == "isolate")
    telemetry = [e for e in events if e["type"] == "telemetry"]
    nodes = sorted({int(e["node"]) for e in telemetry})  # type: ignore[call-overload]
    times = {(int(e["node"]), int(e["round"])): float(e["t"]) for e in telemetry}  # type: ignore[call-overload, arg-type]
    survivors = [n for n in nodes if n not in isolated]
    healed = [float(e["t"]) for e in events if e["type"] == "netns" and e.get("event") == "healed"]  # type: ignore[arg-type]
    heal_t = max(healed) if healed else None
    heal_round = whole = None
    if heal_t is not None:
        heal_round = min((r for (n, r), t in times.items() if n in survivors and t > heal_t), default=None)
    if heal_round is not None:
        by_round: dict[int, list[dict[str, object]]] = {}
        for e in telemetry:
            by_round.setdefault(int(e["round"]), []).append(e)  # type: ignore[call-overload]
        whole = next((r for r in sorted(by_round) if r >= heal_round
                      and {int(e["node"]) for e in by_round[r]} >= set(nodes)  # type: ignore[call-overload]
                      and all(e.get("members") == len(nodes) for e in by_round[r])
                      and len({e.get("model_hash") for e in by_round[r]}) == 1), None)
    end = [e for e in events if e["type"] == "run" and e.get("phase") == "end"]
    return PartitionCost(
        run=str(run_dir), isolated=isolated, cut_round=cut_round,
        cut_round_s=_slowest(times, survivors, cut_round), next_round_s=_slowest(times, survivors, cut_round + 1),
        heal_round=heal_round, whole_round=whole,
        rounds_to_whole=None if whole is None or heal_round is None else whole - heal_round,
        seconds_to_whole=None if whole is None or heal_t is None else round(
            max(t for (n, r), t in times.items() if r == whole) - heal_t, 2),
        halted=bool(end[-1].get("halted")) if end else None)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", type=Path, help="output directories of `edgegrove simulate` runs")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def run(args: argparse.Namespace) -> int:
    missing = [str(d) for d in args.runs if not (d / "events.jsonl").is_file()]
    if missing:
        print(f"analyze partition: no events.jsonl in {', '.join(missing)}", file=sys.stderr)
        return 2
    rows = [c for d in args.runs if (c := partition_cost(d)) is not None]
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=2))
        return 0
    print(f"{'run':<28} {'isolated':<12} {'cut round':>9} {'its s':>6} {'next s':>6} "
          f"{'heal rnd':>8} {'all back':>8} {'rounds':>6} {'s':>5} halted")
    for r in rows:
        print(f"{Path(r.run).name:<28} {','.join(map(str, r.isolated)):<12} {r.cut_round:>9} "
              f"{_cell(r.cut_round_s):>6} {_cell(r.next_round_s):>6} {_cell(r.heal_round):>8} "
              f"{_cell(r.whole_round):>8} {_cell(r.rounds_to_whole):>6} {_cell(r.seconds_to_whole):>5} {r.halted}")
    return 0


def _cell(value: float | int | None) -> str:
    return "-" if value is None else f"{value:g}"
