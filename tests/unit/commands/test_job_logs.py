"""What `job logs` makes of a device's log line and of a round's telemetry events."""

from __future__ import annotations

import json

from agent.commands.job_logs import log_entry, telemetry_entry


def test_a_devices_json_log_line_keeps_its_level_time_and_text() -> None:
    payload = json.dumps({"device": "pi-a", "level": "error", "line": "out of memory", "time": 12.5}).encode()
    assert log_entry("pi-a", payload) == {"time": 12.5, "device": "pi-a", "kind": "log", "level": "error",
                                          "line": "out of memory"}


def test_a_plain_text_log_line_is_shown_as_a_warning() -> None:
    entry = log_entry("pi-a", b"disk full")
    assert (entry["level"], entry["line"]) == ("warning", "disk full")


def test_telemetry_shows_its_events_under_the_nodes_device_and_nothing_without_events() -> None:
    events = {"node": 1, "round": 7, "wall_time": 3.0, "events": [{"kind": "reroute", "peer": 3}]}
    entry = telemetry_entry(json.dumps(events).encode(), {1: "pi-b"}, 1)
    assert entry is not None
    assert (entry["device"], entry["line"]) == ("pi-b", "round 7: kind=reroute peer=3")
    assert telemetry_entry(json.dumps({"node": 1, "round": 8, "events": []}).encode(), {1: "pi-b"}, 1) is None
    assert telemetry_entry(b"not json", {}, 1) is None
