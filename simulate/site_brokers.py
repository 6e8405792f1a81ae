"""A bridged set of mosquittos on one machine: a core broker and one broker per site.

Rendered by ``broker-config/make-sites`` into a work directory. Each site's bridge dials the
core through a ``TcpProxy`` of its own: the proxy is the site's uplink, so it can be shaped
(bandwidth, latency), counted (bytes each way) and cut (``cut_bridge``: the proxy goes away and
every bridge connection through it drops; ``heal_bridge`` listens again on the same port and
the bridge reconnects by itself).

With ``netns``, each site's broker (and the agents the simulator starts there) runs in a
network namespace of its own, joined to the host by a veth pair: the agents can reach nothing
but their site's broker, and the bridge leaves the site over the veth, whose rate the kernel
limits (tbf on both ends). The proxy on the host end then adds only the uplink's latency: this
kernel has no netem.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import secrets
import time
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

from simulate.brokers import (
    BrokerError,
    Credentials,
    MosquittoBroker,
    broker_config_dir,
    free_port,
    set_persistence,
)
from simulate.injector import NetNamespace, free_slot, slots_reserved
from simulate.proxy import TcpProxy


def _load_make_sites() -> ModuleType:
    path = broker_config_dir() / "make-sites"
    loader = importlib.machinery.SourceFileLoader("edgegrove_make_sites", str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def split_sites(node_ids: list[int], sites: int) -> dict[str, list[int]]:
    """Site name -> agent ids, as ``make-sites`` splits them (contiguous blocks by id)."""
    plan: dict[str, list[int]] = _load_make_sites().split_sites(node_ids, sites)
    return plan


class SiteBrokers:
    """The running set. Create with ``start_sites``; a context manager."""

    def __init__(self, workdir: Path, doc: dict[str, Any], core: MosquittoBroker,
                 sites: dict[str, MosquittoBroker], uplinks: dict[str, TcpProxy],
                 namespaces: dict[str, NetNamespace] | None = None) -> None:
        self.workdir = workdir
        self.core = core
        self.sites = sites
        self.uplinks = uplinks
        self.namespaces = namespaces or {}
        self.credentials_path = workdir / "credentials.json"
        self.job: str = doc["job"]
        self.prefix: str = doc["prefix"]
        self.plan: dict[str, list[int]] = {name: list(s["ids"]) for name, s in doc["sites"].items()}
        self._site_of = {i: name for name, ids in self.plan.items() for i in ids}
        self._cut: set[str] = set()

    @property
    def is_running(self) -> bool:
        return self.core.is_running and all(b.is_running for b in self.sites.values())

    def site_of(self, node: int) -> str:
        return self._site_of[node]

    def url_for(self, node: int) -> str:
        """The broker agent ``node`` connects to: its site's."""
        return self.sites[self._site_of[node]].url

    def command_prefix(self, node: int) -> tuple[str, ...]:
        """What runs agent ``node`` in its site's network namespace; () without namespaces."""
        ns = self.namespaces.get(self._site_of[node])
        return ns.prefix() if ns is not None else ()

    def credentials_for(self, node: int) -> Credentials:
        return self.core.credentials_for(node)

    @property
    def admin_credentials(self) -> Credentials:
        return self.core.admin_credentials

    @property
    def dashboard_credentials(self) -> Credentials:
        return self.core.dashboard_credentials

    def uplink_bytes(self) -> dict[str, tuple[int, int]]:
        """Site -> (bytes up to the core, bytes down from it) through its uplink so far."""
        return {name: (p.bytes_up[0], p.bytes_down[0]) for name, p in self.uplinks.items()}

    def uplinks_record(self) -> dict[str, Any]:
        """What the dashboard and ``bench sites --real`` read of the uplinks: the bytes each
        way so far, and the sites whose uplink is cut now."""
        return {"bytes": self.uplink_bytes(), "cut": sorted(self._cut)}

    def shape_uplinks(self, bytes_per_second: float | None, rtt: float) -> None:
        """Every uplink: a rate limit each way and half the round-trip time each way. In
        namespaces the kernel limits the rate (the site's veth) and the proxy adds the latency."""
        for name, proxy in self.uplinks.items():
            proxy.set_latency(rtt / 2)
            ns = self.namespaces.get(name)
            if ns is None:
                proxy.set_bandwidth(bytes_per_second)
                continue
            proxy.shaping_up.line_rate = proxy.shaping_down.line_rate = bytes_per_second
            if bytes_per_second is None:
                ns.unlimit()
            else:
                ns.limit(bytes_per_second)

    def trace_uplinks(self) -> None:
        """From now on every uplink notes when it carried how many bytes, each way."""
        for proxy in self.uplinks.values():
            proxy.start_trace()

    def write_uplink_trace(self, path: Path) -> None:
        """What ``trace_uplinks`` noted, as JSON: site -> {"up"|"down": [[time, bytes], ...]}
        (wall-clock seconds, the agents' clock on this machine); nothing when not traced."""
        traces = {name: {"up": list(p.trace_up or []), "down": list(p.trace_down or [])}
                  for name, p in self.uplinks.items()
                  if p.trace_up is not None and p.trace_down is not None}
        if traces:
            path.write_text(json.dumps({name: {way: [[round(t, 4), n] for t, n in writes]
                                               for way, writes in ways.items()}
                                        for name, ways in traces.items()}))

    def is_cut(self, site: str) -> bool:
        return site in self._cut

    def cut_bridge(self, site: str) -> None:
        """The site's uplink goes away: its bridge connection drops, and redials fail."""
        proxy = self.uplinks[site]
        proxy.stop()
        self._cut.add(site)

    def heal_bridge(self, site: str) -> None:
        """The uplink is back on the same port, with the same shaping and counters."""
        if site not in self._cut:
            return
        old = self.uplinks[site]
        proxy = TcpProxy(*old.target, listen_host=old.listen[0], listen_port=old.port, name=f"uplink-{site}")
        proxy.shaping_up, proxy.shaping_down = old.shaping_up, old.shaping_down
        proxy.bytes_up, proxy.bytes_down = old.bytes_up, old.bytes_down
        proxy.trace_up, proxy.trace_down = old.trace_up, old.trace_down
        proxy.start()
        self.uplinks[site] = proxy
        self._cut.discard(site)

    def bridge_connections(self, site: str) -> int:
        """How often the site's bridge has connected to the core (the core's log says)."""
        marker = f" as edgegrove-{self.job}-bridge-{site} "
        try:
            return self.core.log_path.read_text().count(marker)
        except OSError:
            return 0

    def wait_bridged(self, timeout: float = 15.0, after: dict[str, int] | None = None) -> None:
        """Return once every bridge not cut has connected (more often than ``after`` says)."""
        deadline = time.monotonic() + timeout
        while True:
            waiting = [n for n in self.sites if n not in self._cut
                       and self.bridge_connections(n) <= (after or {}).get(n, 0)]
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise BrokerError(f"the bridge of site {', '.join(waiting)} did not connect to "
                                  f"the core within {timeout:.0f} s; see {self.core.log_path}")
            time.sleep(0.05)

    def restart_site(self, site: str) -> None:
        self.sites[site].restart()

    def site_broker(self, site: str) -> MosquittoBroker:
        return self.sites[site]

    def stop(self) -> None:
        for broker in self.sites.values():
            broker.stop()
        for proxy in self.uplinks.values():
            proxy.stop()
        self.core.stop()
        for ns in self.namespaces.values():
            ns.remove()

    def __enter__(self) -> SiteBrokers:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def start_sites(workdir: str | Path, *, job: str, nodes: int, sites: int,
                persistence: bool = True, netns: bool = False) -> SiteBrokers:
    """Render ``make-sites`` into ``workdir`` and start the core, the uplink proxies and the
    site brokers (each on a free 127.0.0.1 port, in the site's namespace with ``netns``);
    return once every broker runs."""
    workdir = Path(workdir).resolve()
    make_sites = _load_make_sites()
    plan = make_sites.split_sites(list(range(nodes)), sites)
    core_port = free_port()
    namespaces = _site_namespaces(list(plan)) if netns else {}
    listen = {name: namespaces[name].host_ip if name in namespaces else "127.0.0.1" for name in plan}
    uplinks = {name: TcpProxy("127.0.0.1", core_port, listen_host=listen[name], name=f"uplink-{name}")
               for name in plan}
    ports = {name: free_port() for name in plan}
    started: list[MosquittoBroker] = []
    try:
        address = {name: f"{listen[name]}:{proxy.start()}" for name, proxy in uplinks.items()}
        doc = make_sites.make_sites(workdir, list(range(nodes)), plan, job, core_port=core_port,
                                    site_ports=ports, core_address=address)
        core = _broker(workdir / "core", core_port, doc, persistence)
        started.append(core)
        site_brokers: dict[str, MosquittoBroker] = {}
        for name in plan:
            prefix = namespaces[name].prefix() if name in namespaces else ()
            site_brokers[name] = _broker(workdir / f"site-{name}", ports[name], doc, persistence, prefix)
            started.append(site_brokers[name])
    except (BrokerError, OSError, ValueError):
        for broker in started:
            broker.stop()
        for proxy in uplinks.values():
            proxy.stop()
        for ns in namespaces.values():
            ns.remove()
        raise
    brokers = SiteBrokers(workdir, doc, core, site_brokers, uplinks, namespaces)
    try:
        brokers.wait_bridged()
    except BrokerError:
        brokers.stop()
        raise
    (workdir / "sites.json").write_text(json.dumps(
        {"core": core.url, "sites": {n: b.url for n, b in site_brokers.items()}}, indent=1))
    return brokers


def _site_namespaces(names: list[str]) -> dict[str, NetNamespace]:
    """A network namespace per site, joined to the host by a veth (simulate.injector)."""
    tag = secrets.token_hex(2)
    made: dict[str, NetNamespace] = {}
    try:
        with slots_reserved() as taken:
            for k, name in enumerate(names):
                slot = free_slot(200 + k % 49, taken)
                taken.add(slot)
                made[name] = NetNamespace(f"eg{tag}s{name}", slot=slot)
                made[name].create()
    except (RuntimeError, ValueError):
        for ns in made.values():
            ns.remove()
        raise
    return made


def _broker(directory: Path, port: int, doc: dict[str, Any], persistence: bool,
            prefix: tuple[str, ...] = ()) -> MosquittoBroker:
    conf = directory / "mosquitto.conf"
    set_persistence(conf, persistence)
    broker = MosquittoBroker(directory, conf, port, "127.0.0.1", doc, dynsec=False, tls=False)
    broker.credentials_path = directory.parent / "credentials.json"
    broker.command_prefix = prefix
    broker.start()
    return broker
