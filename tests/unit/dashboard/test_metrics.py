"""The metrics collector, and the deploy/ examples that use its names (Grafana, alerts)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.protocol.messages import Status, Telemetry, View
from dashboard.bridges import apply_bridge, notification_report
from dashboard.metrics import fleet_registry
from dashboard.records import apply_record
from dashboard.state import FleetState, apply_status, apply_telemetry, apply_view

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"


def a_fleet() -> FleetState:
    state, _ = apply_view(FleetState(), View(1, [0, 1], 2, 0, 0), 0.0)
    for node in (0, 1):
        state, _ = apply_status(state, Status(node, "online"), 0.0)
    for round_no in range(3):
        for node in (0, 1):
            msg = Telemetry(node, round_no, 1, "ft", 0.1, loss=0.5, bytes_sent=100 * (node + 1),
                            reroutes=node, degraded=round_no == 2 and node == 1,
                            rejected={"crc": 2} if node == 1 else {},
                            phase_seconds={"total": 0.2 + node}, model_hash="h",
                            cpu_percent=50.0 + round_no if node == 1 else None,
                            rss_bytes=(60 + round_no) * 1_000_000 if node == 1 else 0)
            state, _ = apply_telemetry(state, msg, 0.1 * round_no)
    return state


def sample_names(state: FleetState) -> set[str]:
    text = generate_latest(fleet_registry(lambda: state, "j")).decode()
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def test_values_follow_the_state() -> None:
    state = a_fleet()
    text = generate_latest(fleet_registry(lambda: state, "j")).decode()
    samples = {(s.name, s.labels.get("node", ""), s.labels.get("reason", "")): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("edgegrove_rounds_total", "", "")] == 3
    assert samples[("edgegrove_bytes_sent_total", "", "")] == 3 * 300
    assert samples[("edgegrove_reroutes_total", "", "")] == 3
    assert samples[("edgegrove_degraded_rounds_total", "", "")] == 1
    assert samples[("edgegrove_round_seconds", "", "")] == 1.2
    assert samples[("edgegrove_node_bytes_sent_total", "1", "")] == 600
    assert samples[("edgegrove_node_rejected_frames_total", "1", "crc")] == 2
    assert samples[("edgegrove_rejected_frames_total", "", "crc")] == 2
    assert samples[("edgegrove_nodes_online", "", "")] == 2
    # What node 1 said of its process in its latest round; node 0 never said.
    assert samples[("edgegrove_node_rss_bytes", "1", "")] == 62_000_000
    assert samples[("edgegrove_node_cpu_percent", "1", "")] == 52.0
    assert ("edgegrove_node_rss_bytes", "0", "") not in samples
    assert ("edgegrove_node_cpu_percent", "0", "") not in samples


def test_the_deploy_examples_name_only_metrics_that_exist() -> None:
    names = sample_names(a_fleet())
    grafana = (DEPLOY / "grafana" / "edgegrove-fleet.json").read_text()
    json.loads(grafana)  # a valid dashboard file
    rules = (DEPLOY / "prometheus" / "edgegrove-alerts.yml").read_text()
    used = set(re.findall(r"edgegrove_[a-z_]+", grafana + rules))
    assert used and used <= names, sorted(used - names)


def test_each_sites_bridge_is_a_metric() -> None:
    state, _ = apply_record(a_fleet(), {"type": "uplinks", "bytes": {"s0": [10, 20], "s1": [1, 2]}}, 1.0)
    state, _ = apply_bridge(state, notification_report("s1", b"0"), 2.0)
    text = generate_latest(fleet_registry(lambda: state, "j")).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("edgegrove_bridge_up", (("job", "j"), ("site", "s1")))] == 0
    assert ("edgegrove_bridge_up", (("job", "j"), ("site", "s0"))) not in samples  # not known
    assert samples[("edgegrove_bridge_downs_total", (("job", "j"), ("site", "s1")))] == 1
    assert samples[("edgegrove_bridge_bytes_total", (("direction", "down"), ("job", "j"), ("site", "s0")))] == 20
    assert "edgegrove_bridge_up" not in sample_names(a_fleet())  # no sites: no samples
