"""Fault injection: turns a scenario's faults into actions on the broker, the agents and the OS.

| fault     | how                                                                        |
|-----------|----------------------------------------------------------------------------|
| link      | mosquitto dynamic security revokes link/a/b and link/b/a (a silent cut),   |
|           | or a Control ``cut`` that agent a applies (drops frames to and from b)     |
| loss      | Control ``loss`` p to the agent (it drops sent and received link frames)   |
| latency   | the agent's TCP proxy delays its traffic, or Control ``latency``           |
| bandwidth | the agent's TCP proxy paces its traffic, or (via = "kernel") a tbf qdisc    |
|           | on both ends of the veth link of the agent's network namespace (root only) |
| flap      | the agent's TCP proxy cuts its broker connection N times (it reconnects)   |
| crash     | SIGKILL; respawned with the same checkpoint dir at restart_round           |
| hang      | SIGSTOP; SIGCONT at resume_round                                           |
| isolate   | iptables DROP inside the agent's network namespace (root only)            |
| broker-   | the simulator's own mosquitto is stopped (by handle) and started again on  |
| restart   | the same port ``outage`` seconds later, in the background                  |

``plan_mechanisms`` decides up front how each fault will be done (and which must be skipped,
with the reason), so the run starts the proxies and namespaces it needs.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agent.protocol.messages import Control
from simulate.fleet import Fleet
from simulate.proxy import TcpProxy
from simulate.scenario import (
    BandwidthFault,
    BridgeCutFault,
    BrokerRestartFault,
    CrashFault,
    FlapFault,
    HangFault,
    IsolateFault,
    LatencyFault,
    LinkFault,
    LossFault,
    SiteBrokerRestartFault,
)


class LinkRevoker(Protocol):
    def revoke_link(self, src: int, dst: int) -> None: ...
    def restore_link(self, src: int, dst: int) -> None: ...


class SiteControl(Protocol):
    """The simulator's bridged site brokers (simulate.site_brokers.SiteBrokers)."""

    plan: dict[str, list[int]]
    def cut_bridge(self, site: str) -> None: ...
    def heal_bridge(self, site: str) -> None: ...
    def site_broker(self, site: str) -> Restartable: ...


def site_problem(site: str, sites: SiteControl | None) -> str:
    """'' when ``site`` is one of the simulator's sites, else why the fault cannot run."""
    if sites is None:
        return "site faults need the simulator's own bridged brokers (simulate --sites N)"
    if site not in sites.plan:
        return f"no site {site!r} in this run (sites {', '.join(sites.plan)})"
    return ""


class Restartable(Protocol):
    """The simulator's own broker: stopped and started again on the same port."""

    def stop(self) -> None: ...
    def start(self) -> None: ...
    @property
    def pid(self) -> int | None: ...


@dataclass(frozen=True)
class Plan:
    """How one fault will be injected, or why it is skipped (``skip`` non-empty)."""

    mechanism: str
    skip: str = ""


def _root_and_tools(what: str, tools: tuple[str, ...], otherwise: str) -> str:
    """'' when we are root and have ``tools``, else one line saying what ``what`` needs."""
    if os.geteuid() != 0:
        return f"{what} needs root ({', '.join(tools)}); run the simulator as root{otherwise}"
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        return f"{what} needs {' and '.join(missing)} (apt-get install iproute2 iptables)"
    return ""


def netns_supported() -> str:
    """'' when network namespaces + iptables can be used here, else the reason why not."""
    return _root_and_tools("network isolation", ("ip", "iptables"), "")


def kernel_shaping_supported() -> str:
    """'' when links can be limited in the kernel here (netns, veth, tbf, a DNAT to the
    broker), else the reason why not."""
    return _root_and_tools("limiting links in the kernel", ("ip", "tc", "iptables"), " or use the proxy")


def plan_mechanisms(faults: Sequence[Any], broker_can_revoke: bool,
                    broker_restartable: bool = False, sites: SiteControl | None = None) -> list[Plan]:
    plans = []
    netns_problem = netns_supported()
    for fault in faults:
        if isinstance(fault, LinkFault):
            via = fault.via
            if via == "broker" and not broker_can_revoke:
                plans.append(Plan("broker-dynsec", "this broker cannot revoke topics (needs "
                                  "mosquitto with dynamic security); use via = \"agent\" or \"auto\""))
                continue
            use_broker = via == "broker" or (via == "auto" and broker_can_revoke)
            plans.append(Plan("broker-dynsec" if use_broker else "agent-drop"))
        elif isinstance(fault, LossFault):
            plans.append(Plan("agent-loss"))
        elif isinstance(fault, LatencyFault):
            plans.append(Plan("agent-latency" if fault.via == "agent" else "proxy"))
        elif isinstance(fault, BandwidthFault) and fault.via == "kernel":
            plans.append(Plan("netns-tbf", kernel_shaping_supported()))
        elif isinstance(fault, BandwidthFault | FlapFault):
            plans.append(Plan("proxy"))
        elif isinstance(fault, CrashFault):
            plans.append(Plan("sigkill"))
        elif isinstance(fault, HangFault):
            plans.append(Plan("sigstop"))
        elif isinstance(fault, IsolateFault):
            plans.append(Plan("netns-iptables", netns_problem))
        elif isinstance(fault, BrokerRestartFault):
            plans.append(Plan("stop-start", "" if broker_restartable else
                              "only the simulator's own mosquitto can be restarted (--broker "
                              "auto or mosquitto, with mosquitto installed)"))
        elif isinstance(fault, BridgeCutFault | SiteBrokerRestartFault):
            plans.append(Plan("site-uplink" if isinstance(fault, BridgeCutFault) else "stop-start",
                              site_problem(fault.site, sites)))
        else:
            plans.append(Plan("unknown", f"no injector for {type(fault).__name__}"))
    return plans


def proxied_nodes(faults: Sequence[Any], plans: Sequence[Plan]) -> set[int]:
    """Nodes that must reach the broker through a TCP proxy (shaping or netns isolation)."""
    nodes: set[int] = set()
    for fault, plan in zip(faults, plans, strict=True):
        if not plan.skip and plan.mechanism in ("proxy", "netns-iptables"):
            nodes.add(fault.node)
    return nodes


def namespaced_nodes(faults: Sequence[Any], plans: Sequence[Plan]) -> set[int]:
    """Nodes whose agent runs in a network namespace of its own (isolation, kernel shaping)."""
    return {f.node for f, p in zip(faults, plans, strict=True)
            if not p.skip and p.mechanism in ("netns-iptables", "netns-tbf")}


# The veth's MTU. With Ethernet's 1,500 bytes every 1.4 KB is a packet of its own through the
# network stack of 7 agents and the broker on the host's few cores, where a real Pi's stack
# runs on its own CPU: at 7 agents on 2 cores the fleet's no-limit floor in float32 was 0.095 s
# with 1,500, 0.046 s with 32 KB, loopback's own ~0.048 s (`edgegrove bench links --shaper
# kernel`, 2026-12-03). The link's rate is the qdisc's, whatever the packet size.
NETNS_MTU = 32 * 1024
# tbf counts whole frames: an MTU-sized one carries MTU - 52 bytes of TCP payload (IP, TCP
# with timestamps) in MTU + 14 bytes (Ethernet), so a link of R payload bytes/s is limited at
# R times this.
FRAME_BYTES_PER_PAYLOAD = (NETNS_MTU + 14) / (NETNS_MTU - 52)
# The bucket: at least one frame (a larger one is dropped); what a link passes at once after
# an idle moment, so no larger than that (at 2 MB/s 64 KB is 33 ms).
TBF_BURST_BYTES = 64 * 1024
TBF_LATENCY = "200ms"  # the qdisc's queue; TCP's small queues keep it nearly empty (no drops)
NETNS_PREFIX = "10.201"


def taken_slots() -> set[int]:
    """Third octets of NETNS_PREFIX addresses already on this host (another fleet's namespaces)."""
    done = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=False)
    found = re.findall(rf"inet {re.escape(NETNS_PREFIX)}\.(\d+)\.", done.stdout)
    return {int(x) for x in found}


@contextlib.contextmanager
def slots_reserved() -> Iterator[set[int]]:
    """The slots taken on this host, held against other fleets until the block ends: another
    fleet that read the addresses while this one was still creating its namespaces took the
    same slots (two veths with one address: agents of both timed out on their broker)."""
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "edgegrove-netns-slots.lock")
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield taken_slots()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def free_slot(preferred: int, taken: set[int]) -> int:
    """The first slot from ``preferred`` on (1-249, wrapping) that no address uses."""
    for k in range(249):
        slot = (preferred - 1 + k) % 249 + 1
        if slot not in taken:
            return slot
    raise RuntimeError(f"no free {NETNS_PREFIX}.x.0/30 left for a network namespace")


class NetNamespace:
    """A network namespace joined to the host by a veth pair (10.201.<slot>.0/30).

    The agent runs inside (``ip netns exec``) and reaches the broker through a TCP proxy bound
    to the host end, or (``forward``) through a DNAT of the host end's port to the broker on
    127.0.0.1. ``isolate`` drops every packet in the namespace with iptables; ``heal``
    removes the rules. ``limit`` puts a tbf qdisc on both ends of the veth (each direction);
    ``unlimit`` removes them. ``remove`` deletes the namespace (and so the veth pair) and the
    DNAT rule.
    """

    def __init__(self, name: str, slot: int) -> None:
        if not 0 <= slot < 250:
            raise ValueError(f"slot {slot} out of range")
        self.name = name
        self.host_if = f"{name[:11]}h"
        self.ns_if = f"{name[:11]}n"
        self.host_ip = f"{NETNS_PREFIX}.{slot}.1"
        self.ns_ip = f"{NETNS_PREFIX}.{slot}.2"
        self.created = False
        self.forwarded: tuple[str, ...] = ()  # the host's DNAT rule, to delete on remove

    def create(self) -> None:
        run = _run
        run("ip", "netns", "add", self.name)
        self.created = True
        run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        run("ip", "link", "set", self.ns_if, "netns", self.name)
        run("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
        run("ip", "link", "set", self.host_if, "up")
        self.exec_run("ip", "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if)
        run("ip", "link", "set", self.host_if, "mtu", str(NETNS_MTU))
        self.exec_run("ip", "link", "set", self.ns_if, "mtu", str(NETNS_MTU))
        self.exec_run("ip", "link", "set", self.ns_if, "up")
        self.exec_run("ip", "link", "set", "lo", "up")

    def prefix(self) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.name)

    def exec_run(self, *args: str) -> None:
        _run(*self.prefix(), *args)

    def isolate(self) -> None:
        self.exec_run("iptables", "-A", "INPUT", "-i", self.ns_if, "-j", "DROP")
        self.exec_run("iptables", "-A", "OUTPUT", "-o", self.ns_if, "-j", "DROP")

    def heal(self) -> None:
        self.exec_run("iptables", "-F")

    def forward(self, port: int, broker_port: int) -> None:
        """Connections to host_ip:port from inside reach 127.0.0.1:broker_port on the host
        (the kernel forwards them: no process in the path)."""
        _run("sysctl", "-qw", f"net.ipv4.conf.{self.host_if}.route_localnet=1")
        rule = ("PREROUTING", "-i", self.host_if, "-p", "tcp", "--dport", str(port),
                "-j", "DNAT", "--to-destination", f"127.0.0.1:{broker_port}")
        _run("iptables", "-t", "nat", "-A", *rule)
        self.forwarded = rule

    def limit(self, bytes_per_second: float) -> None:
        """Each direction to ``bytes_per_second`` of TCP payload (tbf on both veth ends)."""
        rate = f"{max(8, round(bytes_per_second * FRAME_BYTES_PER_PAYLOAD * 8))}bit"
        tbf = ("root", "tbf", "rate", rate, "burst", str(TBF_BURST_BYTES), "latency", TBF_LATENCY)
        _run("tc", "qdisc", "replace", "dev", self.host_if, *tbf)  # the agent's downlink
        self.exec_run("tc", "qdisc", "replace", "dev", self.ns_if, *tbf)  # its uplink

    def unlimit(self) -> None:
        subprocess.run(["tc", "qdisc", "del", "dev", self.host_if, "root"], capture_output=True, check=False)
        subprocess.run([*self.prefix(), "tc", "qdisc", "del", "dev", self.ns_if, "root"],
                       capture_output=True, check=False)

    def remove(self) -> None:
        if self.forwarded:
            subprocess.run(["iptables", "-t", "nat", "-D", *self.forwarded], capture_output=True, check=False)
            self.forwarded = ()
        if not self.created:
            return
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, check=False)
        self.created = False


def _run(*args: str) -> None:
    done = subprocess.run(list(args), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(args)}` failed: {done.stderr.strip() or done.returncode}")


class Injector:
    """Applies and undoes faults; every action is recorded by ``record`` (the event log)."""

    def __init__(self, fleet: Fleet, publish_control: Callable[[Control], None],
                 record: Callable[..., Any], broker: LinkRevoker | None = None,
                 proxies: dict[int, TcpProxy] | None = None,
                 namespaces: dict[int, NetNamespace] | None = None,
                 restartable: Restartable | None = None, sites: SiteControl | None = None) -> None:
        self.fleet = fleet
        self.publish_control = publish_control
        self.record = record
        self.broker = broker
        self.proxies = proxies or {}
        self.namespaces = namespaces or {}
        self.restartable = restartable
        self.sites = sites
        self._closing = threading.Event()
        self._background: dict[int, tuple[threading.Thread, threading.Event]] = {}

    def inject(self, fault: Any, plan: Plan) -> None:
        self._act(fault, plan, undo=False)

    def undo(self, fault: Any, plan: Plan) -> None:
        self._act(fault, plan, undo=True)

    def _act(self, fault: Any, plan: Plan, undo: bool) -> None:
        mech = plan.mechanism
        if isinstance(fault, LinkFault):
            self._link(fault, mech, undo)
        elif isinstance(fault, LossFault):
            self.publish_control(Control("loss", fault.node, value=0.0 if undo else fault.p))
        elif isinstance(fault, LatencyFault):
            if mech == "proxy":
                self.proxies[fault.node].set_latency(0.0 if undo else fault.seconds)
            else:
                self.publish_control(Control("latency", fault.node, value=0.0 if undo else fault.seconds))
        elif isinstance(fault, BandwidthFault) and mech == "netns-tbf":
            ns = self.namespaces[fault.node]
            if undo:
                ns.unlimit()
            else:
                ns.limit(fault.bytes_per_second)
        elif isinstance(fault, BandwidthFault):
            self.proxies[fault.node].set_bandwidth(None if undo else fault.bytes_per_second)
        elif isinstance(fault, FlapFault):
            if not undo:
                self._flap(fault)
        elif isinstance(fault, CrashFault):
            if undo:
                self.fleet.spawn(fault.node)
            else:
                self.fleet.kill(fault.node)
        elif isinstance(fault, HangFault):
            if undo:
                self.fleet.resume(fault.node)
            else:
                self.fleet.pause(fault.node)
        elif isinstance(fault, IsolateFault):
            ns = self.namespaces[fault.node]
            if undo:
                ns.heal()
            else:
                ns.isolate()
                if fault.seconds is not None:
                    self._heal_later(fault, ns)
        elif isinstance(fault, BrokerRestartFault):
            if not undo:
                self._restart_broker(fault, self.restartable)
        elif isinstance(fault, BridgeCutFault | SiteBrokerRestartFault):
            self._site_fault(fault, undo)
        else:
            raise ValueError(f"no injector for {type(fault).__name__}")

    def _flap(self, fault: FlapFault) -> None:
        """Drop the node's connection ``times`` times, ``every`` seconds apart, in the
        background (the injector returns at once; the fleet goes on meanwhile)."""
        proxy = self.proxies[fault.node]

        def flap() -> None:
            for i in range(fault.times):
                if i:
                    time.sleep(fault.every)
                proxy.drop_connections()

        threading.Thread(target=flap, name=f"flap-{fault.node}", daemon=True).start()

    def _heal_later(self, fault: IsolateFault, ns: NetNamespace) -> None:
        """Heal the namespace ``fault.seconds`` from now, in the background (``finished``
        tells when; ``close`` heals at once)."""
        assert fault.seconds is not None
        done = threading.Event()

        def heal() -> None:
            try:
                if not self._closing.wait(fault.seconds):
                    ns.heal()
                    self.record("netns", event="healed", node=fault.node, after_s=fault.seconds)
            except (OSError, RuntimeError) as exc:
                self.record("netns", event="heal_failed", node=fault.node, error=str(exc))
            finally:
                done.set()

        thread = threading.Thread(target=heal, name=f"heal-{fault.node}", daemon=True)
        self._background[id(fault)] = (thread, done)
        thread.start()

    def _site_fault(self, fault: BridgeCutFault | SiteBrokerRestartFault, undo: bool) -> None:
        assert self.sites is not None
        sites = self.sites
        if isinstance(fault, SiteBrokerRestartFault):
            if not undo:
                self._restart_broker(fault, sites.site_broker(fault.site))
        elif undo:
            sites.heal_bridge(fault.site)
        else:
            sites.cut_bridge(fault.site)
            if fault.seconds is not None:
                self._later(id(fault), fault.seconds, lambda: sites.heal_bridge(fault.site),
                            f"bridge-{fault.site}")

    def _later(self, key: int, seconds: float, action: Callable[[], None], name: str) -> None:
        """``action`` in ``seconds``, in the background (``finished`` tells when it ran;
        ``close`` runs it at once)."""
        done = threading.Event()

        def run() -> None:
            try:
                self._closing.wait(seconds)
                action()
                self.record("site", event="healed", what=name, after_s=seconds)
            except (OSError, RuntimeError) as exc:
                self.record("site", event="heal_failed", what=name, error=str(exc))
            finally:
                done.set()

        thread = threading.Thread(target=run, name=name, daemon=True)
        self._background[key] = (thread, done)
        thread.start()

    def _restart_broker(self, fault: BrokerRestartFault | SiteBrokerRestartFault,
                        broker: Restartable | None) -> None:
        """Stop the broker now; start it again on the same port after the outage, in the
        background (``finished`` tells when it is back; ``close`` cancels a pending start)."""
        if broker is None:
            raise RuntimeError("no broker of the simulator's own to restart")
        pid = broker.pid
        broker.stop()
        # Wall time too: the agents' reports carry theirs (a round's end), which says whether
        # a report delivered after the restart is of a round that ended before it.
        self.record("broker", event="stopped", pid=pid, outage_s=fault.outage, wall=time.time())
        done = threading.Event()

        def back_up() -> None:
            try:
                if not self._closing.wait(fault.outage):
                    self._start_again(broker)
            finally:
                done.set()

        thread = threading.Thread(target=back_up, name="broker-restart", daemon=True)
        self._background[id(fault)] = (thread, done)
        thread.start()

    def _start_again(self, broker: Restartable) -> None:
        try:
            broker.start()
        except (OSError, RuntimeError) as exc:
            self.record("broker", event="restart_failed", error=str(exc))
            return
        self.record("broker", event="started", pid=broker.pid, wall=time.time())

    def finished(self, fault: Any) -> bool:
        """A fault that ends by itself in the background (a broker restart) is over."""
        entry = self._background.get(id(fault))
        return entry is not None and entry[1].is_set()

    def close(self) -> None:
        """Cancel what is still pending in the background and wait for it (a broker that is
        being started is started, so that whoever stops it next finds it)."""
        self._closing.set()
        for thread, _ in self._background.values():
            thread.join(30.0)

    def _link(self, fault: LinkFault, mechanism: str, undo: bool) -> None:
        a, b = fault.nodes
        directions = [(a, b)] if fault.one_way else [(a, b), (b, a)]
        if mechanism == "broker-dynsec":
            assert self.broker is not None
            for src, dst in directions:
                if undo:
                    self.broker.restore_link(src, dst)
                else:
                    self.broker.revoke_link(src, dst)
        else:
            action = "heal" if undo else "cut"
            self.publish_control(Control(action, a, peer=b, one_way=fault.one_way))  # type: ignore[arg-type]

    # -- commands from the dashboard's fault controls -----------------------------------------

    def obey(self, control: Control) -> str:
        """Carry out a Control from outside (the dashboard). Process-level actions (crash,
        restart, hang, resume, isolate) are ours; link, loss and latency ones the agents apply
        themselves. Returns the outcome, "applied: ..." or "ignored: <why>"."""
        refusal = self._refusal(control)
        if refusal:
            return f"ignored: {refusal}"
        node, action = control.node, control.action
        if action == "broker_restart":
            outage = float(control.value or 0.0)
            self._restart_broker(BrokerRestartFault(kind="broker-restart", at_round=0, phase="start", outage=outage),
                                 self.restartable)
            return f"applied: broker stopped, back in {outage:g} s"
        if action == "crash":
            self.fleet.kill(node)
        elif action in ("restart", "rejoin"):
            if self.fleet.agents[node].running():
                self.fleet.kill(node)
            self.fleet.spawn(node)
        elif action == "hang":
            self.fleet.pause(node)
        elif action == "resume":
            self.fleet.resume(node)
        elif action == "isolate":
            self.namespaces[node].isolate()
        else:
            target = f"link {node}->{control.peer}" if control.peer is not None else f"node {node}"
            return f"applied: {action} {target}, by the agents themselves"
        return f"applied: {action} node {node}"

    def _refusal(self, control: Control) -> str:
        """Why a command cannot be carried out in this fleet, or ''."""
        if control.action == "broker_restart":
            if self.restartable is None:
                return "the broker is not the simulator's own (an external broker, or sites): it is not restarted from here"
            if self.restartable.pid is None:
                return "the broker is down already (a restart is under way)"
            if not 0.0 < (control.value or 0.0) <= 600.0:
                return "a broker restart needs its outage in seconds (above 0, up to 600)"
            return ""
        ids = sorted(self.fleet.agents)
        for role, node in (("node", control.node), ("peer", control.peer)):
            if node is not None and node not in self.fleet.agents:
                return f"{role} {node} is not in this fleet (nodes {ids[0]}-{ids[-1]})"
        if control.peer is not None and control.peer == control.node:
            return f"a link needs two different nodes, not {control.node}->{control.peer}"
        agent = self.fleet.agents[control.node]
        action = control.action
        if action in ("crash", "hang") and not agent.running():
            return f"node {control.node} is not running"
        if action == "hang" and agent.stopped:
            return f"node {control.node} is already hung"
        if action == "resume" and not agent.stopped:
            return f"node {control.node} is not hung"
        if action == "isolate" and control.node not in self.namespaces:
            return "isolation needs the node in a network namespace (root, and an isolate fault)"
        return ""
