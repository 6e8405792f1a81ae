"""`edgegrove job logs JOB [--device D] [--follow]`: what the job's devices say.

The devices' state changes (their retained execution states), their warnings and errors (each
device's log topic, rate-limited by the device) and the job's telemetry events (reroutes,
timeouts, ...). Log lines are not retained: without --follow, what arrives within --wait
seconds is shown after the states; with --follow, until Ctrl-C or every device has ended.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from agent.jobs import topics
from agent.jobs.document import ExecStatus
from agent.operator.connection import (
    OperatorClient,
    OperatorError,
    add_broker_arguments,
    fleet_snapshot,
    login_from_args,
    one_line_errors,
)
from agent.operator.fleet import FleetView
from agent.protocol.topics import Topics
from agent.transport.base import Message
from agent.validate import arg

DESCRIPTION = __doc__


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", type=arg(topics.validate_job_name), help="the job's name")
    parser.add_argument("--device", type=arg(topics.validate_device), default=None, help="only this device")
    parser.add_argument("--follow", "-f", action="store_true", help="keep printing until Ctrl-C or the job ends")
    parser.add_argument("--wait", type=float, default=2.0, help="without --follow: seconds to listen")
    add_broker_arguments(parser)


@one_line_errors("edgegrove job logs")
def run(args: argparse.Namespace) -> int:
    try:
        view = fleet_snapshot(args, [topics.job_spec(args.job), topics.job_execs(args.job)])
        spec = view.jobs.get(args.job)
        if spec is None:
            raise OperatorError(f"no job {args.job} on this broker (see `edgegrove job list`)")
        known = sorted(set(spec.assignments) | set(view.execs.get(args.job, {})),
                       key=lambda d: (spec.assignments.get(d, len(spec.assignments)), d))
        devices = [args.device] if args.device else known
        nodes = {spec.assignments[d]: d for d in devices if d in spec.assignments}
        for status in sorted(view.execs.get(args.job, {}).values(), key=lambda s: s.updated_at):
            if status.device in devices:
                _print(args, exec_entry(status))
        filters = [topics.job_execs(args.job), *[topics.device_log(d) for d in devices],
                   Topics(args.job).all_telemetry()]
        if args.follow and _ended(view, args.job, devices):
            return 0  # nothing more will come
        with OperatorClient(login_from_args(args), filters) as client:
            until = time.monotonic() + (float("inf") if args.follow else args.wait)
            for message in client.messages(until):
                if message.retained:
                    continue  # the states above
                entry = entry_of(message, args.job, nodes)
                if entry is not None and entry.get("device") in devices:
                    _print(args, entry)
                view.take(message)
                if args.follow and _ended(view, args.job, devices):
                    break
    except KeyboardInterrupt:
        return 0
    return 0


def _ended(view: FleetView, job: str, devices: list[str]) -> bool:
    execs = view.execs.get(job, {})
    return all(d in execs and execs[d].state.terminal for d in devices)


def exec_entry(status: ExecStatus) -> dict[str, Any]:
    what = str(status.state)
    if status.round is not None:
        what += f" round {status.round}"
    if status.accuracy is not None:
        what += f" accuracy {status.accuracy:.4f}"
    if status.reason is not None:
        what += f" ({status.reason})"
    if status.detail:
        what += f": {status.detail}"
    return {"time": status.updated_at, "device": status.device, "kind": "state", "level": "info", "line": what}


def entry_of(message: Message, job: str, nodes: dict[int, str]) -> dict[str, Any] | None:
    """A log entry from a device's log line, an execution state or a telemetry's events."""
    if (device := topics.parse_device_log(message.topic)) is not None:
        return log_entry(device, message.payload)
    if topics.parse_job_exec(message.topic) is not None:
        try:
            return exec_entry(ExecStatus.model_validate_json(message.payload))
        except ValueError:
            return None
    node = Topics(job).parse_telemetry(message.topic)
    return None if node is None else telemetry_entry(message.payload, nodes, node)


def log_entry(device: str, payload: bytes) -> dict[str, Any]:
    try:
        data = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        data = None
    if isinstance(data, dict):
        return {"time": float(data.get("time", data.get("at", time.time())) or time.time()), "device": device,
                "kind": "log", "level": str(data.get("level", "warning")),
                "line": str(data.get("line", data.get("message", ""))),
                **({"job": data["job"]} if "job" in data else {})}
    return {"time": time.time(), "device": device, "kind": "log", "level": "warning",
            "line": payload.decode(errors="replace")}


def telemetry_entry(payload: bytes, nodes: dict[int, str], node: int) -> dict[str, Any] | None:
    """The events of one round's telemetry (reroutes, timeouts, ...); None when it has none."""
    try:
        data = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict) or not data.get("events"):
        return None
    events = "; ".join(" ".join(f"{k}={v}" for k, v in e.items()) for e in data["events"] if isinstance(e, dict))
    return {"time": float(data.get("wall_time", time.time())), "device": nodes.get(node, f"node {node}"),
            "kind": "telemetry", "level": "warning", "line": f"round {data.get('round')}: {events}"}


def _print(args: argparse.Namespace, entry: dict[str, Any]) -> None:
    if args.json:
        print(json.dumps(entry), flush=True)
        return
    stamp = time.strftime("%H:%M:%S", time.localtime(entry["time"]))
    print(f"{stamp} {entry['device']:<16} {entry['level']:<7} {entry['line']}", flush=True)
