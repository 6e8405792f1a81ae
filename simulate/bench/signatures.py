"""`edgegrove bench signatures`: what signing the control messages costs a fault-free fleet
(issue 54: at most 10 %). One sitting, one dynamic-security mosquitto: fleets with the job's
device keys (statuses, suspicions and views signed and checked) and without, alternately,
``--pairs`` times. Per fleet: the median round time over every agent's rounds (telemetry,
the first rounds left out) and the bytes published per round (everything on the job's topics,
control messages too, as a reader of all of them counts them)."""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from agent.protocol.messages import MessageError, Telemetry
from agent.protocol.topics import Topics
from agent.transport.mqtt import MqttTransport
from agent.validate import arg, positive_seconds, whole
from simulate.bench.common import add_output_arguments, document, emit, progress
from simulate.brokers import MosquittoBroker, start_mosquitto
from simulate.fleet import AgentSpec, Fleet

JOB = "bench-signatures"
WARMUP_ROUNDS = 3  # start-up rounds (first view, joins) left out of the figures


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=arg(whole(2, 64, "a number of agents")), default=4)
    parser.add_argument("--rounds", type=arg(whole(WARMUP_ROUNDS + 2, None, "a number of rounds")), default=40)
    parser.add_argument("--pairs", type=arg(whole(1, 20, "a number of pairs")), default=2,
                        help="signed and unsigned fleets run alternately this many times each")
    parser.add_argument("--timeout", type=arg(positive_seconds), default=300.0, help="per fleet")
    add_output_arguments(parser)


def run(args: argparse.Namespace) -> int:
    runs: dict[str, list[dict[str, float]]] = {"signed": [], "unsigned": []}
    with tempfile.TemporaryDirectory(prefix="edgegrove-bench-signatures-") as tmp:
        work = Path(tmp)
        with start_mosquitto(work / "broker", job=JOB, nodes=args.nodes) as broker:
            unsigned = _without_keys(broker.credentials_path, work / "credentials-unsigned.json")
            for i in range(args.pairs):
                for kind, creds in (("signed", broker.credentials_path), ("unsigned", unsigned)):
                    progress(f"{kind} fleet {i + 1}/{args.pairs}")
                    figures = _fleet(broker, creds, work / f"{kind}-{i}", args)
                    if figures is None:
                        print(f"bench signatures: the {kind} fleet did not finish in {args.timeout:.0f} s")
                        return 1
                    runs[kind].append(figures)
    summary = {k: {"round_seconds": round(statistics.median(r["round_seconds"] for r in v), 4),
                   "bytes_per_round": round(statistics.median(r["bytes_per_round"] for r in v))}
               for k, v in runs.items()}
    cost = {m: round(summary["signed"][m] / summary["unsigned"][m] - 1, 4) for m in ("round_seconds", "bytes_per_round")}
    result = document("signatures", nodes=args.nodes, rounds=args.rounds, pairs=args.pairs, runs=runs,
                      summary=summary, cost=cost)
    lines = [f"fault-free fleet of {args.nodes} on dynamic-security mosquitto, {args.rounds} rounds, "
             f"{args.pairs} pair(s) alternately", f"{'':10s} {'round time (median)':>20s} {'bytes/round':>14s}"]
    for kind in ("unsigned", "signed"):
        lines.append(f"{kind:10s} {summary[kind]['round_seconds'] * 1000:17.1f} ms {summary[kind]['bytes_per_round']:14,}")
    lines.append(f"{'cost':10s} {cost['round_seconds'] * 100:+18.1f} % {cost['bytes_per_round'] * 100:+13.1f} %")
    emit(result, args, "\n".join(lines))
    return 0


def _without_keys(signed: Path, out: Path) -> Path:
    """The same credentials without the per-node device keys: the agents run unsigned."""
    doc = json.loads(signed.read_text())
    doc.pop("member_keys", None)
    for entry in doc["agents"].values():
        entry.pop("device_key", None)
    out.write_text(json.dumps(doc))
    out.chmod(0o600)
    return out


def _fleet(broker: MosquittoBroker, creds: Path, work: Path, args: argparse.Namespace) -> dict[str, float] | None:
    """One fleet's run: median round time (s) and bytes published per round."""
    work.mkdir()
    topics = Topics(JOB)
    reader = broker.dashboard_credentials
    listener = MqttTransport(f"bench-signatures-{time.monotonic_ns()}", broker.url,
                             username=reader.username, password=reader.password)
    _clear_retained(broker, topics, args.nodes)
    listener.connect([f"{broker.prefix}/#"])
    options: dict[str, Any] = {"job": JOB, "fleet_size": args.nodes, "rounds": args.rounds, "eval_every": 0,
                               "credentials": str(creds)}
    fleet = Fleet([AgentSpec(n, broker.url, options, work / f"ckpt-{n}", work / f"agent-{n}.log")
                   for n in range(args.nodes)])
    telemetry: dict[int, list[Telemetry]] = {n: [] for n in range(args.nodes)}
    counted = {"bytes": 0}
    started: dict[str, float] = {}
    fleet.start_all()
    try:
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            for message in listener.receive(0.2):
                _count(message.topic, message.payload, topics, telemetry, counted, started, args)
            if all(t and t[-1].round >= args.rounds - 1 for t in telemetry.values()):
                break
        else:
            return None
    finally:
        fleet.stop_all(grace=10)
        listener.close()
    rounds = [t.phase_seconds.get("total", 0.0) for ts in telemetry.values() for t in ts if t.round >= WARMUP_ROUNDS]
    measured = args.rounds - WARMUP_ROUNDS
    return {"round_seconds": statistics.median(rounds), "bytes_per_round": counted["bytes"] / measured}


def _clear_retained(broker: MosquittoBroker, topics: Topics, nodes: int) -> None:
    """The same job runs again: the earlier fleet's retained statuses, view and digests go."""
    admin = broker.admin_credentials
    client = MqttTransport(f"bench-signatures-admin-{time.monotonic_ns()}", broker.url,
                           username=admin.username, password=admin.password)
    client.connect([])
    try:
        for node in range(nodes):
            for topic in (topics.status(node), topics.view_of(node), topics.state(node)):
                client.publish(topic, b"", retain=True, reliable=True)
    finally:
        client.close()


def _count(topic: str, payload: bytes, topics: Topics, telemetry: dict[int, list[Telemetry]],
           counted: dict[str, int], started: dict[str, float], args: argparse.Namespace) -> None:
    """Telemetry kept; every payload's bytes counted once the fleet is past its warm-up rounds."""
    if (node := topics.parse_telemetry(topic)) is not None:
        try:
            telemetry[node].append(Telemetry.decode(payload))
        except MessageError:
            return
        if "at" not in started and all(t and t[-1].round >= WARMUP_ROUNDS - 1 for t in telemetry.values()):
            started["at"] = time.monotonic()
        return  # the report of a round, not what the round costs
    if "at" in started:
        counted["bytes"] += len(payload)
