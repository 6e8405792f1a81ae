"""A fleet with one liar on a real dynamic-security mosquitto, and its figures: the accuracy
at the last round, what each member refused, the members of every view.

``python -m tests.integration.attacks.liars_fleet`` runs the issue's comparison (4 and 7
agents, the liar at a leaf and at an inner node, x-3 and x-10 flips of its own gradient and
of its whole unit, against the clean run at the same round) and prints one line per run:
the benchmark the integration tests only sample (see test_liars_position.py)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import numpy as np

from agent.protocol.wire import RejectReason
from simulate.brokers import MosquittoBroker, start_mosquitto
from simulate.fleet import AGENT_MODULE, AgentSpec, Fleet
from tests.integration.fleet_harness import FAST_AGENT, FleetListener, agent_logs, broker_job

LIAR_MODULE = "tests.integration.attacks.liar_agent"
EVAL_SAMPLES = 10_000  # the whole test set: a 1 pp comparison needs more than 1,000 samples
# The tree of ids 0..n-1 with arity 2: node 1 is inner (children 3, 4), 2 a leaf under the
# root at 4 agents, 3 a leaf under node 1.
INNER, LEAF = 1, 3
BOUNDED = (RejectReason.NORM_CLIPPED, RejectReason.NORM_REFUSED, RejectReason.OWN_PART_CLIPPED,
           RejectReason.OWN_PART_REFUSED, "implausible_values")


@dataclass(frozen=True)
class LiarSpec(AgentSpec):
    attack: str = ""

    def command(self) -> list[str]:
        command = super().command()
        at = command.index(AGENT_MODULE)
        return [*command[:at], LIAR_MODULE, self.attack, *command[at + 1:]]


@dataclass(frozen=True)
class Run:
    accuracy: float
    hashes: dict[int, str]
    rejected: dict[int, dict[str, int]]
    members: list[int]
    degraded: int
    left_out: dict[int, tuple[int, int]]  # liar -> (its parent, the round it was left out in)

    def bounded(self, node: int) -> int:
        """Units (or own parts) ``node`` held to a member's bound, zeroed or refused."""
        return sum(self.rejected[node].get(str(reason), 0) for reason in BOUNDED)

    def own_parts(self, node: int) -> int:
        reasons = (RejectReason.OWN_PART_CLIPPED, RejectReason.OWN_PART_REFUSED)
        return sum(self.rejected[node].get(str(r), 0) for r in reasons)


def run_fleet(tmp: Path, nodes: int, rounds: int, liar: int | None = None, attack: str = "",
              options: dict[str, Any] | None = None) -> Run:
    job = f"liars-{nodes}"
    with start_mosquitto(tmp / "broker", job=job, nodes=nodes) as broker:
        creds = broker.dashboard_credentials
        listener = FleetListener(broker.url, job, creds.username, creds.password)
        fleet = Fleet(_specs(broker, tmp, nodes, rounds, liar, attack, options or {}))
        fleet.start_all()
        try:
            listener.wait_for(lambda: listener.reached(list(range(nodes)), rounds - 1), 90 + 3 * rounds,
                              "the last round")
            last = rounds - 1
            accs = [t.accuracy for n in range(nodes) for t in listener.telemetry[n]
                    if t.round == last and t.accuracy is not None]
            assert len(accs) == nodes, f"no accuracy after round {last}\n{agent_logs(tmp)}"
            return Run(accuracy=float(np.mean(accs)), hashes=listener.hashes_at(last),
                       rejected={n: dict(listener.last(n).rejected) for n in range(nodes)},
                       members=[t.members for t in listener.telemetry[0]],
                       degraded=sum(t.degraded for t in listener.telemetry[0]), left_out=_left_out(listener, nodes))
        finally:
            forced = fleet.stop_all(grace=10)
            listener.close()
            assert forced == [], agent_logs(tmp)


def _left_out(listener: FleetListener, nodes: int) -> dict[int, tuple[int, int]]:
    """Every liar a parent left out (its ``liar`` note), with the parent and the round."""
    found: dict[int, tuple[int, int]] = {}
    for node in range(nodes):
        for t in listener.telemetry[node]:
            for note in t.events:
                if note.get("kind") == "liar" and isinstance(note.get("peer"), int):
                    found.setdefault(note["peer"], (node, t.round))
    return found


def _specs(broker: MosquittoBroker, tmp: Path, nodes: int, rounds: int, liar: int | None, attack: str,
           options: dict[str, Any]) -> list[AgentSpec]:
    specs: list[AgentSpec] = []
    for node in range(nodes):
        opts = {"job": broker_job(broker), "fleet_size": nodes, **FAST_AGENT, "rounds": rounds,
                "eval_every": rounds, "eval_samples": EVAL_SAMPLES,
                "credentials": str(broker.credentials_path), **options}
        spec = LiarSpec(node=node, broker_url=broker.url, options=opts, checkpoint_dir=tmp / f"ckpt-{node}",
                        log_path=tmp / f"agent-{node}.log", attack=attack)
        specs.append(spec if node == liar else AgentSpec(node, spec.broker_url, opts, spec.checkpoint_dir,
                                                          spec.log_path))
    return specs


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.integration.attacks.liars_fleet")
    parser.add_argument("--nodes", type=int, nargs="+", default=[4, 7])
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--attacks", nargs="+", default=["own:-3", "own:-10", "unit:-3", "unit:-10"])
    parser.add_argument("--at", nargs="+", default=["leaf", "inner"], choices=["leaf", "inner"])
    parser.add_argument("--no-audit", action="store_true", help="every agent with --no-audit-units (main's behaviour)")
    args = parser.parse_args(argv)
    options = {"audit_units": False} if args.no_audit else {}
    for nodes in args.nodes:
        with TemporaryDirectory(prefix="liars-") as tmp:
            clean = run_fleet(Path(tmp) / "clean", nodes, args.rounds, options=options)
        print(f"{nodes} agents, {args.rounds} rounds, clean: accuracy {clean.accuracy:.4f}", flush=True)
        for at in args.at:
            liar = INNER if at == "inner" else LEAF
            for attack in args.attacks:
                if at == "leaf" and attack.startswith("unit:"):
                    continue  # a leaf's unit is its own gradient
                with TemporaryDirectory(prefix="liars-") as tmp:
                    run = run_fleet(Path(tmp) / "run", nodes, args.rounds, liar, attack, options)
                parent = 0 if liar == INNER else INNER
                print(f"{nodes} agents, liar {liar} ({at}) {attack}: accuracy {run.accuracy:.4f} "
                      f"({(run.accuracy - clean.accuracy) * 100:+.2f} pp); its parent {parent} bounded "
                      f"{run.bounded(parent)} (own parts {run.own_parts(parent)}) {run.rejected[parent]}; "
                      f"left out (by, in round): {run.left_out}; "
                      f"one model: {len(set(run.hashes.values())) == 1}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
