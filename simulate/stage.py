"""The stage a simulation runs on: its broker (the simulator's own mosquitto, bridged site
brokers, the embedded one or the user's), the network between each agent and it (a proxy, a
network namespace) and the dashboard. Each part is stopped by the run's ExitStack."""

from __future__ import annotations

import json
import secrets
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from simulate import sites_sim
from simulate.injector import (
    LinkRevoker,
    NetNamespace,
    Plan,
    Restartable,
    free_slot,
    namespaced_nodes,
    proxied_nodes,
    slots_reserved,
)
from simulate.logins import dashboard_login
from simulate.progress import say
from simulate.proxy import TcpProxy
from simulate.scenario import Scenario
from simulate.telemetry import EventLog

if TYPE_CHECKING:
    from dashboard.server import DashboardHandle
    from simulate.brokers import MosquittoBroker
    from simulate.site_brokers import SiteBrokers


@dataclass(frozen=True)
class BrokerSetup:
    """The broker a run talks to, and what the simulator may do to it."""

    url: str
    credentials: Path | None  # credentials.json for the agents (None: no authentication)
    admin: tuple[str, str] | None  # user name and password with rights on the whole job
    revoker: LinkRevoker | None = None  # cuts links at the broker
    restartable: Restartable | None = None  # the simulator's own broker
    ca_file: str | None = None  # TLS: the CA that signed the broker's certificate


@dataclass(frozen=True)
class BrokerWish:
    """The broker the person asked for."""

    choice: str = "auto"  # auto | mosquitto | embedded | mqtt(s)://HOST:PORT
    credentials: Path | None = None  # with a broker of the user's: its credentials.json
    persistence: bool = True
    tls: bool = False  # the own mosquitto with TLS (and dynamic security)
    sites: sites_sim.SitesOptions | None = None  # bridged site brokers (simulate --sites)
    devices: tuple[str, ...] = ()  # device users the own mosquitto makes (simulate --via-devices)


@dataclass(frozen=True)
class Network:
    """How each agent reaches the broker, when not directly."""

    proxies: dict[int, TcpProxy] = field(default_factory=dict)
    namespaces: dict[int, NetNamespace] = field(default_factory=dict)


class Stage:
    """The broker, network and dashboard of one run, started in that order."""

    def __init__(self, run_dir: Path, job: str, scenario: Scenario, log: EventLog) -> None:
        self.run_dir = run_dir
        self.job = job
        self.scenario = scenario
        self.log = log
        self.site_brokers: SiteBrokers | None = None
        self.mosquitto: MosquittoBroker | None = None  # the simulator's own, when it is one
        self.dashboard_url: str | None = None
        self.dashboard_handle: DashboardHandle | None = None  # its last state stays readable (tests)

    def start_broker(self, stack: ExitStack, wish: BrokerWish) -> BrokerSetup:
        from simulate import brokers

        choice = wish.choice
        if choice == "auto":
            choice = "mosquitto" if brokers.mosquitto_available() else "embedded"
            if choice == "embedded":
                say("simulate: mosquitto is not installed: using the embedded broker (rumqttd); "
                    "link cuts become agent-side drops")
        if wish.sites is not None:
            return self._start_sites(stack, wish)
        if choice == "mosquitto":
            mosq = brokers.start_mosquitto(self.run_dir / "broker", job=self.job,
                                           nodes=self.scenario.fleet.nodes, dynsec=True,
                                           persistence=wish.persistence, tls=wish.tls, devices=wish.devices)
            stack.callback(mosq.stop)
            self.mosquitto = mosq
            creds = mosq.admin_credentials
            self.log.add("broker", kind="mosquitto", url=mosq.url, pid=mosq.pid,
                         persistence=wish.persistence, tls=wish.tls)
            return BrokerSetup(mosq.url, mosq.credentials_path, (creds.username, creds.password),
                               revoker=mosq, restartable=mosq, ca_file=mosq.ca_file)
        if choice == "embedded":
            embedded = brokers.start_embedded(log_path=self.run_dir / "broker.log")
            stack.callback(embedded.stop)
            self.log.add("broker", kind="embedded", url=embedded.url, pid=embedded.pid)
            return BrokerSetup(embedded.url, None, None)
        return self._external_broker(stack, choice, wish.credentials)

    def _start_sites(self, stack: ExitStack, wish: BrokerWish) -> BrokerSetup:
        assert wish.sites is not None
        sites = self.site_brokers = sites_sim.start(self.run_dir, self.job, self.scenario.fleet.nodes,
                                                    wish.sites, wish.persistence)
        stack.callback(sites.stop)
        log = self.log
        stack.callback(lambda: log.add("uplinks", **sites.uplinks_record()))  # before the stop
        stack.callback(lambda: sites.write_uplink_trace(self.run_dir / "uplink-trace.json"))
        creds = sites.admin_credentials
        self.log.add("broker", kind="mosquitto-sites", url=sites.core.url, pid=sites.core.pid,
                     sites={n: b.url for n, b in sites.sites.items()})
        return BrokerSetup(sites.core.url, sites.credentials_path, (creds.username, creds.password))

    def _external_broker(self, stack: ExitStack, url: str, credentials: Path | None) -> BrokerSetup:
        """A broker the user runs: with credentials, its dynamic security (if it answers the
        admin) cuts links; else the agents drop frames themselves."""
        from agent.protocol.topics import Topics
        from simulate import brokers

        self.log.add("broker", kind="external", url=url)
        if credentials is None:
            return BrokerSetup(url, None, None)
        table = json.loads(credentials.read_text())
        admin = brokers.Credentials(table["admin"]["username"], table["admin"]["password"])
        dynsec = brokers.DynsecAdmin(url, admin, Topics(self.job).prefix)
        problem = dynsec.probe()
        if problem:
            say(f"simulate: the broker's dynamic security does not answer the admin ({problem}); "
                "link cuts become agent-side drops")
            return BrokerSetup(url, credentials, (admin.username, admin.password))
        stack.callback(dynsec.close)
        say("simulate: link cuts through the broker's dynamic security (admin of --credentials)")
        return BrokerSetup(url, credentials, (admin.username, admin.password), revoker=dynsec)

    def start_network(self, stack: ExitStack, url: str, plans: list[Plan]) -> Network:
        """A network namespace for each agent whose faults shape its link in the kernel, a
        proxy for each whose faults the proxy does."""
        from dashboard.settings import parse_broker_url

        address = parse_broker_url(url)
        faults = self.scenario.faults
        proxied = proxied_nodes(faults, plans)
        network = Network()
        tag = secrets.token_hex(2)
        namespaced = namespaced_nodes(faults, plans)
        with slots_reserved() as taken:
            for node in sorted(namespaced):
                slot = free_slot((node % 200) + 1, taken)
                taken.add(slot)
                ns = NetNamespace(f"eg{tag}n{node}", slot=slot)
                stack.callback(ns.remove)
                ns.create()
                network.namespaces[node] = ns
        for node in sorted(namespaced):
            ns = network.namespaces[node]
            if node not in proxied:
                # Kernel shaping only: the agent reaches the broker through the kernel alone.
                if address.host not in ("127.0.0.1", "localhost"):
                    raise RuntimeError(f"limiting links in the kernel needs the simulator's own broker "
                                       f"on 127.0.0.1, not {address.host}")
                ns.forward(address.port, address.port)
        for node in sorted(proxied):
            listen = network.namespaces[node].host_ip if node in network.namespaces else "127.0.0.1"
            proxy = TcpProxy(address.host, address.port, listen_host=listen, name=f"proxy-{node}")
            proxy.start()
            stack.callback(proxy.stop)
            network.proxies[node] = proxy
        return network

    def start_dashboard(self, stack: ExitStack, broker: BrokerSetup, host: str, port: int) -> None:
        try:
            from dashboard.server import run_in_thread
            from dashboard.settings import DashboardSettings
        except ImportError as exc:
            say(f"simulate: the dashboard is not available ({exc}); install edgegrove[dashboard]")
            return
        login = dashboard_login(broker.credentials)  # never the admin: read-only, or that and control
        ca_file = broker.ca_file
        settings = DashboardSettings(
            broker_url=broker.url, job=self.job, ca_file=Path(ca_file) if ca_file else None,
            username=login.username, password=login.password, host=host, port=port,
            control_token=login.token,
            event_log=self.run_dir / "dashboard-events.jsonl", fleet_size=self.scenario.fleet.nodes,
            total_rounds=self.scenario.fleet.rounds, run_dir=self.run_dir)
        handle = run_in_thread(settings)
        self.dashboard_handle = handle
        stack.callback(handle.stop)
        self.dashboard_url = handle.url
        self.log.listeners.append(handle.feed)  # faults, control outcomes, the run's end
        self.log.add("dashboard", url=handle.url)
        say(f"simulate: dashboard at {handle.url}  {login.says()}")
