"""Writes the message sequences in recordings/ that the reducer tests replay.

    python3 tests/unit/dashboard/make_recordings.py

Each line: {"t": seconds, "topic": ..., "payload": {...}} as the dashboard would receive it
on job "rec" (7 agents, binary tree: 0 -> 1,2; 1 -> 3,4; 2 -> 5,6; backups 1-2, 3-4, 5-6,
as agents report them in their telemetry). When the real agent runs, sequences captured with
`mosquitto_sub -v -t 'edgegrove/<job>/#'` can be converted into the same format and added.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from agent.protocol.topology import Tree

HERE = Path(__file__).resolve().parent / "recordings"
P = "edgegrove/rec"
ROUND_SECONDS = 0.5


class Recorder:
    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []
        self.t = 0.0

    def emit(self, topic: str, payload: dict[str, Any]) -> None:
        self.lines.append({"t": round(self.t, 3), "topic": f"{P}/{topic}", "payload": payload})

    def status(self, node: int, state: str, incarnation: int = 1, round_no: int = 0) -> None:
        self.emit(f"status/{node}", {"node": node, "state": state, "round": round_no,
                                     "pid": 1000 + node, "incarnation": incarnation,
                                     "fingerprint": "0123456789abcdef"})

    def view(self, epoch: int, members: list[int], from_round: int) -> None:
        self.emit("view", {"epoch": epoch, "members": members, "arity": 2,
                           "coordinator": members[0], "from_round": from_round,
                           "fingerprint": "0123456789abcdef"})

    def round(self, round_no: int, epoch: int, members: list[int],
              overrides: dict[int, dict[str, Any]] | None = None,
              silent: tuple[int, ...] = ()) -> None:
        """Telemetry of every member of a round; ``overrides`` patch single nodes' reports."""
        self.t += ROUND_SECONDS
        tree = Tree.of(members, 2)
        for node in members:
            if node in silent:
                continue
            report = telemetry(node, round_no, epoch, tree)
            report.update((overrides or {}).get(node, {}))
            self.emit(f"telemetry/{node}", report)

    def write(self, name: str) -> None:
        HERE.mkdir(exist_ok=True)
        text = "".join(json.dumps(line, sort_keys=True) + "\n" for line in self.lines)
        (HERE / name).write_text(text)


def telemetry(node: int, round_no: int, epoch: int, tree: Tree) -> dict[str, Any]:
    loss = 2.3 * math.exp(-round_no / 4) + 0.05
    return {
        "node": node, "round": round_no, "epoch": epoch, "algorithm": "ft-tree",
        "wall_time": 0.04, "loss": round(loss, 4),
        "accuracy": round(0.9 + round_no / 200, 4) if round_no % 2 == 0 else None,
        "phase_seconds": {"compute": 0.02, "reduce": 0.01, "broadcast": 0.008, "apply": 0.002,
                          "total": 0.04},
        "bytes_sent": 1_628_200, "bytes_received": 1_628_200,
        "contributors": len(tree), "members": len(tree), "reroutes": 0, "timeouts": 0,
        "nacks": 0, "pulls": 0, "degraded": False, "missing_chunks": 0, "rejected": {},
        "links": {str(p): "ok" for p in sorted(tree.neighbours(node))},
        "model_hash": f"h{round_no:04d}", "events": [],
    }


def crash() -> Recorder:
    """Node 4 is SIGKILLed after round 5: its Last Will, a degraded round, a new view."""
    rec = Recorder()
    everyone = list(range(7))
    rec.view(1, everyone, 0)
    for n in everyone:
        rec.status(n, "online")
    for r in range(1, 6):
        rec.round(r, 1, everyone)
    rec.t += 0.2
    rec.status(4, "offline")
    tree = Tree.of(everyone, 2)
    node1 = {
        "links": {**telemetry(1, 6, 1, tree)["links"], "4": "failed"},
        "timeouts": 3, "degraded": True, "missing_chunks": 25, "contributors": 6,
        "phase_seconds": {"total": 1.62}, "rejected": {"stale_round": 2},
        "events": [{"kind": "timeout", "peer": 4, "detail": "no chunks from child"},
                   {"kind": "link_dead", "peer": 4, "detail": "3 timeouts"}],
    }
    rec.round(6, 1, everyone, overrides={1: node1}, silent=(4,))
    rec.view(2, [0, 1, 2, 3, 5, 6], 7)
    for r in (7, 8):  # an agent's rejected counts are totals since it started
        rec.round(r, 2, [0, 1, 2, 3, 5, 6], overrides={1: {"rejected": {"stale_round": 2}}})
    return rec


def reroute() -> Recorder:
    """Link 1-3 is cut at the broker in rounds 4-6: 3 relays through its sibling 4; healed at 7."""
    rec = Recorder()
    everyone = list(range(7))
    rec.view(1, everyone, 0)
    for n in everyone:
        rec.status(n, "online")
    tree = Tree.of(everyone, 2)
    for r in range(1, 9):
        overrides: dict[int, dict[str, Any]] = {}
        if 4 <= r <= 6:
            overrides[3] = {
                "links": {**telemetry(3, r, 1, tree)["links"], "1": "rerouted"},
                "timeouts": 1, "reroutes": 1, "phase_seconds": {"total": 0.55},
                "events": [{"kind": "timeout", "peer": 1, "detail": "no ack"},
                           {"kind": "reroute", "peer": 1, "detail": "via 4"}],
            }
            overrides[1] = {
                "links": {**telemetry(1, r, 1, tree)["links"], "3": "rerouted"},
                "events": [{"kind": "pull", "peer": 4, "detail": "relay of 3"}], "pulls": 1,
            }
        rec.round(r, 1, everyone, overrides=overrides)
    return rec


def rejoin() -> Recorder:
    """Node 5 crashes, the fleet goes on without it, it restarts, resyncs and rejoins."""
    rec = Recorder()
    everyone = list(range(7))
    without = [0, 1, 2, 3, 4, 6]
    rec.view(1, everyone, 0)
    for n in everyone:
        rec.status(n, "online")
    for r in range(1, 4):
        rec.round(r, 1, everyone)
    rec.status(5, "offline")
    rec.view(2, without, 4)
    for r in range(4, 6):
        rec.round(r, 2, without)
    rec.t += 0.3
    rec.status(5, "joining", incarnation=2, round_no=5)
    rec.round(6, 2, without)
    rec.view(3, everyone, 7)
    rec.status(5, "online", incarnation=2, round_no=7)
    overrides = {5: {"events": [{"kind": "resync", "peer": 2, "detail": "pulled model"},
                                {"kind": "rejoin", "peer": None, "detail": "epoch 3"}]}}
    rec.round(7, 3, everyone, overrides=overrides)
    rec.round(8, 3, everyone)
    return rec


if __name__ == "__main__":
    crash().write("crash.jsonl")
    reroute().write("reroute.jsonl")
    rejoin().write("rejoin.jsonl")
    print(f"wrote recordings into {HERE}")
