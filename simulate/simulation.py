"""One simulation run, from its stage to its report: the conductor of the parts that each do
one thing (simulate.stage: broker, network, dashboard; simulate.agent_launch: each node's
command; simulate.device_run: the fleet as devices and a job; simulate.fault_schedule: the
faults; simulate.progress: what the person sees). Ctrl-C sets ``stop_event``: every process
the run started is stopped, by handle, and the report is still written."""

from __future__ import annotations

import json
import secrets
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.protocol.messages import Control
from agent.protocol.topics import Topics
from agent.runtime import REFUSED_EXIT
from simulate import sites_sim
from simulate.agent_launch import AgentLaunch
from simulate.fault_schedule import FaultSchedule
from simulate.fleet import AgentSpec, Fleet
from simulate.injector import Injector, plan_mechanisms
from simulate.model_choice import ModelChoice
from simulate.progress import RoundBar, say
from simulate.scenario import Scenario
from simulate.stage import BrokerSetup, BrokerWish, Network, Stage
from simulate.telemetry import Collector, EventLog, FleetWatch

if TYPE_CHECKING:
    from dashboard.server import DashboardHandle
    from simulate.device_run import DevicePlan, DeviceRun


def fresh_job_name() -> str:
    return f"sim-{datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


@dataclass
class Simulation:
    scenario: Scenario
    run_dir: Path
    broker_choice: str = "auto"
    credentials: Path | None = None
    dashboard: bool = True
    dashboard_port: int = 8080
    dashboard_host: str = "127.0.0.1"
    baseline: bool = True
    ready_timeout: float = 180.0
    stall_timeout: float = 90.0
    stop_event: threading.Event = field(default_factory=threading.Event)
    job: str = ""
    persistence: bool = True
    model: ModelChoice = field(default_factory=ModelChoice)
    tls: bool = False  # the own mosquitto with TLS (and dynamic security)
    sites: sites_sim.SitesOptions | None = None  # bridged site brokers (simulate --sites)
    devices: DevicePlan | None = None  # the fleet as devices and a job (simulate --via-devices)

    def __post_init__(self) -> None:
        self.job = self.job or fresh_job_name()
        self.topics = Topics(self.job)
        self.watch = FleetWatch()
        self.log: EventLog | None = None
        self.stage: Stage | None = None
        self.faults: FaultSchedule | None = None
        self.fleet: Fleet | None = None
        self.injector: Injector | None = None
        self.collector: Collector | None = None
        self.uplinks: sites_sim.UplinkLog | None = None
        self.halted = False
        self.refused: set[int] = set()  # agents the fleet refused (another model)
        self.device_run: DeviceRun | None = None

    @property
    def dashboard_url(self) -> str | None:
        return self.stage.dashboard_url if self.stage is not None else None

    @property
    def dashboard_handle(self) -> DashboardHandle | None:
        return self.stage.dashboard_handle if self.stage is not None else None

    # -- the run --------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        config = self._config()
        (self.run_dir / "config.json").write_text(json.dumps(config, indent=2, default=str) + "\n")
        self.log = EventLog(self.run_dir / "events.jsonl")
        started = time.monotonic()
        self.log.add("run", phase="start", job=self.job, scenario=self.scenario.name)
        error: str | None = None
        with ExitStack() as stack:
            try:
                self._start(stack)
                self._loop()
                if self.device_run is not None and not self.stop_event.is_set():
                    self.device_run.fetch_model()
            except (OSError, RuntimeError, ConnectionError, KeyError) as exc:
                error = f"{type(exc).__name__}: {exc}"
                say(f"simulate: stopping: {error}")
            finally:
                # Before the agents go: the dashboard shows their exits as the run's end.
                self.log.add("run", phase="stopping", replay=self.replay_command())
                self._stop_fleet()
        rejected = dict(self.collector.rejected) if self.collector is not None else {}
        self.log.add("run", phase="end", wall_time_s=round(time.monotonic() - started, 3),
                     halted=self.halted, interrupted=self.stop_event.is_set(), error=error,
                     collector_rejected=rejected)
        self.log.close()
        return self._report(config, error)

    def replay_command(self) -> str:
        return f"edgegrove dashboard --replay {self.run_dir}"

    def _config(self) -> dict[str, Any]:
        return {"job": self.job, "broker": self.broker_choice, "scenario": self.scenario.model_dump(mode="json"),
                "dashboard": self.dashboard, "argv": sys.argv, "model": asdict(self.model),
                "fleet": "devices" if self.devices is not None else "agents"}

    def _start(self, stack: ExitStack) -> None:
        assert self.log is not None
        stage = self.stage = Stage(self.run_dir, self.job, self.scenario, self.log)
        broker = stage.start_broker(stack, BrokerWish(
            self.broker_choice, self.credentials, self.persistence, self.tls, self.sites,
            self.devices.names if self.devices else ()))
        if stage.site_brokers is not None:
            self.uplinks = sites_sim.UplinkLog(stage.site_brokers, self.log)
        plans = plan_mechanisms(self.scenario.faults, broker.revoker is not None,
                                broker.restartable is not None, stage.site_brokers)
        self.faults = FaultSchedule(list(self.scenario.faults), plans, self.log, self.watch)
        user, password = broker.admin or (None, None)
        self.collector = Collector(broker.url, self.topics, self.log, self.watch, user, password,
                                   on_control=self._obey, ca_file=broker.ca_file)
        self.collector.start()
        stack.callback(self.collector.stop)
        network = stage.start_network(stack, broker.url, plans)
        if self.dashboard:
            stage.start_dashboard(stack, broker, self.dashboard_host, self.dashboard_port)
        log = self.log
        self.fleet = Fleet(self._specs(stack, broker, network),
                           on_event=lambda kind, data: log.add("process", event=kind, **data))
        self.injector = Injector(self.fleet, self.collector.publish_control, self.log.add,
                                 broker.revoker, network.proxies, network.namespaces, broker.restartable,
                                 stage.site_brokers)
        stack.callback(self.injector.close)  # before the broker stops: no start after its stop
        self.fleet.start_all()
        if self.device_run is not None:
            self.device_run.submit_when_up(self.ready_timeout, self.stop_event.is_set,
                                           lambda: self._raise_on_failed_start("device"))
        self._await_ready()

    def _specs(self, stack: ExitStack, broker: BrokerSetup, network: Network) -> list[AgentSpec]:
        """Each node's process: an agent, or (--via-devices) a device given the agent's address."""
        assert self.stage is not None and self.log is not None
        launch = AgentLaunch(self.scenario, self.job, self.model, self.run_dir, self.stage.site_brokers,
                             self.sites.site_aware if self.sites is not None else True)
        if self.devices is None:
            return launch.specs(broker.url, broker.credentials, network, broker.ca_file)
        from simulate.device_run import DeviceRun

        self.device_run = DeviceRun(self.devices, self.run_dir, self.job, self.scenario, self.model,
                                    self.log, self.watch)
        base = launch.specs(broker.url, None, network, broker.ca_file)
        return self.device_run.prepare(stack, broker, self.stage.mosquitto, base)

    def _raise_on_failed_start(self, what: str) -> None:
        assert self.fleet is not None
        failed = [(node, code) for node, code in self._poll_exits() if code != 0]
        if failed:
            node, code = failed[0]
            log = self.fleet.agents[node].spec.log_path
            raise RuntimeError(f"{what} {node} exited with code {code} while starting:\n"
                               f"{_tail(log)}\n(full log: {log})")

    def _await_ready(self) -> None:
        assert self.fleet is not None and self.log is not None
        n = self.scenario.fleet.nodes
        say(f"simulate: waiting for {n} agents to come online (job {self.job})")
        deadline = time.monotonic() + self.ready_timeout
        while not self.stop_event.is_set():
            if self.watch.wait_for(lambda: len(self.watch.online()) >= n - len(self.refused)
                                   or self.watch.fleet_round > 0 or self.stop_event.is_set(), 1.0):
                break
            self._raise_on_failed_start("agent")
            if time.monotonic() > deadline:
                online = sorted(self.watch.online())
                raise RuntimeError(f"only {len(online)} of {n} agents came online within "
                                   f"{self.ready_timeout:.0f} s ({online}); see {self.run_dir / 'agents'}")
        if not self.stop_event.is_set():
            self.log.add("run", phase="ready", online=sorted(self.watch.online()))

    def _poll_exits(self) -> list[tuple[int, int]]:
        """The fleet's exits; an agent the fleet refused (another model) is said and left out."""
        assert self.fleet is not None
        exits = []
        if self.device_run is not None:
            self.device_run.confirm_submit()
            for node in self.device_run.refused_nodes() - self.refused:
                self.refused.add(node)
                say(f"simulate: device {self.device_run.plan.names[node]} rejected the job "
                    f"(see devices.json)")
        for node, code in self.fleet.poll_exits():
            if code == REFUSED_EXIT:
                self.refused.add(node)
                say(f"simulate: agent {node} was refused: its model is not the fleet's "
                    f"(see agents/agent-{node}.log)")
            else:
                exits.append((node, code))
        return exits

    def _loop(self) -> None:
        assert self.fleet is not None and self.faults is not None and self.injector is not None
        rounds = self.scenario.fleet.rounds
        bar = RoundBar(rounds)
        try:
            while not self.stop_event.is_set():
                fleet_round = self.watch.fleet_round
                if self.uplinks is not None:
                    self.uplinks.sample(fleet_round)
                self.faults.fire(fleet_round, self.injector)
                bar.show(self.watch, fleet_round, self.faults.injected, len(self.faults.slots))
                for node, code in self._poll_exits():
                    if code != 0:
                        say(f"simulate: agent {node} exited with code {code}; see agents/agent-{node}.log")
                if self._finished():
                    if self.watch.fleet_round < rounds:
                        raise RuntimeError(
                            f"every agent exited by round {self.watch.fleet_round} of {rounds}; "
                            f"see {self.run_dir / 'agents'}")
                    break
                if time.monotonic() - self.watch.last_telemetry_at > self.stall_timeout:
                    self.halted = True
                    say(f"simulate: no telemetry for {self.stall_timeout:.0f} s: the fleet halted")
                    break
                self.watch.wait_for(lambda r=fleet_round: self.watch.fleet_round != r  # type: ignore[misc]
                                    or self.stop_event.is_set(), self.faults.next_wait())
        finally:
            bar.close()

    def _finished(self) -> bool:
        assert self.fleet is not None and self.faults is not None
        rounds = self.scenario.fleet.rounds
        if self.device_run is not None:
            if not self.device_run.finished(self.fleet, self.watch.fleet_round >= rounds):
                return False
            # The last telemetry may come after the end of the executions (another connection).
            self.watch.wait_for(lambda: self.watch.fleet_round >= rounds, 5.0)
            return True
        if self.fleet.running_nodes():
            hung = [n for n in self.fleet.running_nodes() if self.fleet.agents[n].stopped]
            done = self.watch.fleet_round >= rounds
            return done and len(hung) == len(self.fleet.running_nodes())
        return not self.faults.restart_pending(rounds) or self.watch.fleet_round >= rounds

    def _obey(self, control: Control) -> None:
        """A Control from the dashboard: crash/restart/hang/resume are ours to carry out."""
        if self.injector is None or self.log is None:
            return
        try:
            outcome = self.injector.obey(control)
        except (OSError, RuntimeError) as exc:
            outcome = f"failed: {exc}"
        self.log.add("dashboard_control", action=control.action, node=control.node, peer=control.peer,
                     applied=not outcome.startswith(("ignored", "failed")), outcome=outcome)

    def _stop_fleet(self) -> None:
        if self.device_run is not None:
            self.device_run.stop_submit()
        if self.fleet is None:
            return
        forced = self.fleet.stop_all(grace=10.0)
        if forced and self.log is not None:
            self.log.add("process", event="forced_kill", pids=forced)

    def _report(self, config: dict[str, Any], error: str | None) -> dict[str, Any]:
        from simulate import report

        assert self.log is not None
        records = self.log.snapshot()
        baseline = None
        if self.baseline and not self.stop_event.is_set():
            baseline = single_machine_baseline(self.scenario, self.model, self.run_dir)
        summary = report.write_report(self.run_dir, records, config, baseline)
        if self.device_run is not None:
            summary["via_devices"] = self.device_run.summary()
            with open(self.run_dir / "report.md", "a") as md:
                md.write(report.model_section(summary["via_devices"], self.job))
        summary["run_dir"] = str(self.run_dir)
        summary["dashboard_url"] = self.dashboard_url
        summary["error"] = error
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary


def single_machine_baseline(scenario: Scenario, model: ModelChoice, run_dir: Path) -> dict[str, Any] | None:
    """Single-machine training with the fleet's samples per step (cached), for the report."""
    from simulate.baseline import baseline_params, single_machine

    fleet = scenario.fleet
    if not model.is_thesis_setup:
        say("simulate: no single-machine baseline: it reproduces the thesis MLP on MNIST only")
        return None
    say("simulate: single-machine baseline (same samples per step; cached after the first run)")
    try:
        result = single_machine(baseline_params(scenario.agent, fleet.nodes, fleet.rounds))
    except Exception as exc:  # a baseline problem must not lose the run's report
        say(f"simulate: no baseline: {exc}")
        return None
    (run_dir / "baseline.json").write_text(json.dumps(result) + "\n")
    return result


def _tail(path: Path, lines: int = 6) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
