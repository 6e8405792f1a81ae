"""`edgegrove job status JOB`: each device's execution state, the job's last round and accuracy."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from agent.jobs import topics
from agent.jobs.document import ExecStatus, JobSpec
from agent.operator.connection import (
    OperatorError,
    add_broker_arguments,
    fleet_snapshot,
    one_line_errors,
)
from agent.operator.fleet import FleetView
from agent.operator.tables import ago, last_round, percent, states_summary, table
from agent.validate import arg

DESCRIPTION = __doc__


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", type=arg(topics.validate_job_name), help="the job's name")
    add_broker_arguments(parser)


@one_line_errors("edgegrove job status")
def run(args: argparse.Namespace) -> int:
    filters = [topics.job_spec(args.job), topics.job_execs(args.job), topics.job_result(args.job),
               topics.job_control(args.job)]
    view = fleet_snapshot(args, filters)
    spec, execs = view.jobs.get(args.job), view.execs.get(args.job, {})
    if spec is None and not execs:
        raise OperatorError(f"no job {args.job} on this broker (see `edgegrove job list`)")
    status = job_status(args.job, spec, execs, view)
    print(json.dumps(status) if args.json else _text(status, spec, execs))
    return 0


def job_status(job: str, spec: JobSpec | None, execs: dict[str, ExecStatus], view: FleetView) -> dict[str, Any]:
    result = view.results.get(job)
    round_, accuracy = last_round(execs)
    devices = sorted(set(execs) | set(spec.assignments if spec else {}),
                     key=lambda d: (spec.assignments.get(d, 10**6) if spec else 0, d))
    return {
        "job": job, "stopped": job in view.stopped, "states": states_summary(spec, execs),
        "round": result.round if result else round_,
        "accuracy": result.accuracy if result else accuracy,
        "result": result.model_dump(mode="json", exclude={"layout"}) if result else None,
        "spec": spec.model_dump(mode="json") if spec else None,
        "devices": [_device(d, spec, execs.get(d)) for d in devices],
    }


def _device(device: str, spec: JobSpec | None, status: ExecStatus | None) -> dict[str, Any]:
    node = spec.assignments.get(device) if spec else None
    if status is None:
        return {"device": device, "node": node, "state": None}
    return {"device": device, **status.model_dump(mode="json", exclude={"job", "device"}),
            "node": status.node if status.node is not None else node}


def _text(status: dict[str, Any], spec: JobSpec | None, execs: dict[str, ExecStatus]) -> str:
    now = time.time()
    lines = [f"job {status['job']}" + ("  (stop requested)" if status["stopped"] else "")]
    if spec is not None:
        model = spec.model if isinstance(spec.model, str) else spec.model.filename
        stop = spec.stop
        rule = ", ".join(p for p in (f"{stop.rounds} rounds" if stop.rounds else "",
                                     f"accuracy {stop.target_accuracy}" if stop.target_accuracy else "",
                                     f"deadline in {stop.deadline - now:.0f}s" if stop.deadline else "") if p)
        lines.append(f"  model {model}, backend {spec.backend}, data {spec.data} ({spec.partition}), "
                     f"{spec.algorithm}, batch {spec.batch}, {spec.optimizer} lr {spec.lr}; "
                     f"stop: {rule or 'when stopped'}; submitted {ago(spec.submitted_at, now)} by "
                     f"{spec.submitted_by or '-'}")
    rows = []
    for device in status["devices"]:
        s = execs.get(device["device"])
        rows.append([device["device"], "-" if device["node"] is None else str(device["node"]),
                     str(s.state) if s else "no state yet",
                     "-" if s is None or s.round is None else str(s.round),
                     percent(s.accuracy if s else None),
                     (str(s.reason) + ": " if s and s.reason else "") + (s.detail if s else ""),
                     ago(s.updated_at, now) if s else "-"])
    lines.append(table(["DEVICE", "NODE", "STATE", "ROUND", "ACCURACY", "REASON / DETAIL", "UPDATED"], rows))
    lines.append(f"states: {status['states']}; last round {status['round'] if status['round'] is not None else '-'}, "
                 f"accuracy {percent(status['accuracy'])}")
    if status["result"]:
        lines.append(f"result: round {status['result']['round']}, published by "
                     f"{status['result']['device']}: `edgegrove job fetch {status['job']} -o DIR`")
    return "\n".join(lines)
