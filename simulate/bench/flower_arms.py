"""One arm of `edgegrove bench flower`: one Flower run or one Edgegrove fleet, with or without
a fault, measured the same way (round times, time and bytes to the target accuracy, peak
resident memory of each client's process tree).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import psutil

from simulate.bench.accuracy import curve, time_to
from simulate.bench.common import progress
from simulate.bench.fleetrun import FleetRun, FleetScenario, run_fleet
from simulate.bench.flower_deploy import FlowerDeployment, FlowerSettings
from simulate.fleet import AGENT_MODULE

LINK_LIMIT_BPS = 6e6
MB = 1e6


class Fault(StrEnum):
    NONE = "none"
    CLIENT_RESTART = "client-restart"  # a client's processes killed, restarted later
    SERVER_RESTART = "server-restart"  # the SuperLink / our coordinator killed, restarted later
    LINK_6MBPS = "link-6mbps"  # one client's link limited to 6 MB/s each way


@dataclass(frozen=True)
class ArmPlan:
    """What every arm shares (same nodes, model, data partition and target)."""

    nodes: int
    partition: str  # "iid" or "label"
    target: float
    batch: int
    seed: int
    flower_local_steps: int
    flower_lr: float
    flower_rounds: int
    flower_fault_rounds: int
    edgegrove_lr: float
    edgegrove_rounds: int
    edgegrove_fault_rounds: int
    eval_every: int
    flower_fault_round: int  # the Flower round in which the fault strikes
    edgegrove_fault_round: int  # the Edgegrove round in which the fault strikes
    restart_after_s: float  # Flower: seconds until the killed process is started again
    restart_after_rounds: int  # Edgegrove: rounds until the killed agent is started again
    budget_s: float
    stall_s: float  # a Flower run with no new round for this long is given up


class PeakRss:
    """A thread sampling, every ``every`` s, the resident memory (RSS) of each client's
    process tree; keeps every client's peak of the tree's sum."""

    def __init__(self, trees: Callable[[], dict[int, list[psutil.Process]]], every: float = 1.0) -> None:
        self.trees, self.every = trees, every
        self.peak_mb: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="peak-rss", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        # At once, then every ``every`` s: a short run (a smoke test's 2 rounds) is sampled too.
        while True:
            with contextlib.suppress(psutil.Error, OSError):
                self.sample()
            if self._stop.wait(self.every):
                return

    def sample(self) -> None:
        for client, procs in self.trees().items():
            total = 0
            for proc in procs:
                with contextlib.suppress(psutil.Error):
                    total += proc.memory_info().rss
            if total:
                self.peak_mb[client] = max(self.peak_mb.get(client, 0.0), total / MB)

    def figures(self) -> dict[str, Any]:
        values = sorted(self.peak_mb.values())
        return {"per_client_mb": {str(k): round(v, 1) for k, v in sorted(self.peak_mb.items())},
                "median_mb": round(statistics.median(values), 1) if values else None,
                "max_mb": round(max(values), 1) if values else None}


# How an agent process is started: by hand, or by the fleet launcher (with its fault injector).
AGENT_MODULES = frozenset({"agent.commands.agent", AGENT_MODULE})


def agent_trees() -> dict[int, list[psutil.Process]]:
    """Our descendants that are Edgegrove agents, by node id (an agent has no children)."""
    out: dict[int, list[psutil.Process]] = {}
    for proc in psutil.Process(os.getpid()).children(recursive=True):
        with contextlib.suppress(psutil.Error, ValueError, IndexError):
            cmd = proc.cmdline()
            if AGENT_MODULES & set(cmd):
                out[int(cmd[cmd.index("--id") + 1])] = [proc]
    return out


# -- Flower -------------------------------------------------------------------------------------


@dataclass
class FlowerWatch:
    """The ServerApp's round log as it grows, and the proxies' byte counters over time."""

    path: Path
    records: list[dict[str, Any]] = field(default_factory=list)
    bytes_at: list[tuple[float, int]] = field(default_factory=list)
    _offset: int = 0

    def poll(self, deployment: FlowerDeployment) -> None:
        self.bytes_at.append((time.time(), deployment.proxy_bytes()))
        if not self.path.is_file():
            return
        with self.path.open() as f:
            f.seek(self._offset)
            text = f.read()
        done = text.rfind("\n") + 1
        self._offset += done
        for line in text[:done].splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                self.records.append(json.loads(line))

    def rounds(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("event") == "round"]

    def started(self, rnd: int) -> bool:
        return any(r.get("event") == "round-start" and r.get("round") == rnd for r in self.records)

    def ended(self) -> bool:
        return any(r.get("event") == "end" for r in self.records)

    def bytes_by(self, t: float) -> int | None:
        """Bytes through the proxies at time ``t`` (the first sample at or after it)."""
        return next((b for when, b in self.bytes_at if when >= t), None)


def flower_run_config(plan: ArmPlan, fault: Fault, log: Path, settings: FlowerSettings) -> dict[str, Any]:
    clean = fault is Fault.NONE
    return {"nodes": plan.nodes, "max-rounds": plan.flower_rounds if clean else plan.flower_fault_rounds,
            "local-steps": plan.flower_local_steps, "batch": plan.batch, "lr": plan.flower_lr,
            "seed": plan.seed, "target": plan.target, "stop-at-target": clean,
            "round-timeout": 600.0, "poll-s": settings.server_poll_s,
            "non-iid": plan.partition == "label", "log-path": str(log)}


def run_flower(plan: ArmPlan, fault: Fault, work: Path, bin_dir: Path,
               settings: FlowerSettings) -> dict[str, Any]:
    deployment = FlowerDeployment(work, plan.nodes, bin_dir, settings)
    watch = FlowerWatch(work / "rounds.jsonl")
    rss = PeakRss(deployment.client_trees)
    outcome: dict[str, Any] = {}
    started = time.monotonic()
    try:
        deployment.start()
        if fault is Fault.LINK_6MBPS:
            deployment.proxies[plan.nodes - 1].set_bandwidth(LINK_LIMIT_BPS)
        rss.start()
        deployment.submit(flower_run_config(plan, fault, watch.path, settings))
        outcome = _follow_flower(plan, fault, deployment, watch)
    except RuntimeError as exc:
        outcome["error"] = str(exc)
    finally:
        rss.stop()
        deployment.stop()
    result = flower_figures(plan, fault, watch)
    result.update(outcome, memory=rss.figures(), wall_s=round(time.monotonic() - started, 1))
    return result


def _follow_flower(plan: ArmPlan, fault: Fault, deployment: FlowerDeployment,
                   watch: FlowerWatch) -> dict[str, Any]:
    """Wait for the run's end (or its budget), striking the fault when its round starts."""
    deadline = time.monotonic() + plan.budget_s
    struck_at: float | None = None
    restarted = False
    outcome: dict[str, Any] = {}
    seen, progressed = 0, time.monotonic()
    while time.monotonic() < deadline and not watch.ended():
        watch.poll(deployment)
        if len(watch.records) > seen:
            seen, progressed = len(watch.records), time.monotonic()
        elif struck_at is not None and time.monotonic() - progressed > _stall_s(plan, watch):
            outcome["gave_up"] = f"nothing new for {_stall_s(plan, watch):.0f} s after the fault"
            progress(f"  flower: {outcome['gave_up']}: giving up")
            break
        if fault in (Fault.CLIENT_RESTART, Fault.SERVER_RESTART) and struck_at is None \
                and watch.started(plan.flower_fault_round):
            time.sleep(1.0)  # the round's messages are out: the fault strikes mid-round
            struck_at = time.monotonic()
            outcome["fault_at_round"] = plan.flower_fault_round
            _strike(fault, plan, deployment)
        if struck_at is not None and not restarted and time.monotonic() - struck_at >= plan.restart_after_s:
            restarted = True
            outcome["restarted_after_s"] = round(time.monotonic() - struck_at, 1)
            _restart(fault, plan, deployment)
        time.sleep(0.25)
    watch.poll(deployment)
    outcome["finished"] = watch.ended()
    if not watch.ended():
        outcome.setdefault("gave_up", f"the run's budget of {plan.budget_s:.0f} s was over")
        last = max((r["round"] for r in watch.rounds()), default=0)
        outcome["stalled_after_round"] = last
        progress(f"  flower: the run did not end (last round {last})")
    return outcome


def _stall_s(plan: ArmPlan, watch: FlowerWatch) -> float:
    """How long a run that a fault struck may show nothing new before it is given up: the
    --stall seconds, or three of its rounds before the fault if that is longer (a loaded host
    slows every round; only a run that stopped should be given up)."""
    times = [r["t_end"] - r["t_start"] for r in watch.rounds()]
    return max(plan.stall_s, 3 * statistics.median(times)) if times else plan.stall_s


def _strike(fault: Fault, plan: ArmPlan, deployment: FlowerDeployment) -> None:
    if fault is Fault.CLIENT_RESTART:
        progress(f"  flower: killing SuperNode {plan.nodes - 1} and its processes")
        deployment.kill_tree(deployment.supernodes[plan.nodes - 1])
    else:
        progress("  flower: killing the SuperLink")
        deployment.kill_superlink_only()


def _restart(fault: Fault, plan: ArmPlan, deployment: FlowerDeployment) -> None:
    if fault is Fault.CLIENT_RESTART:
        progress(f"  flower: restarting SuperNode {plan.nodes - 1}")
        deployment.start_supernode(plan.nodes - 1)
    else:
        progress("  flower: restarting the SuperLink (same port, same database)")
        deployment.start_superlink()


def flower_figures(plan: ArmPlan, fault: Fault, watch: FlowerWatch) -> dict[str, Any]:
    rounds = watch.rounds()
    t0 = rounds[0]["t_sent"] if rounds else None
    points = [{"round": r["round"], "accuracy": r["accuracy"], "seconds": round(r["t_end"] - t0, 2)}
              for r in rounds] if t0 is not None else []
    reached = time_to(points, plan.target)
    bytes_to = None
    if reached is not None:
        end = next(r["t_end"] for r in rounds if r["round"] == reached["round"])
        at_end, at_start = watch.bytes_by(end), watch.bytes_by(rounds[0]["t_start"])
        if at_end is not None and at_start is not None:
            bytes_to = at_end - at_start
    times = [r["t_end"] - r["t_sent"] for r in rounds]
    local = [max((a or 0) + (b or 0) for a, b in zip(r["train_s"], r["load_s"], strict=True))
             for r in rounds if r["train_s"]]
    return {
        "rounds": len(rounds), "curve": points, "time_to_target": reached,
        "bytes_to_target_mb": None if bytes_to is None else round(bytes_to / MB, 1),
        "round_s": _spread(times[1:] or times),
        "round_s_outside_client_work": _spread([t - w for t, w in zip(times[1:] or times, local[1:] or local,
                                                                      strict=False)]),
        "rounds_missing_updates": [r["round"] for r in rounds if r["replied"] < plan.nodes],
        "replies": {str(r["round"]): r["replied"] for r in rounds},
        "bytes_mb": _flower_bytes_mb(rounds, watch),
        "all_back_at_round": _all_back(plan, fault, rounds),
        "final_accuracy": points[-1]["accuracy"] if points else None,
    }


def _flower_bytes_mb(rounds: list[dict[str, Any]], watch: FlowerWatch) -> float | None:
    """Bytes through the proxies from the first round's start to the last round's end."""
    if not rounds:
        return None
    end, start = watch.bytes_by(rounds[-1]["t_end"]), watch.bytes_by(rounds[0]["t_start"])
    return None if end is None or start is None else round((end - start) / MB, 1)


def _all_back(plan: ArmPlan, fault: Fault, rounds: list[dict[str, Any]]) -> int | None:
    """The first round after the fault's with every client's update (None: never, or no
    restart fault)."""
    if fault not in (Fault.CLIENT_RESTART, Fault.SERVER_RESTART):
        return None
    return next((r["round"] for r in rounds if r["round"] > plan.flower_fault_round
                 and r["replied"] == plan.nodes), None)


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3)}


# -- Edgegrove ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FaultScenario(FleetScenario):
    """A fleet scenario with extra ``[[faults]]`` tables (a crash, one limited link)."""

    extra: str = ""

    def toml(self) -> str:
        return super().toml() + self.extra


def edgegrove_scenario(plan: ArmPlan, fault: Fault) -> FaultScenario:
    clean = fault is Fault.NONE
    rounds = plan.edgegrove_rounds if clean else plan.edgegrove_fault_rounds
    agent = {"algorithm": "ft-tree", "lr": plan.edgegrove_lr, "lr_schedule": "linear",
             "lr_final": 0.1, "batch": plan.batch, "optimizer": "adam", "seed": plan.seed,
             "eval_every": plan.eval_every, "eval_samples": 10000, "timeout_mode": "adaptive",
             "non_iid": plan.partition == "label"}
    at, back = plan.edgegrove_fault_round, plan.edgegrove_fault_round + plan.restart_after_rounds
    extra = ""
    if fault in (Fault.CLIENT_RESTART, Fault.SERVER_RESTART):
        node = plan.nodes - 1 if fault is Fault.CLIENT_RESTART else 0
        extra = (f'\n[[faults]]\nkind = "crash"\nnode = {node}\nat_round = {at}\n'
                 f'phase = "mid"\nrestart_round = {back}\n')
    elif fault is Fault.LINK_6MBPS:
        extra = (f'\n[[faults]]\nkind = "bandwidth"\nnode = {plan.nodes - 1}\n'
                 f'bytes_per_second = {LINK_LIMIT_BPS:.0f}\nat_round = 0\nvia = "proxy"\n')
    return FaultScenario(f"flower-{fault.value}", plan.nodes, rounds, agent, extra=extra)


def run_edgegrove(plan: ArmPlan, fault: Fault, work: Path) -> dict[str, Any]:
    rss = PeakRss(agent_trees)
    rss.start()
    try:
        fleet = run_fleet(edgegrove_scenario(plan, fault), work / "fleet", plan.budget_s)
    finally:
        rss.stop()
    result = edgegrove_figures(plan, fault, fleet)
    result.update(memory=rss.figures(), wall_s=round(fleet.wall_seconds, 1),
                  finished=fleet.finished and fleet.error is None, error=fleet.error)
    if fault in (Fault.CLIENT_RESTART, Fault.SERVER_RESTART):
        result.update(fault_at_round=plan.edgegrove_fault_round,
                      restarted_after_rounds=plan.restart_after_rounds)
    return result


def edgegrove_figures(plan: ArmPlan, fault: Fault, fleet: FleetRun) -> dict[str, Any]:
    rows = fleet.rows
    points = curve(fleet)
    reached = time_to(points, plan.target)
    bytes_to = None
    if reached is not None:
        bytes_to = sum(int(r.get("bytes_sent") or 0) + int(r.get("bytes_received") or 0)
                       for r in rows if int(r["round"]) <= reached["round"])
    times = [float(r["round_s_max"]) for r in rows if r.get("round_s_max") is not None]
    missing = [int(r["round"]) for r in rows
               if (r.get("degraded_nodes") or 0) > 0 or (r.get("reporters") or 0) < plan.nodes]
    back_from = plan.edgegrove_fault_round + plan.restart_after_rounds
    back = next((int(r["round"]) for r in rows if int(r["round"]) >= back_from
                 and (r.get("members") or 0) == plan.nodes and (r.get("reporters") or 0) == plan.nodes
                 and not (r.get("degraded_nodes") or 0)), None)
    total = sum(int(r.get("bytes_sent") or 0) + int(r.get("bytes_received") or 0) for r in rows)
    return {
        "rounds": len(rows), "curve": points, "time_to_target": reached,
        "bytes_to_target_mb": None if bytes_to is None else round(bytes_to / MB, 1),
        "bytes_mb": round(total / MB, 1),
        "round_s": _spread(times[2:] or times),
        "rounds_missing_updates": missing,
        "all_back_at_round": back if fault in (Fault.CLIENT_RESTART, Fault.SERVER_RESTART) else None,
        "final_accuracy": points[-1]["accuracy"] if points else None,
    }
