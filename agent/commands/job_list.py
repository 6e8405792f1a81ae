"""`edgegrove job list`: the jobs on the broker, their devices' states, last round and accuracy."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from agent.jobs import topics
from agent.operator.connection import (
    add_broker_arguments,
    fleet_snapshot,
    one_line_errors,
)
from agent.operator.fleet import FleetView
from agent.operator.tables import ago, last_round, percent, states_summary, table

DESCRIPTION = __doc__


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_broker_arguments(parser)


@one_line_errors("edgegrove job list")
def run(args: argparse.Namespace) -> int:
    filters = [topics.all_job_specs(), topics.all_execs(), f"{topics.ROOT}/jobs/+/result",
               topics.all_job_controls()]
    view = fleet_snapshot(args, filters)
    now = time.time()
    rows: list[dict[str, Any]] = []
    for name in sorted(set(view.jobs) | set(view.execs), key=lambda j: _submitted(view, j)):
        spec, execs = view.jobs.get(name), view.execs.get(name, {})
        result = view.results.get(name)
        round_, accuracy = last_round(execs)
        if result is not None:
            round_, accuracy = result.round, result.accuracy
        rows.append({
            "job": name, "model": _model(spec), "devices": len(spec.assignments) if spec else len(execs),
            "states": states_summary(spec, execs), "round": round_, "accuracy": accuracy,
            "result": result is not None, "stopped": name in view.stopped,
            "submitted_at": spec.submitted_at if spec else None,
        })
    if args.json:
        print(json.dumps(rows))
    elif not rows:
        print("no jobs on this broker")
    else:
        print(table(["JOB", "MODEL", "DEVICES", "STATES", "ROUND", "ACCURACY", "RESULT", "SUBMITTED"],
                    [[r["job"], r["model"], str(r["devices"]), r["states"] + (" (stopped)" if r["stopped"] else ""),
                      "-" if r["round"] is None else str(r["round"]), percent(r["accuracy"]),
                      "yes" if r["result"] else "-", ago(r["submitted_at"] or 0, now)] for r in rows]))
    return 0


def _submitted(view: FleetView, job: str) -> float:
    spec = view.jobs.get(job)
    return spec.submitted_at if spec else 0.0


def _model(spec: object) -> str:
    model = getattr(spec, "model", None)
    if model is None:
        return "-"
    return model if isinstance(model, str) else str(model.filename)
