"""`edgegrove simulate`: a broker, the dashboard and a fleet on this machine, the faults of a
scenario, and a report. The fleet is one `edgegrove device` process per node, given the
scenario as one job through `edgegrove job submit`, and the trained model comes back into the
run directory through `edgegrove job fetch` (simulate.device_run); a run that a job cannot
carry (--sites, --backend mixed, --credentials), or --via-agents, runs one agent per node.

The scenario is validated before anything starts (a bad one exits with code 2). Readiness is
awaited by signals: the broker's port, every agent's retained `online` status. Faults fire when
the fleet enters their round (telemetry tells which round that is). Ctrl-C stops every process
the simulator started — by handle — and the report is still written. Progress goes to stderr;
with --json the summary is the one JSON document on stdout.
"""

from __future__ import annotations

import argparse
import json
import secrets
import signal
import sys
import threading
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from agent.protocol.messages import Control
from agent.protocol.topics import Topics
from agent.runtime import REFUSED_EXIT
from agent.validate import UsageError, one_line
from simulate import model_choice, periodic_args, sites_sim
from simulate.fleet import AgentSpec, Fleet
from simulate.injector import (
    Injector,
    LinkRevoker,
    NetNamespace,
    Plan,
    Restartable,
    free_slot,
    namespaced_nodes,
    plan_mechanisms,
    proxied_nodes,
    slots_reserved,
)
from simulate.logins import credentials_options, dashboard_login
from simulate.model_choice import ModelChoice
from simulate.proxy import TcpProxy
from simulate.scenario import (
    RESERVED_AGENT_OPTIONS,
    BandwidthFault,
    IsolateFault,
    Scenario,
    ScenarioError,
    builtin_names,
    load_scenario,
)
from simulate.telemetry import Collector, EventLog, FleetWatch
from simulate.validate import check_args, check_credentials, choose_job

if TYPE_CHECKING:
    from dashboard.server import DashboardHandle
    from simulate.brokers import Credentials, MosquittoBroker
    from simulate.device_run import DevicePlan, DeviceRun, Login
    from simulate.site_brokers import SiteBrokers

DESCRIPTION = __doc__
EXIT_OK, EXIT_HALTED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
UPLINK_SAMPLE_S = 1.0  # s: the uplinks' bytes and cuts logged at least this often


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", default=None,
                        help=f"scenario: a .toml file or a built-in name ({', '.join(builtin_names())}); "
                             "default: 'default'")
    parser.add_argument("--nodes", type=int, default=None,
                        help="agents in the fleet (overrides the scenario's; scenario default 7)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds to train, 1 or more (overrides the scenario's); a simulation "
                             "always ends, to write its report: 0 is refused")
    parser.add_argument("--broker", default="auto",
                        help="auto (mosquitto from broker-config/ if installed, else embedded), "
                             "mosquitto, embedded, or mqtt://HOST:PORT of a running broker")
    parser.add_argument("--credentials", type=Path, default=None,
                        help="with --broker mqtt://...: credentials.json from broker-config/make-credentials")
    parser.add_argument("--job", default=None,
                        help="job name (topics edgegrove/JOB); default: the job of --credentials, "
                             "else a new sim-<timestamp> name")
    parser.add_argument("--tls", action="store_true",
                        help="the simulator's own mosquitto with TLS and dynamic security: a "
                             "throw-away CA (in the run directory) signs its certificate, and the "
                             "agents, the dashboard and the telemetry collector verify it with that "
                             "CA (mqtts://). Needs mosquitto (--broker auto or mosquitto); not with "
                             "faults that shape links in network namespaces")
    parser.add_argument("--no-persistence", action="store_true",
                        help="the simulator's own mosquitto without persistence (a broker restart "
                             "then forgets the retained statuses and view)")
    parser.add_argument("--out", type=Path, default=None, help="run directory (default: runs/<timestamp>)")
    parser.add_argument("--no-dashboard", action="store_true", help="do not start the dashboard")
    parser.add_argument("--dashboard-port", type=int, default=8080,
                        help="dashboard port on 127.0.0.1 (0 = any free port)")
    parser.add_argument("--dashboard-host", default="127.0.0.1",
                        help="address the dashboard binds to (0.0.0.0 inside a container)")
    parser.add_argument("--agent-option", action="append", default=[], metavar="KEY=VALUE",
                        help="override one agent option for every agent, e.g. eval_samples=1000 "
                             "(repeatable; keys as in `edgegrove agent --help`, with underscores)")
    parser.add_argument("--baseline", choices=["auto", "none"], default="auto",
                        help="auto: compare with single-machine training (same samples/step, cached)")
    parser.add_argument("--ready-timeout", type=float, default=180.0,
                        help="seconds to wait for every agent's online status")
    parser.add_argument("--stall-timeout", type=float, default=90.0,
                        help="seconds without any telemetry after which the run counts as halted")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON document on stdout")
    _add_fleet_path_arguments(parser)
    model_choice.add_arguments(parser)
    periodic_args.add_arguments(parser)
    sites_sim.add_arguments(parser)


def _add_fleet_path_arguments(parser: argparse.ArgumentParser) -> None:
    via = parser.add_mutually_exclusive_group()
    via.add_argument("--via-devices", action="store_true",
                     help="the fleet as devices (`edgegrove device`, one process per node, each with "
                          "its own config and credentials) and the training as a job submitted with "
                          "`edgegrove job submit`; the trained model is fetched into the run directory "
                          "(model/). The default whenever the run allows it; with this flag, a run that "
                          "does not (--sites, --backend mixed, --credentials, an option a job cannot "
                          "set) is refused instead of run through agents")
    via.add_argument("--via-agents", action="store_true",
                     help="the fleet as one `edgegrove agent` process per node, each told the job's "
                          "settings on its command line (the way before devices and jobs)")


def parse_agent_options(items: list[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ScenarioError(f"--agent-option {item!r}: write KEY=VALUE, e.g. eval_samples=1000")
        if key in RESERVED_AGENT_OPTIONS:
            raise ScenarioError(f"--agent-option {key}: the simulator sets it itself")
        options[key] = _literal(value.strip())
    return options


def _literal(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def check_model_options(scenario: Scenario, model: ModelChoice) -> None:
    """Every agent's options as it will run (one numpy and one LiteRT agent of a mixed fleet)
    pass the agent's own configuration checks."""
    from simulate.scenario import _check_agent_options

    agent = {k: v for k, v in scenario.agent.items() if k not in model_choice.MODEL_OPTIONS}
    for node in sorted({0, min(1, scenario.fleet.nodes - 1)}):
        _check_agent_options({**agent, **model.agent_options(node)}, "--model/--dataset/--partition",
                             scenario.fleet.rounds)


def check_broker_choice(choice: str) -> str:
    if choice in ("auto", "mosquitto", "embedded") or choice.startswith(("mqtt://", "mqtts://")):
        return choice
    raise ScenarioError(f"--broker {choice!r}: use auto, mosquitto, embedded or mqtt://HOST:PORT")


def check_tls(tls: bool, choice: str, faults: Sequence[object]) -> None:
    """--tls sets up the simulator's own mosquitto: not the embedded broker nor one the user
    runs; and its certificate names 127.0.0.1 and localhost, not a network namespace's address."""
    if not tls:
        return
    from simulate import brokers

    if choice == "embedded" or choice.startswith(("mqtt://", "mqtts://")):
        raise ScenarioError(f"--tls is for the simulator's own mosquitto, not --broker {choice}")
    if any(isinstance(f, IsolateFault) or (isinstance(f, BandwidthFault) and f.via == "kernel") for f in faults):
        raise ScenarioError("--tls cannot run faults that put agents in network namespaces (isolate, "
                            "bandwidth via kernel): run that scenario without --tls")
    if not brokers.mosquitto_available():
        raise ScenarioError("--tls needs mosquitto, which is not installed")


def fresh_job_name() -> str:
    return f"sim-{datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


@dataclass(frozen=True)
class BrokerSetup:
    """The broker a run talks to, and what the simulator may do to it."""

    url: str
    credentials: Path | None  # credentials.json for the agents (None: no authentication)
    admin: tuple[str, str] | None  # user name and password with rights on the whole job
    revoker: LinkRevoker | None = None  # cuts links at the broker
    restartable: Restartable | None = None  # the simulator's own broker
    ca_file: str | None = None  # TLS: the CA that signed the broker's certificate


@dataclass
class FaultSlot:
    index: int
    fault: Any
    plan: Plan
    state: str = "pending"  # pending | armed (mid phase) | active | done | skipped
    fire_at: float | None = None


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
        self.fleet: Fleet | None = None
        self.injector: Injector | None = None
        self.collector: Collector | None = None
        self.dashboard_url: str | None = None
        self.dashboard_handle: DashboardHandle | None = None
        self.halted = False
        self.refused: set[int] = set()  # agents the fleet refused (another model)
        self.site_brokers: SiteBrokers | None = None
        self.device_run: DeviceRun | None = None
        self._operator_login: Login | None = None
        self._mosquitto: MosquittoBroker | None = None  # the simulator's own, when it is one
        self._uplinks_round, self._uplinks_at = -1, 0.0  # the last uplinks record logged

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
                    self._fetch_model()
            except (OSError, RuntimeError, ConnectionError, KeyError) as exc:
                error = f"{type(exc).__name__}: {exc}"
                _say(f"simulate: stopping: {error}")
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
        scenario = self.scenario
        broker = self._start_broker(stack)
        url, creds_file, admin = broker.url, broker.credentials, broker.admin
        plans = plan_mechanisms(scenario.faults, broker.revoker is not None,
                                broker.restartable is not None, self.site_brokers)
        self.slots = [FaultSlot(i, f, p) for i, (f, p) in enumerate(zip(scenario.faults, plans, strict=True))]
        for slot in self.slots:
            self.log.add("fault", action="plan", index=slot.index, kind=slot.fault.kind,
                         description=slot.fault.describe(), mechanism=slot.plan.mechanism,
                         targets=list(slot.fault.targets))
            if slot.plan.skip:
                slot.state = "skipped"
                self.log.add("fault", action="skip", index=slot.index, kind=slot.fault.kind, detail=slot.plan.skip)
                _say(f"simulate: skipping fault {slot.index} ({slot.fault.describe()}): {slot.plan.skip}")
        user, password = admin or (None, None)
        self.collector = Collector(url, self.topics, self.log, self.watch, user, password,
                                   on_control=self._obey, ca_file=broker.ca_file)
        self.collector.start()
        stack.callback(self.collector.stop)
        proxies, namespaces = self._start_network(stack, url, plans)
        self._start_dashboard(stack, url, creds_file, broker.ca_file)
        log = self.log
        if self.devices is not None:
            specs = self._device_specs(stack, broker, proxies, namespaces)
        else:
            specs = self._specs(url, creds_file, proxies, namespaces, broker.ca_file)
        self.fleet = Fleet(specs, on_event=lambda kind, data: log.add("process", event=kind, **data))
        self.injector = Injector(self.fleet, self.collector.publish_control, self.log.add,
                                 broker.revoker, proxies, namespaces, broker.restartable,
                                 self.site_brokers)
        stack.callback(self.injector.close)  # before the broker stops: no start after its stop
        self.fleet.start_all()
        if self.device_run is not None:
            self._submit_job()
        self._await_ready()

    def _start_broker(self, stack: ExitStack) -> BrokerSetup:
        from simulate import brokers

        choice = self.broker_choice
        if choice == "auto":
            choice = "mosquitto" if brokers.mosquitto_available() else "embedded"
            if choice == "embedded":
                _say("simulate: mosquitto is not installed: using the embedded broker (rumqttd); "
                     "link cuts become agent-side drops")
        assert self.log is not None
        if self.sites is not None:
            sites = self.site_brokers = sites_sim.start(self.run_dir, self.job, self.scenario.fleet.nodes,
                                                        self.sites, self.persistence)
            stack.callback(sites.stop)
            log = self.log
            stack.callback(lambda: log.add("uplinks", **sites.uplinks_record()))  # before the stop
            stack.callback(lambda: sites.write_uplink_trace(self.run_dir / "uplink-trace.json"))
            creds = sites.admin_credentials
            self.log.add("broker", kind="mosquitto-sites", url=sites.core.url, pid=sites.core.pid,
                         sites={n: b.url for n, b in sites.sites.items()})
            return BrokerSetup(sites.core.url, sites.credentials_path, (creds.username, creds.password))
        if choice == "mosquitto":
            mosq = brokers.start_mosquitto(self.run_dir / "broker", job=self.job,
                                           nodes=self.scenario.fleet.nodes, dynsec=True,
                                           persistence=self.persistence, tls=self.tls,
                                           devices=self.devices.names if self.devices else ())
            stack.callback(mosq.stop)
            self._mosquitto = mosq
            creds = mosq.admin_credentials
            self.log.add("broker", kind="mosquitto", url=mosq.url, pid=mosq.pid,
                         persistence=self.persistence, tls=self.tls)
            return BrokerSetup(mosq.url, mosq.credentials_path, (creds.username, creds.password),
                               revoker=mosq, restartable=mosq, ca_file=mosq.ca_file)
        if choice == "embedded":
            embedded = brokers.start_embedded(log_path=self.run_dir / "broker.log")
            stack.callback(embedded.stop)
            self.log.add("broker", kind="embedded", url=embedded.url, pid=embedded.pid)
            return BrokerSetup(embedded.url, None, None)
        return self._external_broker(stack, choice)

    def _external_broker(self, stack: ExitStack, url: str) -> BrokerSetup:
        """A broker the user runs: with credentials, its dynamic security (if it answers the
        admin) cuts links; else the agents drop frames themselves."""
        from simulate import brokers

        assert self.log is not None
        self.log.add("broker", kind="external", url=url)
        if self.credentials is None:
            return BrokerSetup(url, None, None)
        table = json.loads(self.credentials.read_text())
        admin = brokers.Credentials(table["admin"]["username"], table["admin"]["password"])
        dynsec = brokers.DynsecAdmin(url, admin, self.topics.prefix)
        problem = dynsec.probe()
        if problem:
            _say(f"simulate: the broker's dynamic security does not answer the admin ({problem}); "
                 "link cuts become agent-side drops")
            return BrokerSetup(url, self.credentials, (admin.username, admin.password))
        stack.callback(dynsec.close)
        _say("simulate: link cuts through the broker's dynamic security (admin of --credentials)")
        return BrokerSetup(url, self.credentials, (admin.username, admin.password), revoker=dynsec)

    def _start_network(self, stack: ExitStack, url: str, plans: list[Plan]
                       ) -> tuple[dict[int, TcpProxy], dict[int, NetNamespace]]:
        from dashboard.settings import parse_broker_url

        address = parse_broker_url(url)
        faults = self.scenario.faults
        proxied = proxied_nodes(faults, plans)
        proxies: dict[int, TcpProxy] = {}
        namespaces: dict[int, NetNamespace] = {}
        tag = secrets.token_hex(2)
        namespaced = namespaced_nodes(faults, plans)
        with slots_reserved() as taken:
            for node in sorted(namespaced):
                slot = free_slot((node % 200) + 1, taken)
                taken.add(slot)
                ns = NetNamespace(f"eg{tag}n{node}", slot=slot)
                stack.callback(ns.remove)
                ns.create()
                namespaces[node] = ns
        for node in sorted(namespaced):
            ns = namespaces[node]
            if node not in proxied:
                # Kernel shaping only: the agent reaches the broker through the kernel alone.
                if address.host not in ("127.0.0.1", "localhost"):
                    raise RuntimeError(f"limiting links in the kernel needs the simulator's own broker "
                                        f"on 127.0.0.1, not {address.host}")
                ns.forward(address.port, address.port)
        for node in sorted(proxied):
            listen = namespaces[node].host_ip if node in namespaces else "127.0.0.1"
            proxy = TcpProxy(address.host, address.port, listen_host=listen, name=f"proxy-{node}")
            proxy.start()
            stack.callback(proxy.stop)
            proxies[node] = proxy
        return proxies, namespaces

    def _start_dashboard(self, stack: ExitStack, url: str, creds_file: Path | None,
                         ca_file: str | None) -> None:
        if not self.dashboard:
            return
        try:
            from dashboard.server import run_in_thread
            from dashboard.settings import DashboardSettings
        except ImportError as exc:
            _say(f"simulate: the dashboard is not available ({exc}); install edgegrove[dashboard]")
            return
        login = dashboard_login(creds_file)  # never the admin: read-only, or that and control
        settings = DashboardSettings(
            broker_url=url, job=self.job, ca_file=Path(ca_file) if ca_file else None,
            username=login.username, password=login.password, host=self.dashboard_host,
            port=self.dashboard_port, control_token=login.token,
            event_log=self.run_dir / "dashboard-events.jsonl", fleet_size=self.scenario.fleet.nodes,
            total_rounds=self.scenario.fleet.rounds, run_dir=self.run_dir)
        handle = run_in_thread(settings)
        self.dashboard_handle = handle  # its last state stays readable after the run (tests)
        stack.callback(handle.stop)
        self.dashboard_url = handle.url
        assert self.log is not None
        self.log.listeners.append(handle.feed)  # faults, control outcomes, the run's end
        self.log.add("dashboard", url=handle.url)
        _say(f"simulate: dashboard at {handle.url}  {login.says()}")

    def _specs(self, url: str, creds_file: Path | None, proxies: dict[int, TcpProxy],
               namespaces: dict[int, NetNamespace], ca_file: str | None = None) -> list[AgentSpec]:
        from dashboard.settings import parse_broker_url

        fleet = self.scenario.fleet
        agent = {k: v for k, v in self.scenario.agent.items() if k not in model_choice.MODEL_OPTIONS}
        options: dict[str, Any] = {"job": self.job, "fleet_size": fleet.nodes, "rounds": fleet.rounds, **agent}
        own = credentials_options(creds_file, fleet.nodes, self.run_dir / "agents" / "credentials")  # its own only
        if ca_file is not None:
            options["tls_ca"] = ca_file
        address = parse_broker_url(url)
        scheme, broker_port = "mqtts" if address.tls else "mqtt", address.port
        specs = []
        for node in range(fleet.nodes):
            node_url = url
            if self.site_brokers is not None:
                node_url = self.site_brokers.url_for(node)
                if self.sites is not None and self.sites.site_aware:
                    options = {**options, "site": self.site_brokers.site_of(node)}
            if node in proxies:
                proxy = proxies[node]
                node_url = f"{scheme}://{proxy.listen[0]}:{proxy.port}"
            elif node in namespaces:  # the kernel forwards the host end's port to the broker
                node_url = f"{scheme}://{namespaces[node].host_ip}:{broker_port}"
            prefix = namespaces[node].prefix() if node in namespaces else ()
            if self.site_brokers is not None:  # per-agent namespaces do not run with sites
                prefix = self.site_brokers.command_prefix(node)
            specs.append(AgentSpec(node, node_url, {**options, **own.get(node, {}), **self.model.agent_options(node)},
                                   self.run_dir / "checkpoints" / str(node),
                                   self.run_dir / "agents" / f"agent-{node}.log", prefix))
        return specs

    # -- through devices (--via-devices) ------------------------------------------------------

    def _device_specs(self, stack: ExitStack, broker: BrokerSetup, proxies: dict[int, TcpProxy],
                      namespaces: dict[int, NetNamespace]) -> list[AgentSpec]:
        """Device configs for the nodes (each with its agent's broker address: its proxy, its
        namespace); the simulator's ear on their records and executions."""
        from simulate.device_run import DeviceRun, Login

        assert self.devices is not None and self.log is not None
        user, password = broker.admin or (None, None)
        logins = {}
        if self._mosquitto is not None:  # each device its own user; link cuts in the job's roles
            from agent.operator.grants import role_name

            mosq = self._mosquitto
            user, password = mosq.operator_credentials.username, mosq.operator_credentials.password
            logins = {name: mosq.device_credentials(name) for name in self.devices.names}
            mosq.node_role = lambda node: role_name(self.job, node)
        login = self._operator_login = Login(broker.url, user, password, broker.ca_file)
        run = self.device_run = DeviceRun(self.devices, self.run_dir, self.job, self.scenario,
                                          self.model, self.log, self.watch)
        run.listen(stack, login)
        base = self._specs(broker.url, None, proxies, namespaces, broker.ca_file)
        return run.write_files(base, lambda name: _device_login(logins, name), broker.ca_file,
                               {"simulate": self.job})

    def _submit_job(self) -> None:
        """Once every device is up: the job, through `job submit`'s path."""
        assert self.device_run is not None and self._operator_login is not None
        n = self.scenario.fleet.nodes
        _say(f"simulate: waiting for {n} devices to publish their records")

        def check_exits() -> None:
            self._raise_on_failed_start("device")

        self.device_run.await_devices(self.ready_timeout, self.stop_event.is_set, check_exits)
        if self.stop_event.is_set():
            return
        grants = "auto" if self._operator_login.username is not None else "none"  # embedded: no ACLs
        self.device_run.start_submit(self._operator_login, grants)
        _say(f"simulate: submitting job {self.job} ({self.device_run.job_path})")

    def _check_submit(self, wait: float = 0.0) -> None:
        """`job submit`'s outcome, once it has one (RuntimeError: it failed or assigned the
        devices other node ids than the scenario's, which its faults name)."""
        assert self.device_run is not None
        assignments = self.device_run.check_submit(wait)
        if assignments is None:
            return
        expected = {name: node for node, name in enumerate(self.device_run.plan.names)}
        if assignments != expected:
            raise RuntimeError(f"job submit assigned {assignments}, not every device its node")
        _say(f"simulate: job {self.job} submitted to {len(assignments)} devices")

    def _fetch_model(self) -> None:
        assert self.device_run is not None and self._operator_login is not None
        self._check_submit(wait=30.0)
        try:
            fetched = self.device_run.fetch(self._operator_login)
        except Exception as exc:  # a failed fetch must not lose the run's report
            _say(f"simulate: the trained model could not be fetched: {one_line(str(exc))}")
            assert self.log is not None
            self.log.add("job", action="fetch_failed", job=self.job, error=one_line(str(exc)))
            return
        _say(f"simulate: trained model fetched into {fetched['dir']}: {', '.join(fetched['files'])}")

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
        _say(f"simulate: waiting for {n} agents to come online (job {self.job})")
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
            self._check_submit()
            for node in self.device_run.refused_nodes() - self.refused:
                self.refused.add(node)
                _say(f"simulate: device {self.device_run.plan.names[node]} rejected the job "
                     f"(see devices.json)")
        for node, code in self.fleet.poll_exits():
            if code == REFUSED_EXIT:
                self.refused.add(node)
                _say(f"simulate: agent {node} was refused: its model is not the fleet's "
                     f"(see agents/agent-{node}.log)")
            else:
                exits.append((node, code))
        return exits

    def _loop(self) -> None:
        assert self.fleet is not None and self.log is not None
        rounds = self.scenario.fleet.rounds
        bar = tqdm(total=rounds, desc="rounds", file=sys.stderr, unit="round", dynamic_ncols=True,
                   mininterval=0.5)
        try:
            while not self.stop_event.is_set():
                fleet_round = self.watch.fleet_round
                self._log_uplinks(fleet_round)
                self._fire_faults(fleet_round)
                self._progress(bar, fleet_round)
                for node, code in self._poll_exits():
                    if code != 0:
                        _say(f"simulate: agent {node} exited with code {code}; see agents/agent-{node}.log")
                if self._finished():
                    if self.watch.fleet_round < rounds:
                        raise RuntimeError(
                            f"every agent exited by round {self.watch.fleet_round} of {rounds}; "
                            f"see {self.run_dir / 'agents'}")
                    break
                if time.monotonic() - self.watch.last_telemetry_at > self.stall_timeout:
                    self.halted = True
                    _say(f"simulate: no telemetry for {self.stall_timeout:.0f} s: the fleet halted")
                    break
                self.watch.wait_for(lambda r=fleet_round: self.watch.fleet_round != r  # type: ignore[misc]
                                    or self.stop_event.is_set(), self._next_wait())
        finally:
            bar.close()

    def _log_uplinks(self, fleet_round: int) -> None:
        """Per round, what crossed the uplinks so far (`bench sites --real` reads it); between
        rounds at least every UPLINK_SAMPLE_S, without a round, so that the dashboard's rates
        and bridge states move on while the fleet waits (a cut site)."""
        sites, log = self.site_brokers, self.log
        if sites is None or log is None:
            return
        now = time.monotonic()
        if fleet_round != self._uplinks_round:
            log.add("uplinks", round=fleet_round, **sites.uplinks_record())
        elif now - self._uplinks_at >= UPLINK_SAMPLE_S:
            log.add("uplinks", **sites.uplinks_record())
        else:
            return
        self._uplinks_round, self._uplinks_at = fleet_round, now

    def _next_wait(self) -> float:
        armed = [s.fire_at for s in self.slots if s.state == "armed" and s.fire_at is not None]
        wait = 0.5
        if armed:
            wait = min(wait, max(0.0, min(armed) - time.monotonic()))
        return wait

    def _finished(self) -> bool:
        assert self.fleet is not None
        if self.device_run is not None:
            rounds = self.scenario.fleet.rounds
            if not self.device_run.finished(self.fleet, self.watch.fleet_round >= rounds):
                return False
            # The last telemetry may come after the end of the executions (another connection).
            self.watch.wait_for(lambda: self.watch.fleet_round >= rounds, 5.0)
            return True
        if self.fleet.running_nodes():
            hung = [n for n in self.fleet.running_nodes() if self.fleet.agents[n].stopped]
            done = self.watch.fleet_round >= self.scenario.fleet.rounds
            return done and len(hung) == len(self.fleet.running_nodes())
        pending_restart = any(s.state == "active" and s.fault.kind == "crash" and s.fault.end_round is not None
                              and s.fault.end_round < self.scenario.fleet.rounds for s in self.slots)
        return not pending_restart or self.watch.fleet_round >= self.scenario.fleet.rounds

    def _fire_faults(self, fleet_round: int) -> None:
        assert self.injector is not None and self.log is not None
        now = time.monotonic()
        for slot in self.slots:
            fault = slot.fault
            if slot.state == "pending" and fleet_round >= fault.at_round:
                if fault.phase == "mid":
                    median = self.watch.median_round_seconds() or 0.2
                    slot.state, slot.fire_at = "armed", now + 0.5 * median
                else:
                    self._apply(slot, fleet_round)
            if slot.state == "armed" and slot.fire_at is not None and now >= slot.fire_at:
                self._apply(slot, fleet_round)
            if slot.state == "active" and self.injector.finished(fault):
                slot.state = "done"
                self.log.add("fault", action="heal", index=slot.index, kind=fault.kind, round=fleet_round)
                _say(f"simulate: round {fleet_round}: fault {slot.index} is over ({fault.describe()})")
            end = fault.end_round
            if slot.state == "active" and end is not None and fleet_round >= end:
                self.injector.undo(fault, slot.plan)
                slot.state = "done"
                self.log.add("fault", action="heal", index=slot.index, kind=fault.kind, round=fleet_round)
                _say(f"simulate: round {fleet_round}: undone fault {slot.index} ({fault.describe()})")

    def _apply(self, slot: FaultSlot, fleet_round: int) -> None:
        assert self.injector is not None and self.log is not None
        try:
            self.injector.inject(slot.fault, slot.plan)
        except (OSError, RuntimeError, KeyError) as exc:
            slot.state = "skipped"
            self.log.add("fault", action="skip", index=slot.index, kind=slot.fault.kind, detail=str(exc))
            _say(f"simulate: fault {slot.index} could not be injected: {exc}")
            return
        slot.state = "active"
        self.log.add("fault", action="inject", index=slot.index, kind=slot.fault.kind, round=fleet_round,
                     description=slot.fault.describe(), mechanism=slot.plan.mechanism,
                     targets=list(slot.fault.targets))
        _say(f"simulate: round {fleet_round}: injected fault {slot.index} ({slot.fault.describe()}, "
             f"{slot.plan.mechanism})")

    def _progress(self, bar: Any, fleet_round: int) -> None:
        bar.n = min(fleet_round, bar.total)
        latest = list(self.watch.latest.values())
        losses = [t.loss for t in latest if t.loss is not None]
        accs = [(t.round, t.accuracy) for t in latest if t.accuracy is not None]
        injected = sum(1 for s in self.slots if s.state in ("active", "done"))
        bar.set_postfix(loss=f"{sum(losses) / len(losses):.3f}" if losses else "-",
                        acc=f"{max(accs)[1]:.3f}" if accs else "-",
                        faults=f"{injected}/{len(self.slots)}", refresh=False)
        bar.refresh()

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
            baseline = self._baseline()
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

    def _baseline(self) -> dict[str, Any] | None:
        from simulate.baseline import baseline_params, single_machine

        fleet = self.scenario.fleet
        if not self.model.is_thesis_setup:
            _say("simulate: no single-machine baseline: it reproduces the thesis MLP on MNIST only")
            return None
        _say("simulate: single-machine baseline (same samples per step; cached after the first run)")
        try:
            result = single_machine(baseline_params(self.scenario.agent, fleet.nodes, fleet.rounds))
        except Exception as exc:  # a baseline problem must not lose the run's report
            _say(f"simulate: no baseline: {exc}")
            return None
        (self.run_dir / "baseline.json").write_text(json.dumps(result) + "\n")
        return result


def _device_login(logins: dict[str, Credentials], name: str) -> tuple[str, str] | None:
    """A device's user and password (None: a broker without logins)."""
    entry = logins.get(name)
    return None if entry is None else (entry.username, entry.password)


def _tail(path: Path, lines: int = 6) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _say(text: str) -> None:
    tqdm.write(text, file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    try:
        check_args(args)
        scenario = load_scenario(args.scenario).with_fleet(args.nodes, args.rounds)
        extra = {**parse_agent_options(args.agent_option), **periodic_args.agent_options(args)}
        if extra:
            from simulate.scenario import _check_agent_options

            merged = {**scenario.agent, **extra}
            _check_agent_options(merged, "--agent-option", scenario.fleet.rounds)
            scenario = scenario.model_copy(update={"agent": merged})
        model = model_choice.choose(args, scenario.agent)
        check_model_options(scenario, model)
        model_choice.check_models(model, int(scenario.agent.get("seed", 0)))
        model_choice.check_dataset(model, scenario.agent, scenario.fleet.nodes)
        check_broker_choice(args.broker)
        check_tls(args.tls, args.broker, scenario.faults)
        check_credentials(args.credentials, scenario.fleet.nodes)
        job = choose_job(args.job, args.credentials, fresh_job_name())
        sites = sites_sim.check_sites(args, scenario)
        devices = _device_plan(args, scenario, model)
    except (ScenarioError, UsageError) as exc:
        print(f"edgegrove simulate: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    _say(job.line())
    out = args.out or Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S")
    sim = Simulation(scenario, out, args.broker, args.credentials, not args.no_dashboard,
                     args.dashboard_port, args.dashboard_host, args.baseline == "auto",
                     args.ready_timeout, args.stall_timeout, job=job.job,
                     persistence=not args.no_persistence, model=model, tls=args.tls, sites=sites,
                     devices=devices)

    def on_signal(signum: int, _frame: object) -> None:
        _say(f"simulate: {signal.Signals(signum).name}: stopping every process started, writing the report")
        sim.stop_event.set()
        sim.watch.poke()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        summary = sim.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    _say(_human_summary(summary))
    if args.json:
        print(json.dumps(summary))
    if sim.stop_event.is_set():
        return EXIT_INTERRUPTED
    return EXIT_HALTED if summary.get("halted") or summary.get("error") else EXIT_OK


def _device_plan(args: argparse.Namespace, scenario: Scenario, model: ModelChoice) -> DevicePlan | None:
    """The fleet as devices and a job, unless --via-agents; what cannot go through devices is
    one ScenarioError line with --via-devices, and runs through agents (said) without it."""
    if getattr(args, "via_agents", False):
        return None
    try:
        return _checked_device_plan(args, scenario, model)
    except ScenarioError as exc:
        if getattr(args, "via_devices", False):
            raise
        _say(f"simulate: the fleet runs as agents, not devices: {one_line(str(exc))}")
        return None


def _checked_device_plan(args: argparse.Namespace, scenario: Scenario, model: ModelChoice) -> DevicePlan:
    from simulate.device_run import DevicePlan

    if getattr(args, "sites", 0):
        raise ScenarioError("a fleet of devices runs on one broker: --sites runs as agents (drop --via-devices)")
    if args.credentials is not None:
        raise ScenarioError("devices get their credentials on the simulator's own broker: "
                            "--credentials runs as agents (drop --via-devices)")
    return DevicePlan.check(scenario, model)


def _refused_text(refused: list[int]) -> str:
    return f", refused (another model): nodes {', '.join(map(str, refused))}" if refused else ""


def _human_summary(s: dict[str, Any]) -> str:
    acc = s.get("final_test_accuracy")
    return (f"simulate: {s['rounds']} rounds, final test accuracy "
            f"{'n/a' if acc is None else f'{acc:.4f}'}, faults {s['faults_injected']} injected / "
            f"{s['faults_detected']} detected, degraded rounds {s['degraded_rounds']}, "
            f"median round {s['round_time_median_s'] or 0:.3f} s, wall {s['wall_time_s'] or 0:.1f} s"
            f"{_refused_text(s.get('refused_members') or [])}\n"
            f"simulate: report in {s['run_dir']}/report.md\n"
            f"simulate: open the run in the dashboard: edgegrove dashboard --replay {s['run_dir']}")
