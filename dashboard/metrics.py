"""``GET /metrics``: the fleet as Prometheus sees it, read from the FleetState at each scrape.

A collector of our own on a registry of our own (not the process-global one): several
dashboards in one process (tests, the simulator) never share or double-register metrics.
Every sample names its training job by the label ``fleet_job``: Prometheus sets ``job`` to the
scrape job's name, and a ``job`` of ours would be renamed ``exported_job`` (or, with
``honor_labels``, would replace the scrape job's), so the two never meet.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from dashboard.device_logs import DeviceLogBook
from dashboard.directory import Directory
from dashboard.state import ROUND_TIME_BUCKETS, FleetState, RoundTimes, rejected_frames

PREFIX = "edgegrove"
JOB_LABEL = "fleet_job"  # not "job": Prometheus's own (the scrape job)
_UP = ("online", "joining")


@dataclass(frozen=True)
class BrokerLink:
    """The dashboard's own connection to the broker, as /metrics reports it."""

    url: str | None  # None: no broker (a replay)
    connected: bool
    connects: int


class FleetCollector(Collector):
    def __init__(self, state: Callable[[], FleetState], job: str,
                 broker: Callable[[], BrokerLink] | None = None,
                 directory: Callable[[], Directory] | None = None,
                 device_logs: DeviceLogBook | None = None) -> None:
        self.state = state
        self.job = job
        self.broker = broker
        self.directory = directory
        self.device_logs = device_logs

    def collect(self) -> Iterable[Metric]:
        state = self.state()
        yield from self._fleet(state)
        yield from self._learning(state)
        yield from self._nodes(state)
        yield from self._node_health(state)
        yield from self._bridges(state)
        yield from self._broker()
        if self.directory is not None:
            yield from directory_metrics(self.directory())
        if self.device_logs is not None:
            yield from device_log_metrics(self.device_logs)

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
            yield _one(CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=[JOB_LABEL]), job, value)
        rejected = CounterMetricFamily(f"{PREFIX}_rejected_frames", "Frames the agents rejected",
                                       labels=[JOB_LABEL, "reason"])
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
            yield _one(GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=[JOB_LABEL]), job, reading)

    def _nodes(self, s: FleetState) -> Iterable[Metric]:
        labels = [JOB_LABEL, "node"]
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
        dp = GaugeMetricFamily(f"{PREFIX}_node_dp_epsilon", "The epsilon the node's data has spent, as it last "
                               "reported (differential privacy)", labels=labels)
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
            if n.dp_epsilon is not None:
                dp.add_metric(key, n.dp_epsilon)
            for reason, count in sorted(n.rejected.items()):
                rejected.add_metric([*key, reason], count)
        yield from (online, last, loss, sent, received, reroutes, restarts, rss, cpu, dp, rejected)

    def _node_health(self, s: FleetState) -> Iterable[Metric]:
        """Each node's learning, its link troubles and faults, its round times."""
        labels = [JOB_LABEL, "node"]
        accuracy = GaugeMetricFamily(f"{PREFIX}_node_accuracy", "The node's latest test accuracy (0-1)",
                                     labels=labels)
        timeouts = CounterMetricFamily(f"{PREFIX}_node_timeouts", "Link timeouts the node reported", labels=labels)
        pulls = CounterMetricFamily(f"{PREFIX}_node_pulls", "Chunks the node pulled from a peer", labels=labels)
        state_pulls = CounterMetricFamily(f"{PREFIX}_node_state_pulls",
                                          "Times the node asked a peer for the model's state", labels=labels)
        faults = CounterMetricFamily(f"{PREFIX}_node_faults", "Incidents that touched the node, by kind "
                                     "(injected, the operator's, or seen by the fleet)", labels=[*labels, "kind"])
        state = GaugeMetricFamily(f"{PREFIX}_node_state", "1 for the node's state as the page shows it",
                                  labels=[*labels, "state"])
        times = HistogramMetricFamily(f"{PREFIX}_node_round_seconds", "The node's round times (every report)",
                                      labels=labels)
        touched = _faults_by_node(s)
        for n in sorted(s.nodes.values(), key=lambda n: n.node):
            key = [self.job, str(n.node)]
            if n.accuracy is not None:
                accuracy.add_metric(key, n.accuracy)
            timeouts.add_metric(key, n.timeouts)
            pulls.add_metric(key, n.pulls)
            state_pulls.add_metric(key, n.state_pulls)
            for kind, count in sorted(touched.get(n.node, Counter()).items()):
                faults.add_metric([*key, kind], count)
            state.add_metric([*key, n.display], 1)
            times.add_metric(key, _histogram_buckets(n.round_times), n.round_times.total)
        yield from (accuracy, timeouts, pulls, state_pulls, faults, state, times)

    def _learning(self, s: FleetState) -> Iterable[Metric]:
        """The fleet's loss and accuracy: the mean of the nodes' in the latest round that has one."""
        for name, doc, pick in (
            ("fleet_loss", "The fleet's training loss (mean of the nodes' in the latest round with one)",
             lambda r: r.loss),
            ("fleet_accuracy", "The fleet's test accuracy, 0-1 (mean of the nodes' in the latest round with one)",
             lambda r: r.accuracy),
        ):
            family = GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=[JOB_LABEL])
            reading = next((v for r in sorted(s.rounds, reverse=True) if (v := pick(s.rounds[r])) is not None), None)
            if reading is not None:
                family.add_metric([self.job], reading)
            yield family

    def _broker(self) -> Iterable[Metric]:
        """The dashboard's own broker connection (no sample without a broker: a replay)."""
        link = self.broker() if self.broker is not None else None
        connected = GaugeMetricFamily(f"{PREFIX}_dashboard_broker_connected",
                                      "1 while the dashboard is connected to the fleet's broker", labels=[JOB_LABEL])
        connects = CounterMetricFamily(f"{PREFIX}_dashboard_broker_connects",
                                       "Times the dashboard (re)connected to the broker", labels=[JOB_LABEL])
        if link is not None and link.url:
            connected.add_metric([self.job], int(link.connected))
            connects.add_metric([self.job], link.connects)
        yield from (connected, connects)


    def _bridges(self, s: FleetState) -> Iterable[Metric]:
        """Each site's bridge to the core (a fleet without sites: no samples)."""
        labels = [JOB_LABEL, "site"]
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


def directory_metrics(d: Directory) -> Iterable[Metric]:
    """The devices and jobs the broker retains: each device's state, each job's executions."""
    device_state = GaugeMetricFamily(f"{PREFIX}_device_state", "1 for the state the device's record says "
                                     "(idle, training, offline)", labels=["device", "state"])
    heard = GaugeMetricFamily(f"{PREFIX}_device_last_seen", "Unix time the device says it made its record",
                              labels=["device"])
    execs = GaugeMetricFamily(f"{PREFIX}_job_executions", "A job's device executions by state",
                              labels=[JOB_LABEL, "state"])
    job_round = GaugeMetricFamily(f"{PREFIX}_job_round", "The highest round a job's devices reported",
                                  labels=[JOB_LABEL])
    job_accuracy = GaugeMetricFamily(f"{PREFIX}_job_accuracy", "A job's accuracy (its result's, else the "
                                     "latest reported), 0-1", labels=[JOB_LABEL])
    for name, entry in sorted(d.devices.items()):
        device_state.add_metric([name, str(entry.record.state)], 1)
        heard.add_metric([name], entry.record.last_seen)
    for name, job in sorted(d.jobs.items()):
        for state, count in sorted(Counter(str(e.state) for e in job.execs.values()).items()):
            execs.add_metric([name, state], count)
        if job.round is not None:
            job_round.add_metric([name], job.round)
        if job.accuracy is not None:
            job_accuracy.add_metric([name], job.accuracy)
    yield from (device_state, heard, execs, job_round, job_accuracy)


def device_log_metrics(book: DeviceLogBook) -> Iterable[Metric]:
    """The devices' warnings and errors heard (edgegrove/devices/<device>/log), by level, and
    the lines the devices said their rate limit dropped."""
    lines = CounterMetricFamily(f"{PREFIX}_device_log_lines", "Warning-or-worse log lines a device sent",
                                labels=["device", "level"])
    dropped = CounterMetricFamily(f"{PREFIX}_device_log_dropped", "Log lines a device's rate limit dropped",
                                  labels=["device"])
    for (device, level), count in sorted(book.heard.items()):
        lines.add_metric([device, level.name.lower()], count)
    for device, count in sorted(book.dropped.items()):
        dropped.add_metric([device], count)
    yield from (lines, dropped)


def _faults_by_node(s: FleetState) -> dict[int, Counter[str]]:
    touched: dict[int, Counter[str]] = {}
    for incident in s.incidents:
        for node in incident.targets:
            touched.setdefault(node, Counter())[str(incident.kind)] += 1
    return touched


def _histogram_buckets(times: RoundTimes) -> list[tuple[str, float]]:
    """Cumulative counts per upper bound, +Inf last (what HistogramMetricFamily takes)."""
    bounds = [*(str(b) for b in ROUND_TIME_BUCKETS), "+Inf"]
    running, out = 0, []
    for bound, count in zip(bounds, times.buckets, strict=True):
        running += count
        out.append((bound, float(running)))
    return out


def _one(metric: CounterMetricFamily | GaugeMetricFamily, labels: list[str], value: float
         ) -> Metric:
    metric.add_metric(labels, value)
    return metric


def fleet_registry(state: Callable[[], FleetState], job: str,
                   broker: Callable[[], BrokerLink] | None = None,
                   directory: Callable[[], Directory] | None = None,
                   device_logs: DeviceLogBook | None = None) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector(state, job, broker, directory, device_logs))
    return registry
