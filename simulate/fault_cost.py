"""`edgegrove analyze fault-cost`: what link faults cost an FT-tree allreduce step.

The thesis's scenarios (Tables 1 and 2): no fault; one link fault; two parallel faults (two
links at the same height); two serial faults (links at consecutive heights), with a fixed
timeout T. Each step is run by the virtual fleet (``simulate.virtual_fleet``: N agent cores) on
the in-memory bus with a broker-like throughput and per-message latency, the links cut before
the step.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass

from agent.model.mlp import PARAM_COUNT
from agent.protocol.allreduce import AllreduceConfig
from agent.protocol.topology import Tree
from simulate.thesis import THESIS_ONE_FAULT_T, THESIS_TWO_SERIAL_T
from simulate.virtual_fleet import FaultSpec, FleetConfig, VirtualFleet

DESCRIPTION = (
    "Allreduce step time with 0, 1, 2 parallel and 2 serial link faults (fixed timeout T), "
    "simulated on the deterministic in-memory bus, beside the thesis's measurements."
)
SCENARIOS = ("fault_free", "one_fault", "two_parallel", "two_serial")


@dataclass(frozen=True)
class FaultCostRow:
    nodes: int
    timeout: float
    seconds: dict[str, float]  # scenario -> step duration
    extra_in_t: dict[str, float]  # scenario -> (duration - fault-free) / T
    degraded: dict[str, bool]


def scenario_links(nodes: int, arity: int = 2) -> dict[str, list[tuple[int, int]]]:
    """The links each scenario cuts: the last leaf's uplink; the same plus the uplink of the
    first node at the deepest level (parallel); the same plus its parent's uplink (serial)."""
    tree = Tree(tuple(range(nodes)), arity)
    leaf = tree.members[-1]
    parent = tree.parent(leaf)
    if parent is None:
        raise ValueError("fault-cost needs at least 2 nodes")
    deepest = [m for m in tree.members if tree.depth(m) == tree.depth(leaf)]
    other = next((m for m in deepest if tree.parent(m) != parent), None)
    grand = tree.parent(parent)
    links: dict[str, list[tuple[int, int]]] = {"fault_free": [], "one_fault": [(leaf, parent)]}
    if other is not None:
        links["two_parallel"] = [(leaf, parent), (other, tree.parent(other) or 0)]
    if grand is not None:
        links["two_serial"] = [(leaf, parent), (parent, grand)]
    return links


def step_time(nodes: int, cuts: list[tuple[int, int]], *, timeout: float, length: int,
              chunk_size: int, broker_bandwidth: float, latency: float, arity: int = 2,
              seed: int = 0) -> tuple[float, bool]:
    """Duration of one allreduce step (first start to last result) with ``cuts`` in place."""
    config = FleetConfig(
        nodes=nodes, rounds=1, length=length, arity=arity, seed=seed, latency=latency,
        broker_bandwidth=broker_bandwidth,
        allreduce=AllreduceConfig(chunk_size=chunk_size, timeout_mode="fixed", fixed_timeout=timeout,
                                  round_deadline=max(10.0, 20 * timeout)),
        faults=tuple(FaultSpec("cut", 0, a, b) for a, b in cuts),
    )
    fleet = VirtualFleet(config)
    record = fleet.run()[0]
    fleet.release()
    return record.duration, record.degraded


def fault_cost_table(nodes: list[int], timeout: float = 0.5, length: int = PARAM_COUNT,
                     chunk_size: int = 16_384, broker_bandwidth: float = 500e6,
                     latency: float = 0.0002, arity: int = 2) -> list[FaultCostRow]:
    rows = []
    for n in nodes:
        seconds: dict[str, float] = {}
        degraded: dict[str, bool] = {}
        for name, cuts in scenario_links(n, arity).items():
            seconds[name], degraded[name] = step_time(
                n, cuts, timeout=timeout, length=length, chunk_size=chunk_size,
                broker_bandwidth=broker_bandwidth, latency=latency, arity=arity)
        base = seconds["fault_free"]
        extra = {k: (v - base) / timeout for k, v in seconds.items()}
        rows.append(FaultCostRow(n, timeout, seconds, extra, degraded))
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, nargs="+", default=[7, 15, 31],
                        help="fleet sizes to simulate (at least 2 each)")
    parser.add_argument("--timeout", type=float, default=0.5, help="the fixed link timeout T in seconds")
    parser.add_argument("--arity", type=int, default=2, help="tree arity k")
    parser.add_argument("--values", type=int, default=PARAM_COUNT,
                        help="float32 values per gradient (407,050 = the thesis MLP, 1.63 MB)")
    parser.add_argument("--chunk-size", type=int, default=16_384, help="values per chunk")
    parser.add_argument("--broker-mbps", type=float, default=500.0,
                        help="broker throughput in MB/s (shared by all messages)")
    parser.add_argument("--latency-ms", type=float, default=0.2, help="per-message latency in ms")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def run(args: argparse.Namespace) -> int:
    if any(n < 2 for n in args.nodes) or args.timeout <= 0 or args.values < 1 or args.chunk_size < 1:
        print("fault-cost: need --nodes >= 2, --timeout > 0, --values >= 1, --chunk-size >= 1",
              file=sys.stderr)
        return 2
    rows = fault_cost_table(args.nodes, args.timeout, args.values, args.chunk_size,
                            args.broker_mbps * 1e6, args.latency_ms / 1000, args.arity)
    if args.json:
        doc = {"timeout": args.timeout, "values": args.values, "chunk_size": args.chunk_size,
               "broker_bytes_per_s": args.broker_mbps * 1e6, "latency_s": args.latency_ms / 1000,
               "arity": args.arity, "thesis_in_t": {"one_fault": THESIS_ONE_FAULT_T,
                                                    "two_serial": THESIS_TWO_SERIAL_T},
               "rows": [asdict(r) for r in rows]}
        print(json.dumps(doc, indent=2))
        return 0
    print(render(rows, args.timeout))
    return 0


def render(rows: list[FaultCostRow], timeout: float) -> str:
    head = f"{'nodes':>5}  " + "  ".join(f"{s:>22}" for s in SCENARIOS)
    lines = [f"FT-tree allreduce step, fixed timeout T = {timeout:g} s "
             f"(seconds; extra over fault-free in units of T)", head]
    for row in rows:
        cells = []
        for s in SCENARIOS:
            if s not in row.seconds:
                cells.append(f"{'n/a':>22}")
                continue
            mark = "*" if row.degraded[s] else " "
            cells.append(f"{row.seconds[s]:>10.3f} s (+{row.extra_in_t[s]:.2f} T){mark}")
        lines.append(f"{row.nodes:>5}  " + "  ".join(cells))
    lines.append(f"thesis (Table 1): one fault ~ {THESIS_ONE_FAULT_T} T, two serial ~ "
                 f"{THESIS_TWO_SERIAL_T} T over fault-free; * = degraded step")
    return "\n".join(lines)
