"""Shared by the silent-node and flapping files: in-memory fleets on the agent core, with a
tuned harness (``run``) or the agents' own defaults and the real model's length
(``agent_defaults_run``), and what the tests read off their rounds."""

from __future__ import annotations

import statistics

from agent.config import AgentConfig
from agent.protocol.allreduce import AllreduceConfig
from agent.runtime_config import allreduce_config
from simulate.virtual_fleet import FaultSpec, FleetConfig, RoundRecord, VirtualFleet

CONFIG = AllreduceConfig(chunk_size=4096, min_timeout=0.05, max_timeout=1.0, initial_timeout=0.2,
                         round_deadline=3.0)
COMPUTE = 0.1
ROLES = {"root": 0, "inner": 1, "leaf": 6}


def run(faults: tuple[FaultSpec, ...], rounds: int = 45, will_delay: float = 30.0,
        nodes: int = 7) -> list[RoundRecord]:
    fleet = VirtualFleet(FleetConfig(nodes=nodes, rounds=rounds, length=20_000, allreduce=CONFIG,
                                     faults=faults, will_delay=will_delay, compute_time=COMPUTE,
                                     keep_gradients=True, latency=0.0005, max_time=600.0))
    return records_of(fleet)


def records_of(fleet: VirtualFleet) -> list[RoundRecord]:
    """The fleet's records; the fleet itself is let go at once (a test runs two or more)."""
    records = fleet.run()
    fleet.release()
    return records


def survivors_time(rec: RoundRecord, silent: int) -> float:
    return max(res.finished_at - rec.starts[n] for n, res in rec.results.items() if n != silent)


# The agent's own defaults (agent/config.py through agent/core_config.py), the real model's
# length and 1 MB units: what a user runs, not a tuned harness. Links measured fast (loopback
# here) must not wait half a second per MB queued before calling a frozen peer silent, and a
# unit a sibling relays to a parent the fleet found silent moves on at once (issue 12).
AGENT_CONFIG = allreduce_config(AgentConfig(id=0))
REAL_LENGTH = 407_050


def agent_defaults_run(faults: tuple[FaultSpec, ...], rounds: int, reconnect_delay: float = 0.02,
                       compute_jitter: float = 0.0, nodes: int = 7) -> list[RoundRecord]:
    return records_of(VirtualFleet(FleetConfig(
        nodes=nodes, rounds=rounds, length=REAL_LENGTH, allreduce=AGENT_CONFIG, faults=faults,
        will_delay=15.0, offline_settle=1.0, compute_time=0.03, compute_jitter=compute_jitter,
        latency=0.0005, broker_bandwidth=300e6, max_time=600.0, reconnect_delay=reconnect_delay)))


def fault_free_median(jitter: float = 0.0, nodes: int = 7) -> float:
    """The median survivors' round time of the same fleet without faults (from round 3 on).
    The in-memory fleet is deterministic (seeded), so one run serves every test of a worker."""
    records = agent_defaults_run((), 12, compute_jitter=jitter, nodes=nodes)
    return statistics.median(survivors_time(r, -1) for r in records[3:])


def silent_from(records: list[RoundRecord], node: int, first: int) -> int:
    """The round a frozen ``node`` goes silent in: the first from ``first`` on that it ended
    no more (it froze before its result came)."""
    return next(r.round for r in records[first:] if node not in r.results)


def forwarded_to(rec: RoundRecord, node: int) -> set[int]:
    """Members that relayed (or forwarded a flood of) something to ``node`` in that round."""
    return {n for n, notes in rec.notes.items() for x in notes if x.kind == "relay" and x.detail == f"to {node}"}
