"""A bridged set of mosquittos on one machine: a core broker and one broker per site.

Rendered by ``broker-config/make-sites`` into a work directory. Each site's bridge dials the
core through a ``TcpProxy`` of its own: the proxy is the site's uplink, so it can be shaped
(bandwidth, latency), counted (bytes each way) and cut (``cut_bridge``: the proxy goes away and
every bridge connection through it drops; ``heal_bridge`` listens again on the same port and
the bridge reconnects by itself).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
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
                 sites: dict[str, MosquittoBroker], uplinks: dict[str, TcpProxy]) -> None:
        self.workdir = workdir
        self.core = core
        self.sites = sites
        self.uplinks = uplinks
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
        """Every uplink: a rate limit each way and half the round-trip time each way."""
        for proxy in self.uplinks.values():
            proxy.set_bandwidth(bytes_per_second)
            proxy.set_latency(rtt / 2)

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
        proxy = TcpProxy(*old.target, listen_port=old.port, name=f"uplink-{site}")
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

    def __enter__(self) -> SiteBrokers:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def start_sites(workdir: str | Path, *, job: str, nodes: int, sites: int,
                persistence: bool = True) -> SiteBrokers:
    """Render ``make-sites`` into ``workdir`` and start the core, the uplink proxies and the
    site brokers (each on a free 127.0.0.1 port); return once every broker runs."""
    workdir = Path(workdir).resolve()
    make_sites = _load_make_sites()
    plan = make_sites.split_sites(list(range(nodes)), sites)
    core_port = free_port()
    uplinks = {name: TcpProxy("127.0.0.1", core_port, name=f"uplink-{name}") for name in plan}
    ports = {name: free_port() for name in plan}
    started: list[MosquittoBroker] = []
    try:
        address = {name: f"127.0.0.1:{proxy.start()}" for name, proxy in uplinks.items()}
        doc = make_sites.make_sites(workdir, list(range(nodes)), plan, job, core_port=core_port,
                                    site_ports=ports, core_address=address)
        core = _broker(workdir / "core", core_port, doc, persistence)
        started.append(core)
        site_brokers: dict[str, MosquittoBroker] = {}
        for name in plan:
            site_brokers[name] = _broker(workdir / f"site-{name}", ports[name], doc, persistence)
            started.append(site_brokers[name])
    except (BrokerError, OSError, ValueError):
        for broker in started:
            broker.stop()
        for proxy in uplinks.values():
            proxy.stop()
        raise
    brokers = SiteBrokers(workdir, doc, core, site_brokers, uplinks)
    try:
        brokers.wait_bridged()
    except BrokerError:
        brokers.stop()
        raise
    (workdir / "sites.json").write_text(json.dumps(
        {"core": core.url, "sites": {n: b.url for n, b in site_brokers.items()}}, indent=1))
    return brokers


def _broker(directory: Path, port: int, doc: dict[str, Any], persistence: bool) -> MosquittoBroker:
    conf = directory / "mosquitto.conf"
    set_persistence(conf, persistence)
    broker = MosquittoBroker(directory, conf, port, "127.0.0.1", doc, dynsec=False, tls=False)
    broker.credentials_path = directory.parent / "credentials.json"
    broker.start()
    return broker
