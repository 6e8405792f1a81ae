"""How each node of a simulation is started: its broker address (through its proxy, its
network namespace, its site's broker), its options and credentials, where it logs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simulate import model_choice
from simulate.fleet import AgentSpec
from simulate.logins import credentials_options
from simulate.model_choice import ModelChoice
from simulate.scenario import Scenario
from simulate.stage import Network

if TYPE_CHECKING:
    from simulate.site_brokers import SiteBrokers


@dataclass(frozen=True)
class AgentLaunch:
    """The scenario's fleet, one agent a node."""

    scenario: Scenario
    job: str
    model: ModelChoice
    run_dir: Path
    site_brokers: SiteBrokers | None = None
    site_aware: bool = True  # the agents are told their site (with site brokers)

    def specs(self, url: str, creds_file: Path | None, network: Network,
              ca_file: str | None = None) -> list[AgentSpec]:
        from dashboard.settings import parse_broker_url

        proxies, namespaces = network.proxies, network.namespaces
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
                if self.site_aware:
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
