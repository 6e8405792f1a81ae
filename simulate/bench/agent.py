"""`edgegrove bench agent`: a small real fleet on a local broker; per agent its machine (from its
telemetry), peak resident memory (VmHWM, the Raspberry Pi budget is 150 MB) and per-round time,
measured in one run. ``--aarch64 1,3`` runs those agents on the Pi's architecture under qemu
(``simulate.bench.arm64``): their memory is the emulator's process (guest included) and their
time says nothing about a real Pi."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from agent.protocol.topics import Topics
from agent.validate import arg, positive_seconds, whole
from simulate.bench.arm64 import Arm64AgentSpec, Arm64Error, install_site
from simulate.bench.common import add_output_arguments, document, emit
from simulate.brokers import mosquitto_available, start_embedded, start_mosquitto
from simulate.fleet import AgentSpec, Fleet
from simulate.telemetry import Collector, EventLog, FleetWatch

JOB = "bench-agent"
PI_BUDGET_MB = 150.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=arg(whole(1, 256, "a number of agents")), default=4, help="agents in the fleet")
    parser.add_argument("--rounds", type=arg(whole(1, None, "a number of rounds")), default=30, help="training rounds to run")
    parser.add_argument("--backend", choices=["numpy", "litert"], default="numpy")
    parser.add_argument("--model", default="mlp",
                        help="the agents' model: mlp, path/to/file.py:factory (numpy) or a .tflite "
                             "(litert), e.g. examples/mnist_cnn/mnist_cnn.tflite")
    parser.add_argument("--eval-every", type=arg(whole(0, None, "a number of rounds")), default=0,
                        help="evaluate on the test set every N rounds (0 = never): counts "
                             "evaluation's memory in the peak")
    parser.add_argument("--broker", choices=["auto", "mosquitto", "embedded"], default="auto")
    parser.add_argument("--timeout", type=arg(positive_seconds), default=300.0, help="give up after this many seconds")
    parser.add_argument("--aarch64", type=_node_list, default=[], metavar="IDS",
                        help="comma-separated agent ids to run as aarch64 under qemu "
                             "(scripts/arm64-env.sh; the agent installed from its wheel)")
    parser.add_argument("--arm64-site", type=Path, default=None, metavar="DIR",
                        help="an aarch64 site made by `scripts/arm64-env.sh install DIR` "
                             "(default: install one into a temporary directory)")
    add_output_arguments(parser)


def _node_list(text: str) -> list[int]:
    try:
        return sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected ids like 1,3, got {text!r}") from exc


def peak_rss_mb(pid: int) -> float | None:
    """VmHWM: the process's peak resident set so far (Linux)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def run(args: argparse.Namespace) -> int:
    use_mosquitto = args.broker == "mosquitto" or (args.broker == "auto" and mosquitto_available())
    with tempfile.TemporaryDirectory(prefix="edgegrove-bench-agent-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        if use_mosquitto:
            broker: Any = stack.enter_context(start_mosquitto(work / "broker", job=JOB, nodes=args.nodes))
            creds = broker.dashboard_credentials
            user: tuple[str | None, str | None] = (creds.username, creds.password)
        else:
            broker = stack.enter_context(start_embedded())
            user = (None, None)
        watch = FleetWatch()
        collector = Collector(broker.url, Topics(JOB), EventLog(None), watch, *user)
        collector.start()
        stack.callback(collector.stop)
        options: dict[str, Any] = {"job": JOB, "fleet_size": args.nodes, "rounds": args.rounds,
                                   "backend": args.backend, "model": args.model,
                                   "eval_every": args.eval_every}
        if use_mosquitto:
            options["credentials"] = str(broker.credentials_path)
        emulated = [n for n in args.aarch64 if n < args.nodes]
        specs: list[AgentSpec] = []
        if emulated:
            try:
                site_path = args.arm64_site or install_site(work / "arm64-site").path
            except Arm64Error as exc:
                print(f"bench agent: {exc}", file=sys.stderr)
                return 1
            # Emulated agents are slow: round 0 waits for them, and a late ACK is not a fault.
            options.update(min_members=args.nodes, join_grace=600.0, timeout_mode="fixed",
                           timeout=10.0, round_deadline=120.0)
        for n in range(args.nodes):
            common = (n, broker.url, options, work / f"ckpt-{n}", work / f"agent-{n}.log")
            specs.append(Arm64AgentSpec(*common, site=site_path)
                         if n in emulated else AgentSpec(*common))
        fleet = Fleet(specs)
        fleet.start_all()
        stack.callback(fleet.stop_all)
        last = args.rounds - 1
        done = watch.wait_for(lambda: all(watch.last_round.get(n, -1) >= last for n in range(args.nodes)),
                              args.timeout)
        peaks = {n: peak_rss_mb(pid) for n, a in fleet.agents.items() if (pid := a.pid) is not None}
        rounds = _round_times(watch)
        with watch.cond:
            machines = {n: tel.machine or "?" for n, tel in sorted(watch.latest.items())}
    if not done:
        print(f"bench agent: the fleet did not finish {args.rounds} rounds in {args.timeout:.0f} s",
              file=sys.stderr)
        return 1
    result = document(
        "agent", broker="mosquitto" if use_mosquitto else "embedded", nodes=args.nodes,
        rounds=args.rounds, backend=args.backend, model=args.model, eval_every=args.eval_every,
        peak_rss_mb={str(n): round(v, 1) for n, v in peaks.items() if v is not None},
        peak_rss_mb_max=round(max(v for v in peaks.values() if v is not None), 1),
        pi_budget_mb=PI_BUDGET_MB, machines={str(n): m for n, m in machines.items()},
        emulated=[str(n) for n in emulated],
        round_seconds_median=round(statistics.median(rounds), 4) if rounds else None,
        round_seconds_p90=round(sorted(rounds)[int(0.9 * (len(rounds) - 1))], 4) if rounds else None,
    )
    lines = [f"fleet of {args.nodes} ({args.backend}, model {args.model}, {result['broker']}), "
             f"{args.rounds} rounds"]
    for node, mb in result["peak_rss_mb"].items():
        how = " (emulated by qemu: RSS includes the emulator)" if node in result["emulated"] else ""
        lines.append(f"  agent {node} on {machines.get(int(node), '?'):8s} peak resident {mb:7.1f} MB{how}")
    lines.append(f"  max {result['peak_rss_mb_max']} MB (budget {PI_BUDGET_MB:.0f} MB); round time "
                 f"median {result['round_seconds_median']} s, p90 {result['round_seconds_p90']} s")
    if emulated:
        lines.append("  round times include the emulated agents: under qemu they say nothing about "
                     "a real Pi (every aarch64 instruction is translated); the RSS is an upper bound")
    emit(result, args, "\n".join(lines))
    return 0


def _round_times(watch: FleetWatch) -> list[float]:
    # The first rounds include start-up (view, imports): leave them out of the figure.
    times = sorted(watch.round_seconds().items())
    return [t for r, t in times if r >= 2]
