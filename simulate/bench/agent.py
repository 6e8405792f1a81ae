"""`edgegrove bench agent`: a small real fleet on a local broker; per agent its peak resident
memory (VmHWM, the Raspberry Pi budget is 150 MB) and per-round time, measured in one run."""

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
    parser.add_argument("--broker", choices=["auto", "mosquitto", "embedded"], default="auto")
    parser.add_argument("--timeout", type=arg(positive_seconds), default=300.0, help="give up after this many seconds")
    add_output_arguments(parser)


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
                                   "backend": args.backend, "eval_every": 0}
        if use_mosquitto:
            options["credentials"] = str(broker.credentials_path)
        fleet = Fleet([AgentSpec(n, broker.url, options, work / f"ckpt-{n}", work / f"agent-{n}.log")
                       for n in range(args.nodes)])
        fleet.start_all()
        stack.callback(fleet.stop_all)
        last = args.rounds - 1
        done = watch.wait_for(lambda: all(watch.last_round.get(n, -1) >= last for n in range(args.nodes)),
                              args.timeout)
        peaks = {n: peak_rss_mb(pid) for n, a in fleet.agents.items() if (pid := a.pid) is not None}
        rounds = _round_times(watch)
    if not done:
        print(f"bench agent: the fleet did not finish {args.rounds} rounds in {args.timeout:.0f} s",
              file=sys.stderr)
        return 1
    result = document(
        "agent", broker="mosquitto" if use_mosquitto else "embedded", nodes=args.nodes,
        rounds=args.rounds, backend=args.backend,
        peak_rss_mb={str(n): round(v, 1) for n, v in peaks.items() if v is not None},
        peak_rss_mb_max=round(max(v for v in peaks.values() if v is not None), 1),
        pi_budget_mb=PI_BUDGET_MB,
        round_seconds_median=round(statistics.median(rounds), 4) if rounds else None,
        round_seconds_p90=round(sorted(rounds)[int(0.9 * (len(rounds) - 1))], 4) if rounds else None,
    )
    lines = [f"fleet of {args.nodes} ({args.backend}, {result['broker']}), {args.rounds} rounds"]
    lines += [f"  agent {node}: peak resident {mb:7.1f} MB" for node, mb in result["peak_rss_mb"].items()]
    lines.append(f"  max {result['peak_rss_mb_max']} MB (budget {PI_BUDGET_MB:.0f} MB); round time "
                 f"median {result['round_seconds_median']} s, p90 {result['round_seconds_p90']} s")
    emit(result, args, "\n".join(lines))
    return 0


def _round_times(watch: FleetWatch) -> list[float]:
    # The first rounds include start-up (view, imports): leave them out of the figure.
    times = sorted(watch.round_seconds().items())
    return [t for r, t in times if r >= 2]
