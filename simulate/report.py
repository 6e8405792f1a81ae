"""The run directory's report, computed from the event log alone.

``analyze(records)`` is pure: it turns the event log (status, view, telemetry, fault and
process records) into per-round rows, per-fault detection verdicts and the summary, so the
report's numbers can always be recomputed from ``events.jsonl`` (a test does exactly that).
``write_report`` then writes rounds.csv, summary.json, report.md and the PNG plots.

A fault counts as *detected* when the fleet's own signals show it — never from what the
simulator knows it did:
  link      an end of the link reports a link_dead/reroute/timeout event naming the other
            end, or sees that link failed/rerouted/suspected
  crash     the broker publishes the killed process's ``offline`` status (its Last Will: the
            same pid) between the kill and the restart; a clean exit later is no evidence
  hang      said how: the fleet's witnesses suspect the node (an agent's ``suspected`` event),
            a view leaves it out, or the broker's Will takes it offline; else another agent
            reports a timeout/link_dead/reroute/pull naming the node, or sees its link to the
            node failed/rerouted/suspected, or a round degrades
  isolate   as a crash or a hang (offline status, or peers reporting it silent)
  flap      the broker publishes the node's Will at the drops (counted)
  loss      the node or a peer reports NACKs, retransmits, missing chunks, timeouts, reroutes or a degraded
            round while the loss is on
  latency / bandwidth  timeouts/reroutes/events naming the node, or the median allreduce time
            of the fault's rounds at least 1.5x the median before it
  broker-restart  the agents reconnected: telemetry from them after the broker is back (a
            retained status may be replayed by a persistent broker, telemetry never is); the
            evidence says how many, and when the fleet had one view and one model again
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agent.protocol.notes import LINK_EVIDENCE, NoteKind
from agent.runtime import REFUSED_EXIT
from simulate.report_rows import FaultOutcome, RoundRow

Record = dict[str, Any]
LINK_EVENT_KINDS = LINK_EVIDENCE
BAD_LINK_STATES = frozenset({"failed", "rerouted", "suspected"})
ROUND_COLUMNS = (
    "round", "reporters", "members", "loss", "accuracy", "allreduce_s_max", "allreduce_s_median",
    "round_s_max", "bytes_sent", "bytes_received", "reroutes", "timeouts", "nacks",
    "missing_chunks", "degraded_nodes", "distinct_hashes", "faults_active", "wire_frames",
    "after_last_gradient_s", "local_steps", "samples", "compute_s_median", "bytes_per_sample", "dp_epsilon",
)


def _median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def _mean(values: Sequence[float]) -> float | None:
    return float(statistics.fmean(values)) if values else None


def rounds_table(records: Iterable[Record], faults: Sequence[FaultOutcome] = ()) -> list[RoundRow]:
    """One row per round from the telemetry records (every agent's report of that round)."""
    by_round: dict[int, dict[int, Record]] = defaultdict(dict)
    for rec in records:
        if rec.get("type") == "telemetry":
            # An agent's second report of a round (it ran the round again) replaces its first:
            # the row counts reporters, not reports.
            by_round[int(rec["round"])][int(rec["node"])] = rec
    rows = []
    for rnd in sorted(by_round):
        tels = list(by_round[rnd].values())
        allreduce = [float(t.get("phase_seconds", {}).get("allreduce", 0.0)) for t in tels]
        totals = [float(t.get("phase_seconds", {}).get("total", 0.0)) for t in tels]
        losses = [float(t["loss"]) for t in tels if t.get("loss") is not None]
        accs = [float(t["accuracy"]) for t in tels if t.get("accuracy") is not None]
        active = [str(f.index) for f in faults if _active_at(f, rnd)]
        rows.append(RoundRow(
            round=rnd, reporters=len(tels), members=max(int(t.get("members", 0)) for t in tels),
            loss=_mean(losses), accuracy=_mean(accs),
            allreduce_s_max=max(allreduce), allreduce_s_median=_median(allreduce) or 0.0,
            round_s_max=max(totals),
            bytes_sent=sum(int(t.get("bytes_sent", 0)) for t in tels),
            bytes_received=sum(int(t.get("bytes_received", 0)) for t in tels),
            reroutes=sum(int(t.get("reroutes", 0)) for t in tels),
            timeouts=sum(int(t.get("timeouts", 0)) for t in tels),
            nacks=sum(int(t.get("nacks", 0)) for t in tels),
            missing_chunks=sum(int(t.get("missing_chunks", 0)) for t in tels),
            degraded_nodes=sum(1 for t in tels if t.get("degraded")),
            distinct_hashes=len({t.get("model_hash", "") for t in tels}),
            faults_active=" ".join(active),
            wire_frames=wire_frames_text(tels),
            after_last_gradient_s=after_last_gradient(
                [(float(t.get("reduced_at", 0.0)), float(t.get("phase_seconds", {}).get("allreduce", 0.0)))
                 for t in tels]),
            **_training_figures(tels),
        ))
    return rows


def _training_figures(tels: Sequence[Record]) -> dict[str, Any]:
    """A round's local steps, samples trained, compute time and bytes per sample."""
    samples = sum(int(t.get("samples", 0)) for t in tels)
    sent = sum(int(t.get("bytes_sent", 0)) for t in tels)
    return {
        "local_steps": max(int(t.get("local_steps", 1)) for t in tels),
        "samples": samples,
        "compute_s_median": _median([float(t.get("phase_seconds", {}).get("compute", 0.0)) for t in tels]) or 0.0,
        "bytes_per_sample": round(sent / samples, 3) if samples else None,
        # Differential privacy: the most any reporter's data has spent (agent/privacy).
        "dp_epsilon": max((float(t["dp_epsilon"]) for t in tels if t.get("dp_epsilon") is not None), default=None),
    }


def sync_figures(rows: Sequence[RoundRow]) -> dict[str, Any]:
    """Local steps per sync, sync (allreduce) time against compute time, bytes per sample."""
    samples = sum(r.samples for r in rows)
    sync = _median([r.allreduce_s_median for r in rows])
    compute = _median([r.compute_s_median for r in rows])
    return {
        "local_steps_per_sync": max((r.local_steps for r in rows), default=1),
        "samples_trained": samples,
        "sync_s_median": sync,
        "compute_s_median": compute,
        "sync_share": (sync / (sync + compute)) if sync is not None and compute is not None and sync + compute > 0
        else None,
        "bytes_per_sample": (sum(r.bytes_sent for r in rows) / samples) if samples else None,
        "dp_epsilon": max((r.dp_epsilon for r in rows if r.dp_epsilon is not None), default=None),
    }


def after_last_gradient(ends: Sequence[tuple[float, float]]) -> float | None:
    """One round's collective time as a barrier-then-allreduce bench (gloo) measures it: from
    the moment the fleet's last agent had its gradient to the moment its last agent had the
    result, from every agent's (wall-clock end of its allreduce, its allreduce seconds).

    An agent's own allreduce phase also holds the wait for the others' gradients (on a shared
    host, their compute); this figure does not. Only agents of one host share a wall clock, so
    only benches on one host use it. None when an agent did not say (reduced_at 0) or said
    something that is not a time."""
    if not ends or any(not (math.isfinite(end) and end > 0 and math.isfinite(s) and s >= 0) for end, s in ends):
        return None
    last_gradient = max(end - s for end, s in ends)
    return round(max(0.0, max(end for end, _ in ends) - last_gradient), 6)


def wire_frames_text(tels: Sequence[Record]) -> str:
    """The agents' frames of values by wire format, summed: "float32:4 int8:20" (formats in
    the order the agents name them first; "" when none says)."""
    total: dict[str, int] = {}
    for t in tels:
        frames = t.get("wire_frames")
        for name, count in (frames.items() if isinstance(frames, dict) else ()):
            total[str(name)] = total.get(str(name), 0) + int(count)
    return " ".join(f"{name}:{count}" for name, count in total.items() if count)


def parse_wire_frames(text: object) -> dict[str, int]:
    """``wire_frames_text`` back to counts (a rounds.csv cell; bad parts are skipped)."""
    out: dict[str, int] = {}
    for part in str(text or "").split():
        name, _, count = part.partition(":")
        if count.isdigit():
            out[name] = out.get(name, 0) + int(count)
    return out


def _active_at(fault: FaultOutcome, rnd: int) -> bool:
    if fault.status != "injected" or fault.at_round is None:
        return False
    return fault.at_round <= rnd and (fault.end_round is None or rnd < fault.end_round)


def fault_outcomes(records: Sequence[Record]) -> list[FaultOutcome]:
    """The faults as the event log tells them: injected when, undone when, detected or not."""
    outcomes: dict[int, FaultOutcome] = {}
    for rec in records:
        if rec.get("type") != "fault":
            continue
        idx = int(rec["index"])
        action = rec["action"]
        if action in ("inject", "skip", "plan"):
            outcome = outcomes.get(idx) or FaultOutcome(
                index=idx, kind=rec["kind"], description=rec.get("description", ""),
                mechanism=rec.get("mechanism", ""), status="not_reached",
                targets=list(rec.get("targets", [])))
            if action == "inject":
                outcome.status, outcome.at_round, outcome.injected_t = "injected", rec.get("round"), rec["t"]
                outcome.mechanism = rec.get("mechanism", outcome.mechanism)
            elif action == "skip":
                outcome.status, outcome.evidence = "skipped", rec.get("detail", "")
            outcomes[idx] = outcome
        elif action == "heal" and idx in outcomes:
            outcomes[idx].end_round = rec.get("round")
    result = [outcomes[i] for i in sorted(outcomes)]
    for outcome in result:
        if outcome.status == "injected":
            outcome.detected, outcome.evidence = detect(outcome, records)
    return result


def _in_window(fault: FaultOutcome, rec: Record, slack: int = 2) -> bool:
    """A telemetry record of a round the fault could have touched."""
    start = (fault.at_round or 0) - 1
    end = fault.end_round + slack if fault.end_round is not None else 1 << 30
    return start <= int(rec["round"]) <= end


def _names_peer(rec: Record, peer: int) -> str:
    """Why this telemetry shows trouble with ``peer`` ('' if it does not)."""
    for event in rec.get("events", []) or []:
        if event.get("kind") in LINK_EVENT_KINDS and event.get("peer") == peer:
            return f"{event['kind']} {rec['node']}->{peer}"
    state = (rec.get("links") or {}).get(str(peer))
    if state in BAD_LINK_STATES:
        return f"node {rec['node']} sees link to {peer} {state}"
    return ""


def detect(fault: FaultOutcome, records: Sequence[Record]) -> tuple[bool, str]:
    """(detected, evidence) for one injected fault, from the fleet's own reports."""
    t0 = fault.injected_t or 0.0
    tels = [r for r in records if r.get("type") == "telemetry" and _in_window(fault, r)]
    statuses = [r for r in records if r.get("type") == "status" and r["t"] >= t0]
    targets = fault.targets
    if fault.kind == "link" and len(targets) == 2:
        a, b = targets
        for rec in tels:
            why = _names_peer(rec, b) if rec["node"] == a else _names_peer(rec, a) if rec["node"] == b else ""
            if why:
                return True, f"round {rec['round']}: {why}"
        return False, "no end of the link reported it"
    if fault.kind == "broker-restart":
        return _broker_restart(fault, records)
    node = targets[0] if targets else -1
    if fault.kind == "crash":
        return _will_of_the_killed(fault, node, records)
    if fault.kind == "isolate":
        for rec in statuses:
            if rec["node"] == node and rec["state"] == "offline":
                return True, f"status/{node} offline at t={rec['t']:.2f}s"
    if fault.kind == "hang" and (how := _how_the_fleet_saw_a_hang(node, t0, records)):
        return True, how
    if fault.kind == "flap":
        drops = [r for r in statuses if r["node"] == node and r["state"] == "offline"]
        if drops:
            return True, f"{len(drops)} Last Wills of node {node}, the first at t={drops[0]['t']:.2f}s"
    if fault.kind in ("hang", "isolate", "latency", "bandwidth"):
        for rec in tels:
            if rec["node"] != node and (why := _names_peer(rec, node)):
                return True, f"round {rec['round']}: {why}"
        degraded = [r for r in tels if r.get("degraded")]
        if fault.kind in ("hang", "isolate") and degraded:
            return True, f"round {degraded[0]['round']}: degraded"
    if fault.kind == "loss":
        for rec in tels:
            signs = {k: rec.get(k, 0) for k in ("nacks", "retransmits", "missing_chunks", "timeouts", "reroutes")
                     if rec.get(k)}
            if rec.get("degraded"):
                signs["degraded"] = 1
            if signs:
                return True, f"round {rec['round']} node {rec['node']}: {signs}"
    if fault.kind in ("latency", "bandwidth"):
        return _slowdown(fault, records)
    return False, "no sign of it in telemetry or status"


@dataclass(frozen=True)
class Recovery:
    """How the fleet came back after a broker restart (from the event log alone)."""

    back_t: float  # when the broker was started again
    reconnected: tuple[int, ...]  # nodes that published a status or telemetry after that
    reporting: tuple[int, ...]  # nodes with telemetry after that
    first_round: int | None  # first round reported after the restart that nobody ended before it
    settled_round: int | None  # first round since with all nodes, one hash, one view
    views: tuple[tuple[int, int], ...]  # (epoch, coordinator) of views published after it


def broker_recovery(records: Sequence[Record], t0: float) -> Recovery | None:
    """None when the broker did not come back after ``t0``."""
    back = next((r for r in records if r.get("type") == "broker" and r.get("event") == "started"
                 and r["t"] >= t0), None)
    if back is None:
        return None
    tb = float(back["t"])
    after = [r for r in records if r.get("type") == "telemetry" and r["t"] >= tb]
    if "wall" in back:
        # Reports an agent queued while the broker was away arrive after it: rounds that
        # somebody ended before the broker was back (the outage's own) are not after it.
        ended_before = [int(r["round"]) for r in records if r.get("type") == "telemetry"
                        and float(r.get("wall_time", 0.0)) < float(back["wall"])]
        after = [r for r in after if int(r["round"]) > max(ended_before, default=-1)]
    reporting = {int(r["node"]) for r in after}
    # A status the agent published after the restart (its birth); Wills say "offline".
    born = {int(r["node"]) for r in records if r.get("type") == "status" and r["t"] >= tb
            and r.get("state") != "offline"}
    first = min((int(r["round"]) for r in after), default=None)
    views = tuple(dict.fromkeys((int(r.get("epoch", -1)), int(r.get("coordinator", -1)))
                                for r in records if r.get("type") == "view" and r["t"] >= tb))
    fleet = len({int(r["node"]) for r in records if r.get("type") == "telemetry"})
    return Recovery(tb, tuple(sorted(reporting | born)), tuple(sorted(reporting)), first,
                    _settled_round(after, fleet), views)


def _settled_round(after: Sequence[Record], nodes: int) -> int | None:
    """The first round (of those reported after the restart) whose every report came from
    all ``nodes`` with one model hash, one view epoch and every node a member."""
    for row in rounds_table(after):
        tels = [r for r in after if int(r["round"]) == row.round]
        one_view = len({r.get("epoch") for r in tels}) == 1
        everyone = all(int(r.get("members", 0)) >= nodes for r in tels)
        if row.reporters >= nodes and row.distinct_hashes == 1 and one_view and everyone:
            return row.round
    return None


def _broker_restart(fault: FaultOutcome, records: Sequence[Record]) -> tuple[bool, str]:
    rec = broker_recovery(records, fault.injected_t or 0.0)
    if rec is None:
        return False, "the broker did not come back (no start after the stop)"
    if not rec.reconnected:
        return False, f"broker back at t={rec.back_t:.2f}s, but no agent reconnected"
    views = ", ".join(f"epoch {e} coord {c}" for e, c in rec.views) or "none"
    return True, (f"broker back at t={rec.back_t:.2f}s; agents {list(rec.reconnected)} "
                  f"reconnected; {_training_after(rec)}; views since: {views}")


def _training_after(rec: Recovery) -> str:
    if not rec.reporting:
        return "no agent reported a round after it (the fleet stopped training)"
    text = f"agents {list(rec.reporting)} reported rounds after it (from round {rec.first_round})"
    if rec.settled_round is None:
        return text + "; the fleet never again had one model and one view"
    return (text + f"; one model and one view again from round {rec.settled_round} "
            f"({rec.settled_round - (rec.first_round or 0)} rounds after)")


def _process_window(node: int, t: float, records: Sequence[Record]) -> tuple[int | None, float, float]:
    """(pid, spawned at, next spawn at) of the node's process running at time ``t``."""
    spawns = [r for r in records if r.get("type") == "process" and r.get("event") == "spawn"
              and r.get("node") == node]
    before = [r for r in spawns if r["t"] <= t]
    if not before:
        return None, 0.0, float("inf")
    current = before[-1]
    later = [r["t"] for r in spawns if r["t"] > t]
    return current.get("pid"), current["t"], (later[0] if later else float("inf"))


def _will_of_the_killed(fault: FaultOutcome, node: int, records: Sequence[Record]) -> tuple[bool, str]:
    """A crash is detected by the broker's Last Will of the process we killed: an offline
    status with its pid, after it started and before the restart (the Will may come before
    the fault's record is written)."""
    pid, started, restarted = _process_window(node, fault.injected_t or 0.0, records)
    for rec in records:
        if (rec.get("type") == "status" and rec.get("node") == node and rec.get("state") == "offline"
                and started <= rec["t"] < restarted and (pid is None or rec.get("pid") == pid)):
            return True, f"Last Will: status/{node} offline (pid {rec.get('pid')}) at t={rec['t']:.2f}s"
    return False, f"no Last Will of node {node}'s killed process (pid {pid}) before its restart"


def _how_the_fleet_saw_a_hang(node: int, t0: float, records: Sequence[Record]) -> str:
    """The first of: the fleet's witnesses suspected it, a view left it out, a Will."""
    for rec in records:
        if rec.get("type") == "telemetry" and rec["t"] >= t0 and rec.get("node") != node:
            for event in rec.get("events", []) or []:
                if event.get("kind") == NoteKind.SUSPECTED and event.get("peer") == node:
                    return f"suspicion: node {rec['node']} round {rec['round']} (silent by the fleet's witnesses)"
    for rec in records:
        if rec.get("type") == "view" and rec["t"] >= t0 and node not in rec.get("members", [node]):
            return f"view change: epoch {rec.get('epoch')} without node {node} from round {rec.get('from_round')}"
    for rec in records:
        if (rec.get("type") == "status" and rec["t"] >= t0 and rec.get("node") == node
                and rec.get("state") == "offline"):
            return f"Last Will: status/{node} offline at t={rec['t']:.2f}s"
    return ""


def _slowdown(fault: FaultOutcome, records: Sequence[Record]) -> tuple[bool, str]:
    rows = rounds_table(records)
    start = fault.at_round or 0
    before = [r.allreduce_s_max for r in rows if r.round < start]
    during = [r.allreduce_s_max for r in rows if _active_at(fault, r.round)]
    b, d = _median(before), _median(during)
    if b is not None and d is not None and d >= 1.5 * b:
        return True, f"median allreduce {d:.3f}s during vs {b:.3f}s before"
    return False, f"allreduce median {d} s during vs {b} s before: no clear slowdown"


def label_histograms(records: Iterable[Record]) -> dict[int, list[int]]:
    """Each agent's training samples per label, as its latest status that says them."""
    out: dict[int, list[int]] = {}
    for rec in records:
        if rec.get("type") == "status" and rec.get("labels"):
            out[int(rec["node"])] = [int(n) for n in rec["labels"]]
    return dict(sorted(out.items()))


def fleet_model(records: Iterable[Record]) -> dict[str, Any] | None:
    """The model the fleet trained, as its newest view names it (None: no view said)."""
    named = [r for r in records if r.get("type") == "view" and r.get("fingerprint")]
    if not named:
        return None
    last = max(named, key=lambda r: int(r.get("epoch", 0)))
    return {"fingerprint": last["fingerprint"], "name": last.get("model", ""), "params": last.get("params", 0)}


def refused_members(records: Iterable[Record]) -> list[int]:
    """Agents that stopped because the fleet refused their model (their exit code says so)."""
    return sorted({int(r["node"]) for r in records if r.get("type") == "process"
                   and r.get("event") == "exit" and r.get("code") == REFUSED_EXIT})


def summarize(records: Sequence[Record], config: dict[str, Any] | None = None,
              baseline: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run's summary: every number here is recomputable from ``records``."""
    faults = fault_outcomes(records)
    rows = rounds_table(records, faults)
    runs = [r for r in records if r.get("type") == "run"]
    wall = next((r.get("wall_time_s") for r in reversed(runs) if r.get("phase") == "end"), None)
    accs = [r for r in rows if r.accuracy is not None]
    final = accs[-1] if accs else None
    last = rows[-1] if rows else None
    allreduce = [r.allreduce_s_max for r in rows]
    fault_free = [r.allreduce_s_max for r in rows if not r.faults_active]
    in_faults = [r.allreduce_s_max for r in rows if r.faults_active]
    injected = [f for f in faults if f.status == "injected"]
    end = next((r for r in reversed(runs) if r.get("phase") == "end"), {})
    return {
        "scenario": (config or {}).get("scenario", {}).get("name"),
        "nodes": (config or {}).get("scenario", {}).get("fleet", {}).get("nodes"),
        "rounds_planned": (config or {}).get("scenario", {}).get("fleet", {}).get("rounds"),
        "rounds": (last.round + 1) if last else 0,
        "final_test_accuracy": final.accuracy if final else None,
        "final_accuracy_round": final.round if final else None,
        "final_loss": last.loss if last else None,
        "faults_planned": len(faults),
        "faults_injected": len(injected),
        "faults_detected": sum(1 for f in injected if f.detected),
        "faults_skipped": sum(1 for f in faults if f.status == "skipped"),
        "degraded_rounds": sum(1 for r in rows if r.degraded_nodes),
        "reroutes": sum(r.reroutes for r in rows),
        "wall_time_s": wall,
        "round_time_median_s": _median(allreduce),
        "round_time_fault_free_median_s": _median(fault_free),
        "round_time_fault_window_median_s": _median(in_faults),
        "bytes_per_round_median": _median([float(r.bytes_sent) for r in rows]),
        "models_identical_at_end": bool(last and last.distinct_hashes == 1),
        **sync_figures(rows),
        "last_round_reporters": last.reporters if last else 0,  # identical among these
        "halted": bool(end.get("halted", False)),
        "interrupted": bool(end.get("interrupted", False)),
        "baseline_final_accuracy": (baseline or {}).get("final_accuracy"),
        "setup": (config or {}).get("model"),
        "model": fleet_model(records),
        "refused_members": refused_members(records),
        "label_histograms": {str(n): h for n, h in label_histograms(records).items()},
        "faults": [asdict(f) for f in faults],
    }


# -- files --------------------------------------------------------------------------------


def write_rounds_csv(rows: Sequence[RoundRow], path: Path) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(ROUND_COLUMNS))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if v is None else v) for k, v in asdict(row).items()})


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "n/a" if value is None else format(value, spec)


def render_markdown(summary: dict[str, Any], plots: Sequence[str]) -> str:
    s = summary
    lines = [
        f"# Edgegrove simulation: {s.get('scenario')}",
        "",
        f"- nodes: {s.get('nodes')}, rounds completed: {s['rounds']} of {s.get('rounds_planned')}",
        f"- final test accuracy: {_fmt(s['final_test_accuracy'], '.4f')} (round {s['final_accuracy_round']})"
        f"; single-machine baseline: {_fmt(s['baseline_final_accuracy'], '.4f')}",
        f"- faults: {s['faults_injected']} injected, {s['faults_detected']} detected, "
        f"{s['faults_skipped']} skipped; degraded rounds: {s['degraded_rounds']}; reroutes: {s['reroutes']}",
        f"- allreduce time per round (slowest agent), median: {_fmt(s['round_time_median_s'])} s; "
        f"fault-free rounds: {_fmt(s['round_time_fault_free_median_s'])} s; "
        f"rounds with a fault active: {_fmt(s['round_time_fault_window_median_s'])} s",
        f"- wall time: {_fmt(s['wall_time_s'], '.1f')} s; models identical at the end: "
        f"{s['models_identical_at_end']} (among the {s.get('last_round_reporters')} agents that "
        f"reported the last round); halted: {s['halted']}; interrupted: {s['interrupted']}",
        f"- local steps per sync: {s.get('local_steps_per_sync', 1)}; sync (allreduce) vs compute per round, "
        f"median: {_fmt(s.get('sync_s_median'))} s vs {_fmt(s.get('compute_s_median'))} s (sync share "
        f"{_fmt(s.get('sync_share'), '.0%')}); bytes sent per sample trained: {_fmt(s.get('bytes_per_sample'), '.0f')}",
        f"- differential privacy: epsilon spent {_fmt(s.get('dp_epsilon'), '.3g')} (the most of any device; "
        "n/a: no DP, or no accountant on the devices)",
        "",
        "## Faults",
        "",
        "| # | fault | mechanism | status | rounds | detected | evidence |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in s["faults"]:
        span = f"{f['at_round']}..{f['end_round'] if f['end_round'] is not None else 'end'}"
        lines.append(f"| {f['index']} | {f['description']} | {f['mechanism']} | {f['status']} | "
                     f"{span if f['status'] == 'injected' else ''} | "
                     f"{'yes' if f['detected'] else 'no'} | {f['evidence'].replace('|', '/')} |")
    lines += _model_lines(s)
    lines += ["", "## Plots", ""]
    lines += [f"![{p}]({p})" for p in plots]
    lines += ["", "Files: `config.json`, `events.jsonl` (every message and fault, one JSON per line), "
              "`rounds.csv`, `summary.json`, `agents/` (agent logs).", ""]
    return "\n".join(lines)


def _model_lines(s: dict[str, Any]) -> list[str]:
    """The model, who was refused, and every agent's labels (a table)."""
    model, setup = s.get("model"), s.get("setup") or {}
    lines = ["", "## Model and data", ""]
    if setup:
        lines.append(f"- setup: model {setup.get('model')}, backend {setup.get('backend')}, dataset "
                     f"{setup.get('dataset')}, partition {setup.get('partition')}")
    if model:
        lines.append(f"- the fleet's model: {model['name'] or '?'}, {model['params']:,} params, "
                     f"fingerprint {model['fingerprint']}")
    refused = s.get("refused_members") or []
    lines.append(f"- refused members (another model than the fleet's): {len(refused)}"
                 + (f" (nodes {', '.join(map(str, refused))})" if refused else ""))
    histograms: dict[str, list[int]] = s.get("label_histograms") or {}
    if histograms:
        classes = max(len(h) for h in histograms.values())
        lines += ["", "Training samples per label on each agent (its shard):", "",
                  "| node | samples | " + " | ".join(str(c) for c in range(classes)) + " |",
                  "|---|---|" + "---|" * classes]
        for node, h in histograms.items():
            cells = [str(h[c]) if c < len(h) else "0" for c in range(classes)]
            lines.append(f"| {node} | {sum(h)} | " + " | ".join(cells) + " |")
    return lines


def write_report(run_dir: Path, records: Sequence[Record], config: dict[str, Any],
                 baseline: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write rounds.csv, summary.json, the plots and report.md; return the summary."""
    from simulate import plots

    summary = summarize(records, config, baseline)
    faults = fault_outcomes(records)
    rows = rounds_table(records, faults)
    write_rounds_csv(rows, run_dir / "rounds.csv")
    written = plots.write_all(run_dir, rows, faults, baseline)
    histograms = label_histograms(records)
    if histograms:
        plots.plot_labels(histograms, run_dir / "labels.png")
        written.append("labels.png")
    summary["plots"] = written
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (run_dir / "report.md").write_text(render_markdown(summary, written))
    return summary


def model_section(devices: dict[str, Any], job: str) -> str:
    """report.md's part on a run through devices: each device's states and how to run the
    trained model that `job fetch` wrote into the run directory."""
    lines = ["", "## Devices and the trained model", "",
             f"The fleet ran as devices; the job file is `{devices.get('job_file')}` "
             f"(submitted as `edgegrove job submit`). Each device's config is "
             "`devices/<name>/device.toml`, its log `agents/agent-<node>.log`.", "",
             "| device | states |", "|---|---|"]
    for device, states in sorted((devices.get("devices") or {}).items()):
        lines.append(f"| {device} | {' → '.join(states)} |")
    model = devices.get("model")
    if not model:
        lines += ["", "No trained model was fetched (the job did not publish a result)."]
        return "\n".join(lines) + "\n"
    folder = model["dir"]
    acc = model.get("accuracy")
    lines += [
        "", f"The trained model of round {model.get('round')} (fleet accuracy "
        f"{'n/a' if acc is None else f'{acc:.4f}'}, hash {model.get('model_hash')}) is in "
        f"`{folder}`: {', '.join(model.get('files') or [])}.", "",
        "Score it again, or fetch it from the broker later:", "", "```",
        devices.get("evaluate") or f"edgegrove model evaluate {folder}/model.npz --data PATH",
        f"edgegrove job fetch {job} -o DIR", "```", "",
        "Run the `.tflite` for inference with ai-edge-litert alone (no TensorFlow):", "", "```python",
        "import numpy as np",
        "from ai_edge_litert.interpreter import Interpreter",
        f'interpreter = Interpreter(model_path="{folder}/model.tflite")',
        "infer = interpreter.get_signature_runner(\"infer\")",
        "x = np.zeros((1, *infer.get_input_details()[\"x\"][\"shape\"][1:]), np.float32)  # your inputs",
        "scores = next(iter(infer(x=x).values()))  # [batch, classes]",
        "print(scores.argmax(axis=1))",
        "```",
    ]
    return "\n".join(lines) + "\n"
