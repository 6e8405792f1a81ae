"""/metrics: each node's differential privacy spent, as its telemetry last said."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.protocol.messages import Telemetry
from dashboard.metrics import fleet_registry
from dashboard.state import FleetState, apply_telemetry


def test_the_epsilon_spent_per_node_is_a_gauge_of_its_latest_report() -> None:
    state = FleetState()
    for round_no, epsilon in enumerate((0.4, 0.6, None)):  # a report without it keeps the last
        state, _ = apply_telemetry(state, Telemetry(0, round_no, 1, "ft", 0.1, dp_epsilon=epsilon), 0.1)
        state, _ = apply_telemetry(state, Telemetry(1, round_no, 1, "ft", 0.1), 0.1)
    text = generate_latest(fleet_registry(lambda: state, "j")).decode()
    samples = {(s.name, s.labels.get("node")): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("edgegrove_node_dp_epsilon", "0")] == 0.6
    assert ("edgegrove_node_dp_epsilon", "1") not in samples  # no DP on node 1
