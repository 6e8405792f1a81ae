"""`edgegrove devices`: the enrolled devices (their retained records) and what they are doing."""

from __future__ import annotations

import argparse
import json
import sys
import time

from agent.jobs import topics
from agent.jobs.document import DeviceRecord
from agent.operator.connection import (
    add_broker_arguments,
    fleet_snapshot,
    one_line_errors,
)
from agent.operator.tables import ago, table

DESCRIPTION = __doc__


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_broker_arguments(parser)


@one_line_errors("edgegrove devices")
def run(args: argparse.Namespace) -> int:
    view = fleet_snapshot(args, [topics.all_device_records()])
    records = [view.devices[d] for d in sorted(view.devices)]
    if args.json:
        print(json.dumps([r.model_dump(mode="json") for r in records]))
        return 0
    if not records:
        print("no devices have enrolled on this broker (start one with `edgegrove device --config device.toml`)")
        return 0
    now = time.time()
    print(table(["DEVICE", "LABELS", "ARCH", "CORES", "MEMORY", "BACKENDS", "DATA", "STATE", "JOB", "LAST SEEN"],
                [_row(r, now) for r in records]))
    for topic in view.unreadable:
        print(f"edgegrove devices: {topic} holds no readable record", file=sys.stderr)
    return 0


def _row(record: DeviceRecord, now: float) -> list[str]:
    data = ", ".join(f"{name}:{info.samples}" + (" (unreadable)" if info.error else "")
                     for name, info in sorted(record.data.items()))
    job = record.job or "-"
    if record.node is not None and record.job:
        job += f" (node {record.node})"
    if record.queued:
        job += f" +{len(record.queued)} queued"
    refused = sum(record.refused.values())
    state = str(record.state) + (f", refused {refused}" if refused else "")
    return [record.id, ",".join(f"{k}={v}" for k, v in sorted(record.labels.items())) or "-",
            record.arch or "-", str(record.cores or "-"), f"{record.memory / 2**20:.0f} MB" if record.memory else "-",
            ",".join(record.backends) or "-", data or "-", state, job, ago(record.last_seen, now)]
