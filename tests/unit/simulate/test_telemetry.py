"""The simulator's collector: what it logs of the agents' telemetry."""

from __future__ import annotations

import json
from pathlib import Path

from agent.protocol.messages import Telemetry
from agent.protocol.topics import Topics
from simulate.telemetry import Collector, EventLog, FleetWatch


def test_a_report_sent_twice_is_logged_once_and_counted(tmp_path: Path) -> None:
    """An agent that reconnects may send its last report again; the run's report counted it as
    a second reporter of that round (8 of 7)."""
    topics = Topics("job")
    log = EventLog(tmp_path / "events.jsonl")
    collector = Collector("mqtt://127.0.0.1:1", topics, log, FleetWatch())  # never connects
    report = Telemetry(node=1, round=9, epoch=1, algorithm="ft-tree", wall_time=1.0).encode()
    rerun = Telemetry(node=1, round=9, epoch=2, algorithm="ft-tree", wall_time=2.0).encode()
    for payload in (report, report, rerun):
        collector._dispatch(topics.telemetry(1), payload)
    logged = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(r["round"], r["epoch"]) for r in logged if r["type"] == "telemetry"] == [(9, 1), (9, 2)]
    assert collector.rejected["telemetry_repeat"] == 1
