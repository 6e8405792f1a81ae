"""A real Prometheus scraping a running fleet's dashboard (issue 55).

A demo fleet of seven MQTT clients on a real mosquitto, its dashboard, and Debian's
`prometheus` server run with the shipped deploy/prometheus/prometheus.yml (its target, and a
1 s scrape and evaluation, set for the test) and the shipped alert rules, their windows scaled
from minutes to tens of seconds (promtool's unit tests, test_metrics.py, hold the real ones). Every
query of the shipped Grafana dashboard is valid PromQL to the server, the per-node ones return
a series for each node, and when one device goes silent, EdgegroveDeviceSilent fires for that
device and no other.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboard.demo import DemoFleet, NodeCredentials
from dashboard.server import DashboardHandle, run_in_thread
from dashboard.settings import DashboardSettings
from simulate.brokers import free_port, start_mosquitto

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
JOB = "promtest"
NODES = 7
SILENT = 5
# Per-node Grafana queries whose metric the demo fleet reports: one series per node each.
PER_NODE = ("edgegrove_node_online", "edgegrove_node_loss", "edgegrove_node_accuracy",
            "edgegrove_node_bytes_sent_total", "edgegrove_node_round_seconds_bucket")


class SilencingFleet(DemoFleet):
    """The demo fleet, with devices that can be made to stop reporting."""

    silenced: frozenset[int] = frozenset()

    def run_round(self) -> None:
        self.round += 1
        for node_id, node in self.nodes.items():
            node.probe(self.round, sorted(self.tree.neighbours(node_id)))
        self._stop.wait(self.round_window)
        for node_id, node in self.nodes.items():
            if node_id not in self.silenced:
                telemetry = self._telemetry(node_id, self.round, node.heard(self.round))
                node.client.publish(self.topics.telemetry(node_id), telemetry.encode(), 0)


def scaled_rules(text: str) -> str:
    """The shipped rules with each minute ten seconds: the same expressions, quick to fire
    (ten seconds still hold many rounds of every device that reports)."""
    return re.sub(r"(\[|for: )(\d+)m\b", r"\g<1>\g<2>0s", text)


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.loads(reply.read())


def wait_for(what: str, check: Callable[[], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


@pytest.fixture
def fleet_and_dashboard(tmp_path: Path) -> Iterator[tuple[SilencingFleet, DashboardHandle]]:
    with start_mosquitto(tmp_path / "broker", job=JOB, nodes=NODES) as broker:
        logins = {n: broker.credentials_for(n) for n in range(NODES)}
        creds = {n: NodeCredentials(c.username, c.password, c.client_id) for n, c in logins.items()}
        fleet = SilencingFleet(broker.url, JOB, NODES, credentials=creds, round_window=0.3)
        fleet.start_background()
        try:
            dash = broker.dashboard_credentials
            settings = DashboardSettings(broker_url=broker.url, job=JOB, username=dash.username,
                                         password=dash.password, port=0)
            with run_in_thread(settings) as handle:
                yield fleet, handle
        finally:
            fleet.stop()


@pytest.fixture
def prometheus(tmp_path: Path, fleet_and_dashboard: tuple[SilencingFleet, DashboardHandle]) -> Iterator[str]:
    binary = shutil.which("prometheus")
    assert binary, "prometheus is missing: install the Debian package prometheus (scripts/setup.sh --dev does)"
    _, handle = fleet_and_dashboard
    target = urllib.parse.urlsplit(handle.url).netloc
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["scrape_configs"][0]["static_configs"] = [{"targets": [target]}]
    config["rule_files"] = [str(tmp_path / "edgegrove-alerts.yml")]
    (tmp_path / "edgegrove-alerts.yml").write_text(scaled_rules((DEPLOY / "prometheus" / "edgegrove-alerts.yml").read_text()))
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    process = subprocess.Popen(
        [binary, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for("prometheus to be ready", lambda: _ready(url) or process.poll() is not None, 60)
        assert process.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
        yield url
    finally:
        process.terminate()
        process.wait(20)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/-/ready", timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


def query(url: str, expr: str) -> list[dict[str, Any]]:
    reply = get_json(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")
    assert reply["status"] == "success", (expr, reply)
    return list(reply["data"]["result"])


def firing(url: str, name: str) -> list[dict[str, str]]:
    alerts = get_json(f"{url}/api/v1/alerts")["data"]["alerts"]
    return [a["labels"] for a in alerts if a["labels"]["alertname"] == name and a["state"] == "firing"]


def test_prometheus_scrapes_the_fleet_grafana_queries_answer_and_a_silent_device_alerts(
    prometheus: str, fleet_and_dashboard: tuple[SilencingFleet, DashboardHandle]
) -> None:
    fleet, _ = fleet_and_dashboard
    wait_for("a round-time rate for every node", lambda: len(query(
        prometheus, "rate(edgegrove_node_round_seconds_count[5s]) > 0")) == NODES)
    [target] = get_json(f"{prometheus}/api/v1/targets")["data"]["activeTargets"]
    assert target["health"] == "up" and target["labels"]["job"] == "edgegrove-dashboard"
    # fleet_job is ours, job the scrape job's: nothing renamed to exported_job.
    [rounds] = query(prometheus, "edgegrove_rounds_total")
    assert rounds["metric"]["fleet_job"] == JOB and rounds["metric"]["job"] == "edgegrove-dashboard"
    assert "exported_job" not in rounds["metric"]

    board = json.loads((DEPLOY / "grafana" / "edgegrove-fleet.json").read_text())
    answered = {}
    for panel in board["panels"]:
        for target_query in panel["targets"]:
            expr = target_query["expr"].replace("$fleet_job", JOB)
            answered[expr] = query(prometheus, expr)  # valid PromQL, or the query fails
    for metric in PER_NODE:
        exprs = [e for e in answered if metric in e]
        assert exprs, f"no Grafana query reads {metric}"
        for expr in exprs:
            nodes = {s["metric"].get("node") for s in answered[expr]}
            assert nodes == {str(n) for n in range(NODES)}, (expr, nodes)
    print(f"\nGrafana: {len(answered)} queries answered, "
          f"{sum(1 for r in answered.values() if r)} with series")

    fleet.silenced = frozenset({SILENT})
    silenced_at = time.monotonic()
    wait_for("EdgegroveDeviceSilent firing", lambda: bool(firing(prometheus, "EdgegroveDeviceSilent")), 120)
    print(f"EdgegroveDeviceSilent fired {time.monotonic() - silenced_at:.0f} s after device {SILENT} went silent "
          "(rules scaled: 20 s window, for 10 s)")
    [alert] = firing(prometheus, "EdgegroveDeviceSilent")
    assert (alert["node"], alert["fleet_job"], alert["severity"]) == (str(SILENT), JOB, "warning")
    assert firing(prometheus, "EdgegroveJobStalled") == []  # the others go on
