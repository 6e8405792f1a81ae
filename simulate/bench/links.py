"""`edgegrove bench links`: slow links (issue 19), every agent's link limited from round 1.

For every link rate in --rates (MB/s, MB = 10^6 bytes) and every wire format in --wires:
one real run (--repeats runs) of --nodes agents on real mosquitto (`edgegrove simulate`,
one agent process per node, ft-tree, default agent options), --rounds rounds, in which every
agent's TCP proxy limits each direction of its broker connection to the rate from round 1
on (the simulator's `bandwidth` fault on every agent). The test set is evaluated at round 0
and after the last round only. One table row per run:

MEDIAN ALLREDUCE: the slowest agent's allreduce phase per round, median over the rounds
from round 2 on (round 0 is not limited; the limit starts while the fastest agent enters
round 1).

BOUND: the busiest link's bound. Over all agents and both directions of their connection,
the most bytes one fault-free allreduce moves through one agent's proxy, divided by the
rate. Counted exactly from the tree the agents build (binary, heap order, chunks of the
agents' chunk_size, 262,144 values by default; on a slow link the coordinator soon cuts
chunks of 32,768 values, whose headers and ACKs add 0.1-0.4 % to the bound: it counts the
configured size, the lower): every PUBLISH an agent sends goes up
through its proxy, every one it receives comes down through it, each as MQTT packet bytes
(fixed header, topic, wire frame: header, contributor bitmap, values at the wire's bytes
per value, CRC), data chunks and one ACK per chunk. An inner node of the binary tree is the
busiest, with ~3 x the vector each way (up: its subtree's mean to its parent and the result
to its two children; down: its children's means and the result), so at 7 agents in float32
3 x 1.63 MB = 4.9 MB each way (0.39 s at 12.5 MB/s), a quarter of it in int8. A lower
bound: it ignores the broker, the CPU, and that a node forwards a chunk only once it has
it whole (the pipeline's fill and drain).

X BOUND: median allreduce / bound. AFTER LAST GRADIENT: per round, from the moment the last
agent had its gradient to the moment the last agent had the result (the agents' wall clocks:
one host), median over the same rounds, and its ratio to the bound; the agent's own phase also
holds its wait for the other agents' gradients, computed on the same cores. DEGRADED ROUNDS: rounds in which any agent reported a
degraded round, of all rounds. BYTES/MODEL: per round, the link bytes the agents sent
(telemetry, summed over agents) over the wire frames of one fault-free allreduce (the
bound's count without MQTT headers); median and max over the rounds from round 2 on.
ACCURACY: test accuracy (all 10,000 test images, mean over agents) after the last round,
the same number of rounds for every wire format; VS FLOAT32: its difference from float32's
at the same rate, in percentage points.

AUTO (--wires auto, agent option wire_dtype = "auto"): every agent picks each frame's format
from its links' measured rates: the link's drains and its own link's rate from large messages'
arrival (agent/protocol/wire_choice.py). Its bound and bytes/model are
those of the format its agents sent most frames of values in (from round 2 on; the wire
column says which: "auto (int8)"; "-" when the agents did not say); its bytes/model compare
each round with the model's bytes in the mix of formats that round's frames used. Issue 19
wants it never more than 20 % slower than the best fixed format at the same rate.

NO LIMIT (on by default; --no-floor leaves it out): first, one run of every wire format with
every agent's shaper in place (its proxy, or its namespace and qdiscs) but limiting
nothing (FLOOR_RATE_MB_S), the same fleet and
rounds: the host's own floor (its CPU, the broker, the agents and the simulator's proxies,
one Python process, sharing its cores; at 7 agents in int8 the proxies alone took a round
from 0.042 to ~0.08 s on a 2-core host). A link's bound below it is out of reach on this host
whatever the protocol does; X MAX(BOUND, NO LIMIT) compares the median with the larger of the
two (a perfect pipeline hides the faster one behind the slower). Auto's floor is auto's own
run with no limit.

SHAPER (--shaper): what limits the links. proxy (the default): every agent's user-space TCP
proxy, all of them threads of the simulator's one Python process, whose CPU shares the host's
cores with the agents and the broker. kernel: every agent runs in a network namespace of its
own, joined to the host by a veth pair with a tbf qdisc on each end (its uplink and its
downlink), and reaches the broker on 127.0.0.1 through a DNAT on the veth's host end: no
process of ours in the path, as on a real Wi-Fi or Ethernet link (root, iproute2, iptables).
The veth's MTU is 32 KB (simulate/injector.py: NETNS_MTU): with Ethernet's 1,500 bytes every
agent's and the broker's packets cost the host's few cores so much that the no-limit floor
doubled (7 agents, float32, 2 cores: 0.095 s against 0.046 s), where a real Pi's network stack
runs on its own CPU. The qdisc counts whole frames, so it is set (MTU + 14) / (MTU - 52) above
the rate: the rate stays that of TCP payload, as the proxy's and the bound's. TCP's small
queues keep the qdisc's own queue short: the backlog stays in the sender's socket, as behind
the proxy.

--loss-burst AGENT: also a burst of 20 % frame loss on that agent (its link frames, sent and
received) in rounds 5 and 6; RECOVERY: the rounds after the burst until every later round is
back within 1.25x the median of the clean rounds before it and not degraded (issue 19: within
3 rounds; none: never, or the fleet was not clean before the burst).

Other processes on the host (other fleets) share its CPU and slow the agents down: each run
records the 1-minute load average at its start. Issue 19's "must show" criteria that these
figures decide are checked at the end of the table.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from agent.protocol import wire
from agent.protocol.allreduce import DEFAULT_CHUNK_VALUES
from agent.validate import UsageError, arg, one_line, output_dir, positive_seconds, whole
from simulate.bench.accuracy import agent_options, curve, pct
from simulate.bench.allreduce import WARMUP_ROUNDS, split_rounds
from simulate.bench.broker import allreduce_publishes
from simulate.bench.common import (
    add_output_arguments,
    document,
    emit,
    format_table,
    progress,
    summary,
)
from simulate.bench.fleetrun import FleetRun, FleetScenario, run_fleet
from simulate.injector import NETNS_MTU

DESCRIPTION = __doc__
DEFAULT_RATES = (2.0, 6.0, 12.5, 50.0)  # MB/s: slow Wi-Fi, Wi-Fi, 100 Mbit/s Ethernet, fast
FIXED_WIRES = tuple(wire.WIRE_DTYPES)  # float32, float16, int8
AUTO_WIRE = "auto"
WIRES = (*FIXED_WIRES, AUTO_WIRE)
REFERENCE_WIRE = "float32"
SHAPERS = ("proxy", "kernel")
ARITY = 2  # the agents' default tree
MIN_RATE_MB_S = 0.001  # the bandwidth fault's floor: 1000 bytes/s
FLOOR_RATE_MB_S = 10_000.0  # "no limit": the proxies in the path, 10 GB/s (faster than loopback)
# Options the bench sets itself in every run.
OWN_OPTIONS = frozenset({"wire_dtype", "eval_every", "eval_samples"})
# Issue 19's "must show" bounds.
MAX_BYTES_OVER_MODEL = 1.1
MAX_RATIO_TO_BOUND = 1.5
MAX_ACCURACY_DROP_PP = 0.3
MAX_AUTO_OVER_BEST = 1.2  # auto's median allreduce over the best fixed format's, same rate
# --loss-burst: LOSS_BURST_P frame loss on one agent for LOSS_BURST_ROUNDS rounds from round
# LOSS_BURST_AT (issue 19: "back to full speed within MAX_RECOVERY_ROUNDS rounds of the
# burst"); full speed: within RECOVERED_FACTOR of the median of the rounds before it.
LOSS_BURST_P = 0.2
LOSS_BURST_AT = 5
LOSS_BURST_ROUNDS = 2
MAX_RECOVERY_ROUNDS = 3
RECOVERED_FACTOR = 1.25


def rate_mb_s(text: str) -> float:
    """A link rate in MB/s (10^6 bytes per second), at least 0.001 and finite."""
    try:
        value = float(str(text).strip())
    except ValueError:
        raise UsageError(f"{text!r} is not a link rate: give MB/s, e.g. 6 or 12.5") from None
    if not MIN_RATE_MB_S <= value < math.inf:
        raise UsageError(f"{text} is not a usable link rate: give MB/s >= {MIN_RATE_MB_S:g}, e.g. 6 or 12.5")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=arg(whole(2, 256, "a fleet size")), default=7,
                        help="agents in every fleet")
    parser.add_argument("--rates", type=arg(rate_mb_s), nargs="+", default=list(DEFAULT_RATES),
                        metavar="MB_S", help="link rates, MB/s (10^6 bytes/s) each way through every agent's proxy")
    parser.add_argument("--wires", nargs="+", choices=WIRES, default=list(FIXED_WIRES),
                        help="wire formats of the values (agent option wire_dtype; auto: each agent "
                             "picks per link from its measured rate)")
    parser.add_argument("--rounds", type=arg(whole(WARMUP_ROUNDS + 1, None, "a number of rounds")), default=30,
                        help=f"rounds of every run (the medians leave out the first {WARMUP_ROUNDS})")
    parser.add_argument("--repeats", type=arg(whole(1, None, "a number of runs")), default=1,
                        help="runs of every rate and wire format (one table row each)")
    parser.add_argument("--agent-option", action="append", default=[], metavar="KEY=VALUE",
                        help="extra agent option for every run, e.g. round_deadline=8 (repeatable; "
                             f"not {', '.join(sorted(OWN_OPTIONS))}: the bench sets them)")
    parser.add_argument("--loss-burst", type=arg(whole(0, 255, "an agent id")), default=None, metavar="AGENT",
                        help=f"also drop {LOSS_BURST_P * 100:.0f} %% of AGENT's link frames (sent and received) in "
                             f"rounds {LOSS_BURST_AT}-{LOSS_BURST_AT + LOSS_BURST_ROUNDS - 1}, and report how many "
                             "rounds after the burst the fleet is back to full speed")
    parser.add_argument("--shaper", choices=SHAPERS, default="proxy",
                        help="what limits the links: proxy = every agent's user-space TCP proxy (the "
                             "simulator's bandwidth fault; its CPU shares the host's cores); kernel = every "
                             "agent in a network namespace of its own, a tbf qdisc on each direction of "
                             "its veth link, the broker reached through a DNAT (root, iproute2, iptables; "
                             "no process of ours in the path, as on a real link)")
    parser.add_argument("--no-floor", dest="floor", action="store_false",
                        help="leave out the runs with no link limit (one per wire format, first, through "
                             "the same proxies: the host's own floor, beside the links' bound)")
    parser.add_argument("--budget", type=arg(positive_seconds), default=900.0,
                        help="wall-clock budget of one run in seconds (interrupted after it)")
    parser.add_argument("--keep", type=arg(output_dir), default=None, metavar="DIR",
                        help="keep the run directories in DIR (default %(default)s: a temporary "
                             "directory, removed at the end)")
    add_output_arguments(parser)


# ---------------------------------------------------------------------------------------
# The model of one round: bytes per link and the bound
# ---------------------------------------------------------------------------------------

def _topic_prefix() -> str:
    """The topics' prefix in a simulator run (its job name has a fixed length)."""
    from simulate.simulation import fresh_job_name

    return f"edgegrove/{fresh_job_name()}"


def link_loads(nodes: int, wire_dtype: str, chunk_values: int = DEFAULT_CHUNK_VALUES,
               prefix: str = "edgegrove/job") -> tuple[dict[tuple[int, str], int], int]:
    """Bytes through every agent's proxy in one fault-free allreduce, by (agent, "up" | "down"):
    the MQTT bytes of every PUBLISH it sends (up) or receives (down); and the wire frames of
    the whole allreduce (what the agents' telemetry counts as bytes sent, summed over agents)."""
    loads: Counter[tuple[int, str]] = Counter()
    model_bytes = 0
    for publish in allreduce_publishes(nodes, chunk_values=chunk_values, dtype=wire.WIRE_DTYPES[wire_dtype],
                                       arity=ARITY, prefix=prefix):
        loads[publish.sender, "up"] += publish.mqtt_bytes
        loads[publish.receiver, "down"] += publish.mqtt_bytes
        model_bytes += publish.frame_bytes
    return dict(loads), model_bytes


def link_bound(nodes: int, wire_dtype: str, rate_mb: float, chunk_values: int = DEFAULT_CHUNK_VALUES,
               prefix: str = "edgegrove/job") -> dict[str, Any]:
    """The busiest link of one fault-free allreduce (``link_loads``: the most bytes through one
    agent's proxy in one direction; the lowest id on a tie) and its bound at ``rate_mb`` MB/s."""
    if rate_mb <= 0:
        raise ValueError(f"rate must be positive, got {rate_mb}")
    loads, model_bytes = link_loads(nodes, wire_dtype, chunk_values, prefix)
    (node, direction), busiest = max(loads.items(), key=lambda x: (x[1], -x[0][0]), default=((0, "up"), 0))
    return {"node": node, "direction": direction, "bytes": busiest, "model_bytes": model_bytes,
            "bound_s": round(busiest / (rate_mb * 1e6), 5)}


# ---------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------

def plan(args: argparse.Namespace) -> list[tuple[float, str, int]]:
    """(rate MB/s, wire, repeat) of every run: rate by rate, every wire at each rate."""
    return [(rate, dtype, i) for rate in args.rates for dtype in args.wires for i in range(args.repeats)]


def extra_options(args: argparse.Namespace) -> dict[str, Any]:
    """The --agent-option pairs; a UsageError if one is malformed or is the bench's own."""
    from simulate.scenario import ScenarioError

    try:
        options = agent_options(args.agent_option)
    except ScenarioError as exc:
        raise UsageError(str(exc)) from None
    own = sorted(set(options) & OWN_OPTIONS)
    if own:
        raise UsageError(f"--agent-option {', '.join(own)}: the bench sets it itself (--wires, "
                         "evaluation after the last round)")
    return options


def run_name(args: argparse.Namespace, what: str) -> str:
    """A run's name: the fleet, ``what`` (the rate and format), the shaper unless the proxy."""
    return f"links-{args.nodes}-{what}" + ("" if args.shaper == "proxy" else f"-{args.shaper}")


def scenario_for(args: argparse.Namespace, rate: float, dtype: str, repeat: int) -> FleetScenario:
    # Evaluated at round 0 (0 % rounds == 0) and at the last round (an agent always is).
    agent = {**extra_options(args), "wire_dtype": dtype, "eval_every": args.rounds, "eval_samples": 10000}
    name = run_name(args, f"{rate:g}MBs-{dtype}" + (f"-{repeat + 1}" if args.repeats > 1 else ""))
    burst = None
    if args.loss_burst is not None:
        if args.loss_burst >= args.nodes:
            raise UsageError(f"--loss-burst {args.loss_burst}: the fleet has agents 0-{args.nodes - 1}")
        if args.rounds < LOSS_BURST_AT + LOSS_BURST_ROUNDS + MAX_RECOVERY_ROUNDS + 1:
            raise UsageError(f"--loss-burst needs --rounds >= "
                             f"{LOSS_BURST_AT + LOSS_BURST_ROUNDS + MAX_RECOVERY_ROUNDS + 1}")
        burst = (args.loss_burst, LOSS_BURST_P, LOSS_BURST_AT, LOSS_BURST_ROUNDS)
    return FleetScenario(name, args.nodes, args.rounds, agent, per_node_bandwidth=rate * 1e6,
                         bandwidth_via=args.shaper, loss_burst=burst)


def floor_scenario(args: argparse.Namespace, dtype: str) -> FleetScenario:
    """The same fleet through the same proxies, limiting nothing (and no loss burst): the host's
    floor for ``dtype``."""
    spec = scenario_for(args, FLOOR_RATE_MB_S, dtype, 0)
    return replace(spec, name=run_name(args, f"nolimit-{dtype}"), loss_burst=None)


def round_figures(run: FleetRun) -> dict[str, Any]:
    """What every run reports of its rounds: the medians over the rounds from WARMUP_ROUNDS on,
    the degraded rounds of all of them, the frames of values sent by format."""
    measured = [r for r in run.rows if int(r["round"]) >= WARMUP_ROUNDS]
    times = split_rounds(run.rows, None, None)["fault_free"]
    spread = summary(times) if times else None
    after = [float(a) for r in measured if (a := r.get("after_last_gradient_s")) is not None]
    return {"rounds": len(run.rows), "finished": run.finished, "error": run.error,
            "wall_seconds": round(run.wall_seconds, 1),
            "allreduce_s_median": round(spread["median"], 4) if spread else None,
            "allreduce_s_p90": round(spread["p90"], 4) if spread else None,
            "allreduce_s_max": round(spread["max"], 4) if spread else None,
            "after_last_gradient_s_median": round(statistics.median(after), 4) if after else None,
            "degraded_rounds": sum(1 for r in run.rows if (r.get("degraded_nodes") or 0) > 0),
            "wire_frames": wire_frames_used(measured)}


def floor_result(run: FleetRun, dtype: str, load: float | None = None) -> dict[str, Any]:
    """A run with no link limit: its median allreduce (the same rounds as a limited run's)."""
    return {"wire_dtype": dtype, "load_1m_at_start": load, **round_figures(run)}


def add_floors(results: list[dict[str, Any]], floors: list[dict[str, Any]]) -> None:
    """Each limited run's floor (the no-limit median of its wire format) and its median over
    the larger of its bound and that floor."""
    by_wire = {f["wire_dtype"]: f["allreduce_s_median"] for f in floors}
    for r in results:
        floor = by_wire.get(r["wire_dtype"])
        r["floor_s"] = floor
        limit = max(r["bound_s"] or 0.0, floor or 0.0)
        median = r["allreduce_s_median"]
        r["ratio_to_bound_or_floor"] = round(median / limit, 2) if floor and median is not None and limit else None


def recovery_rounds(by_round: list[float | None], at: int = LOSS_BURST_AT,
                    rounds: int = LOSS_BURST_ROUNDS, degraded: list[bool] | None = None) -> int | None:
    """Rounds after a loss burst (rounds ``at`` .. ``at + rounds - 1``) until every later round
    is at full speed: not degraded, and within RECOVERED_FACTOR of the median of the clean
    measured rounds before the burst. None: never back, or no clean round before the burst to
    compare with (a fleet already collapsed before it has no full speed to return to)."""
    bad = degraded or [False] * len(by_round)
    before = [t for t, d in zip(by_round[WARMUP_ROUNDS:at], bad[WARMUP_ROUNDS:at], strict=True)
              if t is not None and not d]
    end = at + rounds
    if not before or len(by_round) <= end:
        return None
    limit = RECOVERED_FACTOR * statistics.median(before)
    for k in range(end, len(by_round)):
        if all(t is not None and t <= limit and not d for t, d in zip(by_round[k:], bad[k:], strict=True)):
            return k - end
    return None


def check(args: argparse.Namespace) -> None:
    """Everything about the arguments that argparse cannot see, before anything starts: the
    agent options and every run's scenario as the simulator will read it."""
    from simulate.injector import kernel_shaping_supported
    from simulate.scenario import ScenarioError, parse_scenario

    if args.shaper == "kernel" and (problem := kernel_shaping_supported()):
        raise UsageError(f"--shaper kernel: {problem}")
    for rate, dtype, repeat in plan(args):
        spec = scenario_for(args, rate, dtype, repeat)
        try:
            parse_scenario(spec.toml(), spec.name)
        except ScenarioError as exc:
            raise UsageError(str(exc)) from None


def chunk_values(spec: FleetScenario) -> int:
    """Values per chunk in the run: the agents' default unless an agent option set it."""
    return int(spec.agent.get("chunk_size", DEFAULT_CHUNK_VALUES))


def run_result(run: FleetRun, rate: float, dtype: str, repeat: int, prefix: str = "edgegrove/job",
               load: float | None = None) -> dict[str, Any]:
    """One run's figures (see the module's description)."""
    spec = run.scenario
    figures = round_figures(run)
    measured = [r for r in run.rows if int(r["round"]) >= WARMUP_ROUNDS]
    used = figures["wire_frames"]
    # auto: the bound of the format the agents used most (none said: no bound)
    bound_wire = dtype if dtype != AUTO_WIRE else max(used, key=lambda w: used[w], default=None)
    bound: dict[str, Any] = {"node": None, "direction": None, "bytes": None, "model_bytes": None, "bound_s": None}
    if bound_wire in wire.WIRE_DTYPES:
        bound = link_bound(spec.nodes, bound_wire, rate, chunk_values(spec), prefix)
    model = bound["model_bytes"]
    over = [float(r.get("bytes_sent") or 0) / model for r in measured] if model else []
    if dtype == AUTO_WIRE and model:
        # Each round against the model's bytes in the formats that round used: the first
        # limited rounds still go wide (their links' rates are not known yet).
        models = {w: link_bound(spec.nodes, w, rate, chunk_values(spec), prefix)["model_bytes"]
                  for w in used if w in wire.WIRE_DTYPES}
        over = [float(r.get("bytes_sent") or 0) / _mixed_model_bytes(r, models, model) for r in measured]
    median, after_median = figures["allreduce_s_median"], figures["after_last_gradient_s_median"]
    points = curve(run)
    last = points[-1] if points and points[-1]["round"] == spec.rounds - 1 else None
    return {
        "rate_mb_s": rate, "wire_dtype": dtype, "repeat": repeat, "nodes": spec.nodes,
        **figures, "rounds_planned": spec.rounds, "load_1m_at_start": load,
        # the simulator stopped waiting: no agent reported for its stall timeout
        "halted": bool(run.summary.get("halted")), "last_round_reporters": run.summary.get("last_round_reporters"),
        "busiest_link": {k: bound[k] for k in ("node", "direction", "bytes")}, "chunk_values": chunk_values(spec),
        "model_bytes": bound["model_bytes"], "bound_s": bound["bound_s"],
        "ratio_to_bound": round(median / bound["bound_s"], 2) if median is not None and bound["bound_s"] else None,
        # From the last agent's gradient to the last agent's result (the agents' own phase also
        # holds their wait for the others' gradients, computed on the same cores)
        "after_last_gradient_ratio_to_bound": (round(after_median / bound["bound_s"], 2)
                                               if after_median is not None and bound["bound_s"] else None),
        "bound_wire": bound_wire,
        "bytes_over_model_median": round(statistics.median(over), 3) if over else None,
        "bytes_over_model_max": round(max(over), 3) if over else None,
        "timeouts": sum(int(r.get("timeouts") or 0) for r in run.rows),
        "reroutes": sum(int(r.get("reroutes") or 0) for r in run.rows),
        "accuracy": None if last is None else last["accuracy"],
        "accuracy_round": None if last is None else last["round"],
        "allreduce_s_by_round": [r.get("allreduce_s_max") for r in run.rows],
        **_burst_fields(spec, run.rows),
    }


def _mixed_model_bytes(row: dict[str, Any], models: dict[str, int], default: int) -> float:
    """One fault-free allreduce's frames in the mix of formats ``row``'s frames of values used
    (each format's model bytes weighted by its share of those frames; ``default`` when the
    round says nothing)."""
    from simulate.report import parse_wire_frames

    frames = {w: n for w, n in parse_wire_frames(row.get("wire_frames")).items() if w in models}
    total = sum(frames.values())
    return sum(n / total * models[w] for w, n in frames.items()) if total else float(default)


def wire_frames_used(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Frames of values the agents sent by wire format over ``rows`` (rounds.csv's
    wire_frames), most used first."""
    from simulate.report import parse_wire_frames

    total: Counter[str] = Counter()
    for r in rows:
        total.update(parse_wire_frames(r.get("wire_frames")))
    return dict(total.most_common())


def _burst_fields(spec: FleetScenario, rows: list[dict[str, Any]]) -> dict[str, Any]:
    if spec.loss_burst is None:
        return {}
    node, p, at, rounds = spec.loss_burst
    by_round = [r.get("allreduce_s_max") for r in rows]
    degraded = [(r.get("degraded_nodes") or 0) > 0 for r in rows]
    return {"loss_burst": {"node": node, "p": p, "at_round": at, "rounds": rounds},
            "recovery_rounds": recovery_rounds(by_round, at, rounds, degraded),
            "degraded_outside_burst": sum(1 for r in rows if (r.get("degraded_nodes") or 0) > 0
                                          and not at <= int(r["round"]) < at + rounds)}


def add_accuracy_deltas(results: list[dict[str, Any]]) -> None:
    """Each run's accuracy minus float32's at the same rate and repeat (percentage points)."""
    for r in results:
        ref = next((x for x in results if x["wire_dtype"] == REFERENCE_WIRE and x["rate_mb_s"] == r["rate_mb_s"]
                    and x["repeat"] == r["repeat"]), None)
        ok = ref is not None and ref["accuracy"] is not None and r["accuracy"] is not None
        r["accuracy_vs_float32_pp"] = round(100 * (r["accuracy"] - ref["accuracy"]), 2) if ok and ref else None


def criteria(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 19's "must show" items this bench measures: text, whether it holds, the worst."""
    results, repeats = doc["results"], doc.get("repeats", 1)
    out: list[dict[str, Any]] = []

    def item(text: str, bad: list[str]) -> None:
        out.append({"criterion": text, "holds": bool(results) and not bad, "misses": bad})

    # A loss burst's resends are what it is for: its run counts for degraded rounds only.
    item(f"no degraded round and bytes per round <= {MAX_BYTES_OVER_MODEL}x the model's bytes, every rate and format"
         + (" (bytes: the runs without a loss burst)" if any("loss_burst" in r for r in results) else ""),
         [f"{run_label(r, repeats)}: {r['degraded_rounds']} degraded, max {r['bytes_over_model_max']}x" for r in results
          if r["degraded_rounds"] or ("loss_burst" not in r and (
              r["bytes_over_model_max"] is None or r["bytes_over_model_max"] > MAX_BYTES_OVER_MODEL))])
    # The bound is a whole fault-free allreduce's: a fleet whose rounds end degraded (members
    # that gave up waiting, or were dropped) can be fast without meeting it.
    item(f"median allreduce <= {MAX_RATIO_TO_BOUND}x the busiest link's bound, every rate and format",
         [f"{run_label(r, repeats)}: {r['ratio_to_bound']}x" + (f" over {r['degraded_rounds']} degraded rounds"
                                                    if r["degraded_rounds"] else "")
          for r in results if r["ratio_to_bound"] is None or r["ratio_to_bound"] > MAX_RATIO_TO_BOUND
          or r["degraded_rounds"]])
    if doc.get("floor"):
        item(f"(not the issue's; the host's floor) median allreduce <= {MAX_RATIO_TO_BOUND}x the larger of the "
             "busiest link's bound and the same fleet's median with no link limit, every rate and format",
             [f"{run_label(r, repeats)}: {r['ratio_to_bound_or_floor']}x" for r in results
              if r.get("ratio_to_bound_or_floor") is None or r["ratio_to_bound_or_floor"] > MAX_RATIO_TO_BOUND
              or r["degraded_rounds"]])
    burst = [r for r in results if "loss_burst" in r]
    if burst:
        item(f"a {LOSS_BURST_ROUNDS}-round burst of {LOSS_BURST_P:.0%} loss on one agent at round "
             f"{LOSS_BURST_AT}: back to full speed within {MAX_RECOVERY_ROUNDS} rounds of it",
             [f"{run_label(r, repeats)}: " + ("never back" if r["recovery_rounds"] is None
                                             else f"{r['recovery_rounds']} rounds") for r in burst
              if r["recovery_rounds"] is None or r["recovery_rounds"] > MAX_RECOVERY_ROUNDS])
    autos = [r for r in results if r["wire_dtype"] == AUTO_WIRE]
    if autos:
        item(f"auto never worse than the best fixed format by more than {MAX_AUTO_OVER_BEST - 1:.0%} in time "
             "(median allreduce, same rate)", [m for r in autos if (m := _auto_miss(r, results, repeats))])
    item(f"float16 and int8{' (and auto)' if autos else ''} test accuracy within {MAX_ACCURACY_DROP_PP} pp of "
         f"float32 after {doc['rounds']} rounds (same rate)",
         [f"{run_label(r, repeats)}: {r['accuracy_vs_float32_pp']} pp" for r in results if r["wire_dtype"] != REFERENCE_WIRE
          and (r.get("accuracy_vs_float32_pp") is None or abs(r["accuracy_vs_float32_pp"]) > MAX_ACCURACY_DROP_PP)])
    return out


def _auto_miss(r: dict[str, Any], results: list[dict[str, Any]], repeats: int) -> str | None:
    """Why auto run ``r`` misses its criterion (None: it holds): slower than MAX_AUTO_OVER_BEST
    x the fastest fixed format at its rate and repeat, or nothing to compare with."""
    fixed = [x for x in results if x["wire_dtype"] != AUTO_WIRE and x["rate_mb_s"] == r["rate_mb_s"]
             and x["repeat"] == r["repeat"] and x["allreduce_s_median"] is not None]
    if not fixed:
        return f"{run_label(r, repeats)}: no fixed format ran at this rate"
    best = min(fixed, key=lambda x: x["allreduce_s_median"])
    if r["allreduce_s_median"] is None:
        return f"{run_label(r, repeats)}: no median"
    ratio = r["allreduce_s_median"] / best["allreduce_s_median"]
    if ratio > MAX_AUTO_OVER_BEST:
        return f"{run_label(r, repeats)}: {ratio:.2f}x {best['wire_dtype']}'s {best['allreduce_s_median']} s"
    return None


def run_label(r: dict[str, Any], repeats: int) -> str:
    """Rate and wire format, and which run when every cell ran more than once."""
    return f"{r['rate_mb_s']:g} MB/s {_wire(r, repeats)}"


def _wire(r: dict[str, Any], repeats: int) -> str:
    name = r["wire_dtype"]
    if name == AUTO_WIRE:
        name += f" ({r.get('bound_wire') or '-'})"  # the format its bound is of
    return name + (f" #{r['repeat'] + 1}" if repeats > 1 else "")


def run(args: argparse.Namespace) -> int:
    try:
        check(args)
    except UsageError as exc:
        progress(f"edgegrove bench links: {one_line(str(exc))}")
        return 2
    cells = plan(args)
    prefix = _topic_prefix()
    results: list[dict[str, Any]] = []
    floors: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="edgegrove-bench-links-") as tmp:
        root = args.keep or Path(tmp)
        for dtype in args.wires if args.floor else []:
            spec = floor_scenario(args, dtype)
            load = round(os.getloadavg()[0], 2)
            progress(f"bench links: no link limit, {dtype} (the host's floor; load {load})")
            f = floor_result(run_fleet(spec, root / spec.name, args.budget), dtype, load)
            floors.append(f)
            progress(f"  -> median allreduce {f['allreduce_s_median']} s, {f['degraded_rounds']} degraded"
                     + (f", error: {f['error']}" if f["error"] else ""))
        for i, (rate, dtype, repeat) in enumerate(cells):
            spec = scenario_for(args, rate, dtype, repeat)
            load = round(os.getloadavg()[0], 2)
            progress(f"bench links: run {i + 1}/{len(cells)}: {rate:g} MB/s, {dtype}"
                     + (f", repeat {repeat + 1}/{args.repeats}" if args.repeats > 1 else "")
                     + f" (load {load})")
            r = run_result(run_fleet(spec, root / spec.name, args.budget), rate, dtype, repeat, prefix, load)
            results.append(r)
            progress(f"  -> median allreduce {r['allreduce_s_median']} s (bound {r['bound_s']} s), "
                     f"{r['degraded_rounds']} degraded, bytes/model max {r['bytes_over_model_max']}, "
                     f"accuracy {r['accuracy']}" + (f", error: {r['error']}" if r["error"] else ""))
    add_accuracy_deltas(results)
    add_floors(results, floors)
    doc = document("links", nodes=args.nodes, rounds=args.rounds, repeats=args.repeats, arity=ARITY,
                   measured_from_round=WARMUP_ROUNDS, agent_options=extra_options(args), results=results,
                   floor=floors, shaper=args.shaper,
                   method=("real mosquitto, one agent process per node via `edgegrove simulate`, "
                           "ft-tree, default agent options; " + SHAPER_METHODS[args.shaper]))
    doc["must_show"] = criteria(doc)
    emit(doc, args, render_table(doc))
    return 1 if any(r["error"] for r in [*results, *floors]) else 0


SHAPER_METHODS = {
    "proxy": "every agent's TCP proxy limits each direction to the rate from round 1 (bandwidth fault)",
    "kernel": ("every agent in a network namespace of its own; a tbf qdisc on each end of its veth "
               f"link (MTU {NETNS_MTU:,} bytes) limits each direction to the rate (TCP payload; the "
               "qdisc counts whole frames, set that much higher) from round 1 (bandwidth fault, "
               "via = kernel); the broker on 127.0.0.1 through a DNAT"),
}

TABLE_HEADERS = ["MB/s", "wire", "median allreduce s", "bound s", "x bound", "after last gradient s",
                 "after x bound", "degraded rounds",
                 "bytes/model median", "bytes/model max", "accuracy", "vs float32 pp",
                 "no limit s", "x max(bound, no limit)"]


def table_rows(doc: dict[str, Any]) -> list[list[Any]]:
    rows: list[list[Any]] = []
    for r in doc["results"]:
        rows.append([f"{r['rate_mb_s']:g}", _wire(r, doc.get("repeats", 1)), r["allreduce_s_median"], r["bound_s"],
                     _fixed(r["ratio_to_bound"]), r.get("after_last_gradient_s_median"),
                     _fixed(r.get("after_last_gradient_ratio_to_bound")), f"{r['degraded_rounds']} of {r['rounds']}",
                     _fixed(r["bytes_over_model_median"]), _fixed(r["bytes_over_model_max"]), pct(r["accuracy"]),
                     _fixed(r.get("accuracy_vs_float32_pp"), "+.2f"), r.get("floor_s"),
                     _fixed(r.get("ratio_to_bound_or_floor"))])
    return rows


def _fixed(value: float | None, spec: str = ".2f") -> str | None:
    """Two decimals (3 significant digits would print 0.996 as 1 and hide what it is)."""
    return None if value is None else format(value, spec)


def incomplete(r: dict[str, Any]) -> str | None:
    """Why a run did not give all its figures (None: it did)."""
    why = []
    if not r.get("finished", True):
        why.append("over its time budget")
    if r.get("halted"):
        why.append(f"the fleet halted: no agent reported for the simulator's stall timeout, "
                   f"{r.get('last_round_reporters')} of {r['nodes']} agents reported the last round")
    if r.get("error") and not why:
        why.append(r["error"])
    return "; ".join(why) or None


def criteria_lines(doc: dict[str, Any]) -> list[str]:
    """The must-show items, decided again from the results (the rule of this code)."""
    return [f"[{'holds' if c['holds'] else 'MISSED'}] {c['criterion']}"
            + ("" if c["holds"] else ": " + "; ".join(c["misses"])) for c in criteria(doc)]


def render_table(doc: dict[str, Any]) -> str:
    how = "by a tbf qdisc in the kernel" if doc.get("shaper") == "kernel" else "by its TCP proxy"
    text = (f"{doc['nodes']} agents, every agent's link limited {how} from round 1, {doc['rounds']} rounds, "
            f"medians from round {doc['measured_from_round']}; bound = busiest link's bytes / rate\n")
    text += format_table(TABLE_HEADERS, table_rows(doc))
    errors = [f"{run_label(r, doc.get('repeats', 1))}: {why}" for r in doc["results"] if (why := incomplete(r))]
    errors += [f"no limit, {f['wire_dtype']}: {f['error']}" for f in doc.get("floor") or [] if f.get("error")]
    if errors:
        text += "\n\nerrors:\n" + "\n".join(errors)
    return text + "\n\nissue 19, must show:\n" + "\n".join(criteria_lines(doc))
