"""Serve a finished run again: the simulator's events.jsonl fed through the same reducer.

Record times (``t``, seconds since the run started) stand in for the clock, and the dashboard's
once-a-second silence check runs between records as it did live, so suspected and hung nodes,
incidents and rounds come out as the live page had them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dashboard.listener import TICK_SECONDS
from dashboard.state import FleetState
from dashboard.store import FleetStore

EVENTS_FILE = "events.jsonl"


@dataclass(frozen=True)
class RecordedRun:
    directory: Path
    records: list[dict[str, Any]]
    started_at: float  # Unix time of t = 0
    fleet_size: int | None
    total_rounds: int | None
    job: str = ""  # the run's job, as its config.json says


def check_run_dir(directory: Path) -> Path:
    """The events file of a run directory; ValueError says what is wrong: no such directory,
    no events file, an unreadable one, or one with no simulator record in it (garbage)."""
    if not directory.is_dir():
        raise ValueError(f"--replay {directory}: not a directory (give a simulator run directory)")
    events = directory / EVENTS_FILE
    if not events.is_file():
        raise ValueError(f"--replay {directory}: no {EVENTS_FILE} in it (not a simulator run?)")
    try:
        with events.open(encoding="utf-8", errors="replace") as lines:
            if not any(_record(line) is not None for line in lines):
                raise ValueError(f"--replay {directory}: {EVENTS_FILE} holds no simulator record "
                                 f"(empty, or not the JSON lines `edgegrove simulate` writes)")
    except OSError as exc:
        raise ValueError(f"--replay {directory}: cannot read {EVENTS_FILE} ({exc.strerror})") from None
    return events


def _record(line: str) -> dict[str, Any] | None:
    """One line of events.jsonl as a record (a JSON object with its time), else None."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    if isinstance(record, dict) and isinstance(record.get("t"), (int, float)):
        return record
    return None


def load_run(directory: Path) -> RecordedRun:
    """Reads a run directory. Lines that are not JSON objects (a run cut short) are skipped."""
    records: list[dict[str, Any]] = []
    for line in check_run_dir(directory).read_text(encoding="utf-8", errors="replace").splitlines():
        record = _record(line)
        if record is not None:
            records.append(record)
    config = _read_json(directory / "config.json")
    started = (directory / "config.json").stat().st_mtime if config else 0.0
    job = config.get("job")
    return RecordedRun(directory, records, started, _fleet_value(config, "nodes"),
                       _fleet_value(config, "rounds"), job if isinstance(job, str) else "")


@dataclass(frozen=True)
class RoundSnapshot:
    """The fleet as the live page had it when ``round`` was the highest round finished."""

    state: FleetState
    time: float  # the run's clock then


def replay_into(store: FleetStore, run: RecordedRun) -> dict[int, RoundSnapshot]:
    """Feed the run; returns, per round, the last state before the fleet finished the next
    one (the replay's round slider shows these)."""
    snapshots: dict[int, RoundSnapshot] = {}
    next_tick = TICK_SECONDS
    for record in run.records:
        t = float(record["t"])
        while next_tick <= t:
            store.tick_at(next_tick)
            next_tick += TICK_SECONDS
        store.ingest_record(record, now=t)
        latest = store.state.latest_round
        if latest is not None:
            snapshots[latest] = RoundSnapshot(store.state, t)
    state = store.state
    store.state = replace(state, run=replace(state.run, phase="finished",
                                             replay_of=str(run.directory)))
    return snapshots


def snapshot_at(snapshots: dict[int, RoundSnapshot], round_no: int) -> RoundSnapshot | None:
    """The snapshot of ``round_no``, or of the last round before it the run has one for."""
    known = [r for r in snapshots if r <= round_no]
    return snapshots[max(known)] if known else None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _fleet_value(config: dict[str, Any], key: str) -> int | None:
    try:
        value = config["scenario"]["fleet"][key]
    except (KeyError, TypeError):
        return None
    return value if isinstance(value, int) else None
