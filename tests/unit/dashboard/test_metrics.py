"""The metrics collector, and the deploy/ examples that use its names (Grafana, alerts)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.protocol.messages import Status, Telemetry, View
from dashboard.bridges import apply_bridge, notification_report
from dashboard.device_logs import DeviceLogBook, Place
from dashboard.directory import Directory, take
from dashboard.metrics import BrokerLink, device_log_metrics, directory_metrics, fleet_registry
from dashboard.records import apply_record
from dashboard.state import FleetState, apply_status, apply_telemetry, apply_view
from tests.unit.dashboard.directory_messages import fleet_messages

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
    state, _ = apply_telemetry(a_fleet(), Telemetry(0, 3, 1, "ft", 0.1, accuracy=0.9), 1.0)
    state, _ = apply_record(state, {"type": "fault", "action": "inject", "index": 0, "kind": "crash",
                                    "targets": [1], "round": 3}, 1.0)
    names = {name for name, _ in labelled_samples(state, BrokerLink("mqtt://127.0.0.1:1883", True, 1))}
    directory = Directory()
    for topic, payload in fleet_messages():
        directory = take(directory, topic, payload, 1.0)
    names |= {s.name for family in directory_metrics(directory) for s in family.samples}
    book = DeviceLogBook()
    book.add("pi-1", b'{"level": "error", "line": "out of memory"}', 1.0, Place())
    names |= {s.name for family in device_log_metrics(book) for s in family.samples}
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
    assert samples[("edgegrove_bridge_up", (("fleet_job", "j"), ("site", "s1")))] == 0
    assert ("edgegrove_bridge_up", (("fleet_job", "j"), ("site", "s0"))) not in samples  # not known
    assert samples[("edgegrove_bridge_downs_total", (("fleet_job", "j"), ("site", "s1")))] == 1
    assert samples[("edgegrove_bridge_bytes_total", (("direction", "down"), ("fleet_job", "j"), ("site", "s0")))] == 20
    assert "edgegrove_bridge_up" not in sample_names(a_fleet())  # no sites: no samples


def labelled_samples(state: FleetState, broker: BrokerLink | None = None) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = fleet_registry(lambda: state, "j", None if broker is None else lambda: broker)
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_no_sample_carries_prometheus_own_job_label() -> None:
    text = generate_latest(fleet_registry(lambda: a_fleet(), "j")).decode()
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    assert samples and all("job" not in s.labels and s.labels["fleet_job"] == "j" for s in samples)


def test_each_nodes_round_times_accuracy_troubles_and_faults() -> None:
    state = a_fleet()
    state, _ = apply_telemetry(state, Telemetry(
        0, 3, 1, "ft", 0.1, loss=0.25, accuracy=0.8, timeouts=2, pulls=3, phase_seconds={"total": 7.0},
        events=[{"kind": "state_pull", "peer": 1, "detail": "attempt 1"}]), 1.0)
    state, _ = apply_telemetry(state, Telemetry(1, 3, 1, "ft", 0.1, loss=0.75, accuracy=0.6,
                                                phase_seconds={"total": 1.2}), 1.0)
    state, _ = apply_record(state, {"type": "fault", "action": "inject", "index": 0, "kind": "link",
                                    "targets": [0, 1], "round": 3}, 1.0)
    state, _ = apply_record(state, {"type": "dashboard_control", "action": "hang", "node": 1, "applied": True,
                                    "outcome": "applied: hang node 1"}, 1.1)
    samples = labelled_samples(state)

    def at(name: str, node: int, **more: str) -> float:
        return samples[(name, tuple(sorted({"fleet_job": "j", "node": str(node), **more}.items())))]

    # Node 0: rounds of 0.2 s (three) and 7 s; node 1: 1.2 s (four).
    assert at("edgegrove_node_round_seconds_bucket", 0, le="0.25") == 3
    assert at("edgegrove_node_round_seconds_bucket", 0, le="5.0") == 3
    assert at("edgegrove_node_round_seconds_bucket", 0, le="10.0") == 4
    assert at("edgegrove_node_round_seconds_bucket", 0, le="+Inf") == 4
    assert at("edgegrove_node_round_seconds_count", 0) == 4
    assert at("edgegrove_node_round_seconds_sum", 0) == pytest.approx(7.6)
    assert at("edgegrove_node_round_seconds_bucket", 1, le="1.0") == 0
    assert at("edgegrove_node_round_seconds_bucket", 1, le="2.5") == 4
    assert at("edgegrove_node_accuracy", 0) == 0.8
    assert at("edgegrove_node_timeouts_total", 0) == 2 and at("edgegrove_node_pulls_total", 0) == 3
    assert at("edgegrove_node_state_pulls_total", 0) == 1 and at("edgegrove_node_state_pulls_total", 1) == 0
    assert at("edgegrove_node_faults_total", 0, kind="link") == 1
    assert at("edgegrove_node_faults_total", 1, kind="link") == 1 and at("edgegrove_node_faults_total", 1, kind="hang") == 1
    assert at("edgegrove_node_state", 0, state="online") == 1
    # The fleet's loss and accuracy: the mean of the nodes' in round 3.
    assert samples[("edgegrove_fleet_accuracy", (("fleet_job", "j"),))] == pytest.approx(0.7)
    assert samples[("edgegrove_fleet_loss", (("fleet_job", "j"),))] == pytest.approx(0.5)


def test_the_dashboards_broker_connection() -> None:
    state = a_fleet()
    down = labelled_samples(state, BrokerLink("mqtt://127.0.0.1:1883", False, 3))
    assert down[("edgegrove_dashboard_broker_connected", (("fleet_job", "j"),))] == 0
    assert down[("edgegrove_dashboard_broker_connects_total", (("fleet_job", "j"),))] == 3
    up = labelled_samples(state, BrokerLink("mqtt://127.0.0.1:1883", True, 4))
    assert up[("edgegrove_dashboard_broker_connected", (("fleet_job", "j"),))] == 1
    replay = labelled_samples(state, BrokerLink(None, False, 0))  # no broker at all: no sample
    assert not any(name.startswith("edgegrove_dashboard_broker") for name, _ in replay)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    assert tool, "promtool is missing: install the Debian package prometheus (scripts/setup.sh --dev does)"
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=120, check=False)


def test_promtool_passes_the_config_the_rules_and_their_unit_tests() -> None:
    prometheus = DEPLOY / "prometheus"
    for args in (("check", "config", str(prometheus / "prometheus.yml")),
                 ("check", "rules", str(prometheus / "edgegrove-alerts.yml")),
                 ("test", "rules", str(prometheus / "edgegrove-alerts.test.yml"))):
        done = promtool(*args)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
    alerts = set(re.findall(r"alert: (\w+)", (prometheus / "edgegrove-alerts.yml").read_text()))
    tested = set(re.findall(r"alertname: (\w+)", (prometheus / "edgegrove-alerts.test.yml").read_text()))
    assert {"EdgegroveDeviceSilent", "EdgegroveJobStalled", "EdgegroveAccuracyFalling",
            "EdgegroveRejectedFramesRising", "EdgegroveDashboardBrokerDown"} <= tested <= alerts


def test_every_grafana_query_is_promql_that_promtool_parses(tmp_path: Path) -> None:
    board = json.loads((DEPLOY / "grafana" / "edgegrove-fleet.json").read_text())
    exprs = [t["expr"].replace("$fleet_job", ".*") for panel in board["panels"] for t in panel.get("targets", [])]
    assert len(exprs) >= 20 and all("fleet_job" in e and 'job=~"$job"' not in e for e in exprs)
    variable = next(v for v in board["templating"]["list"] if v["type"] == "query")
    assert variable["name"] == "fleet_job" and "fleet_job)" in variable["query"]
    rules = {"groups": [{"name": "grafana", "rules": [
        {"record": f"grafana:query{k}", "expr": e} for k, e in enumerate(exprs)]}]}
    (tmp_path / "queries.yml").write_text(json.dumps(rules))  # YAML is a superset of JSON
    done = promtool("check", "rules", str(tmp_path / "queries.yml"))
    assert done.returncode == 0, (done.stdout, done.stderr)
