"""``GET /metrics``: the fleet as Prometheus sees it, read from the FleetState at each scrape.

A collector of our own on a registry of our own (not the process-global one): several
dashboards in one process (tests, the simulator) never share or double-register metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dashboard.state import FleetState, rejected_frames

PREFIX = "edgegrove"
_UP = ("online", "joining")


class FleetCollector(Collector):
    def __init__(self, state: Callable[[], FleetState], job: str) -> None:
        self.state = state
        self.job = job

    def collect(self) -> Iterable[Metric]:
        state = self.state()
        yield from self._fleet(state)
        yield from self._nodes(state)
        yield from self._bridges(state)

    def _fleet(self, s: FleetState) -> Iterable[Metric]:
        c, job = s.counters, [self.job]
        latest = s.rounds.get(s.latest_round) if s.latest_round is not None else None
        nodes = list(s.nodes.values())
        for name, doc, value in (
            ("rounds", "Distinct rounds the fleet reported", c.rounds),
            ("degraded_rounds", "Rounds in which at least one node finalized degraded", c.degraded_rounds),
            ("reroutes", "Sends rerouted through a backup link (sum of the agents' reports)", c.reroutes),
            ("timeouts", "Link timeouts (sum of the agents' reports)", c.timeouts),
            ("bytes_sent", "Bytes the agents sent (sum of their reports)", c.bytes_sent),
            ("suspicions", "Nodes suspected silent or hung (the agents' and the dashboard's)", c.suspicions),
        ):
            yield _one(CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=["job"]), job, value)
        rejected = CounterMetricFamily(f"{PREFIX}_rejected_frames", "Frames the agents rejected",
                                       labels=["job", "reason"])
        for reason, count in sorted(rejected_frames(s).items()):
            rejected.add_metric([self.job, reason], count)
        yield rejected
        gauges: tuple[tuple[str, str, float], ...] = (
            ("latest_round", "Highest round any node finished", s.latest_round if s.latest_round is not None else -1),
            ("round_seconds", "The slowest agent's time in the latest round",
             latest.round_seconds if latest else 0.0),
            ("round_seconds_median", "The median agent's time in the latest round",
             latest.median_seconds if latest else 0.0),
            ("nodes", "Nodes the dashboard knows", len(nodes)),
            ("nodes_online", "Nodes whose status is online or joining", sum(n.status in _UP for n in nodes)),
            ("view_members", "Members of the current view", len(s.view.members) if s.view else 0),
            ("active_incidents", "Incidents not yet recovered", sum(i.active for i in s.incidents)),
            ("finished", "1 once the run is over (being stopped, or ended)", int(s.run.phase != "live")),
        )
        for name, doc, reading in gauges:
            yield _one(GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=["job"]), job, reading)

    def _nodes(self, s: FleetState) -> Iterable[Metric]:
        labels = ["job", "node"]
        online = GaugeMetricFamily(f"{PREFIX}_node_online", "1 if the node's status is online or joining", labels=labels)
        last = GaugeMetricFamily(f"{PREFIX}_node_last_round", "The node's latest reported round", labels=labels)
        loss = GaugeMetricFamily(f"{PREFIX}_node_loss", "The node's latest training loss", labels=labels)
        sent = CounterMetricFamily(f"{PREFIX}_node_bytes_sent", "Bytes the node sent", labels=labels)
        received = CounterMetricFamily(f"{PREFIX}_node_bytes_received", "Bytes the node received", labels=labels)
        reroutes = CounterMetricFamily(f"{PREFIX}_node_reroutes", "Sends the node rerouted", labels=labels)
        rss = GaugeMetricFamily(f"{PREFIX}_node_rss_bytes", "The node's resident memory, as it last reported",
                                labels=labels)
        cpu = GaugeMetricFamily(f"{PREFIX}_node_cpu_percent",
                                "The node's CPU in its last reported round, percent of one core", labels=labels)
        restarts = CounterMetricFamily(f"{PREFIX}_node_restarts", "Times the node came back as a new process", labels=labels)
        rejected = CounterMetricFamily(f"{PREFIX}_node_rejected_frames", "Frames the node rejected",
                                       labels=[*labels, "reason"])
        for n in sorted(s.nodes.values(), key=lambda n: n.node):
            key = [self.job, str(n.node)]
            online.add_metric(key, int(n.status in _UP))
            if n.last_round is not None:
                last.add_metric(key, n.last_round)
            if n.loss is not None:
                loss.add_metric(key, n.loss)
            sent.add_metric(key, n.bytes_sent)
            received.add_metric(key, n.bytes_received)
            reroutes.add_metric(key, n.reroutes)
            restarts.add_metric(key, n.restarts)
            if n.rss_bytes:
                rss.add_metric(key, n.rss_bytes)
            if n.cpu_percent is not None:
                cpu.add_metric(key, n.cpu_percent)
            for reason, count in sorted(n.rejected.items()):
                rejected.add_metric([*key, reason], count)
        yield from (online, last, loss, sent, received, reroutes, restarts, rss, cpu, rejected)


    def _bridges(self, s: FleetState) -> Iterable[Metric]:
        """Each site's bridge to the core (a fleet without sites: no samples)."""
        labels = ["job", "site"]
        up = GaugeMetricFamily(f"{PREFIX}_bridge_up", "1 if the site's bridge to the core is "
                               "connected, 0 if not (no sample: not known)", labels=labels)
        downs = CounterMetricFamily(f"{PREFIX}_bridge_downs", "Times the site's bridge went down", labels=labels)
        carried = CounterMetricFamily(f"{PREFIX}_bridge_bytes", "Bytes through the site's uplink "
                                      "(direction up: to the core)", labels=[*labels, "direction"])
        for site, bridge in sorted(s.bridges.items()):
            key = [self.job, site]
            if bridge.state != "unknown":
                up.add_metric(key, int(bridge.state == "up"))
            downs.add_metric(key, bridge.downs)
            if bridge.bytes_up is not None and bridge.bytes_down is not None:
                carried.add_metric([*key, "up"], bridge.bytes_up)
                carried.add_metric([*key, "down"], bridge.bytes_down)
        yield from (up, downs, carried)


def _one(metric: CounterMetricFamily | GaugeMetricFamily, labels: list[str], value: float
         ) -> Metric:
    metric.add_metric(labels, value)
    return metric


def fleet_registry(state: Callable[[], FleetState], job: str) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector(state, job))
    return registry
