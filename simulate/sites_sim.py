"""``edgegrove simulate --sites N``: the fleet on bridged site brokers (simulate.site_brokers).

Each agent connects to its site's broker and announces its site (``--site sK``); the
simulator's collector, dashboard and admin talk to the core broker. The uplinks (each site's
bridge to the core) run through a proxy each, shaped with ``--uplink-rate`` and
``--uplink-rtt``; scenario faults ``bridge-cut`` and ``site-broker-restart`` act on them.
With ``--site-netns`` each site (its broker and its agents) runs in a network namespace of its
own and the kernel limits each uplink's rate; the proxy adds its RTT.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent.validate import UsageError
from simulate.injector import kernel_shaping_supported
from simulate.scenario import BridgeCutFault, Scenario, SiteBrokerRestartFault
from simulate.site_brokers import SiteBrokers, split_sites, start_sites
from simulate.telemetry import EventLog

# Faults that need the agent's own proxy or network namespace in front of the one broker.
_PER_AGENT_NETWORK = ("latency", "bandwidth", "flap", "isolate")
UPLINK_SAMPLE_S = 1.0  # s: the uplinks' bytes and cuts logged at least this often


@dataclass(frozen=True)
class SitesOptions:
    count: int
    uplink_rate: float | None = None  # bytes/s each way of every uplink; None: unlimited
    uplink_rtt: float = 0.0  # s
    site_aware: bool = True  # off: the agents are not told their site (a site-blind tree)
    trace: bool = False  # note every uplink write (uplink-trace.json in the run directory)
    netns: bool = False  # each site in a network namespace, its uplink's rate limited by the kernel


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sites", type=int, default=0,
                        help="bridged sites: one mosquitto per site plus a core broker, the agents "
                             "split by id into sites s0, s1, ... (0: one broker)")
    parser.add_argument("--uplink-rate", type=float, default=None, metavar="MB/S",
                        help="with --sites: each site's uplink to the core, MB/s each way")
    parser.add_argument("--uplink-rtt", type=float, default=0.0, metavar="MS",
                        help="with --sites: each uplink's round-trip time in ms")
    parser.add_argument("--site-blind", action="store_true",
                        help="with --sites: the agents are not told their site, so their tree "
                             "ignores the sites (the comparison of `edgegrove bench sites --real`; "
                             "a cut bridge then reads as lost members, not a cut site)")
    parser.add_argument("--uplink-trace", action="store_true",
                        help="with --sites: note when each uplink carried how many bytes, each way, "
                             "into uplink-trace.json in the run directory (`bench sites --real` "
                             "reads it to split each round into its parts)")
    parser.add_argument("--site-netns", action="store_true",
                        help="with --sites: run each site's broker and agents in a network namespace "
                             "of its own (they reach nothing but their site's broker) and limit each "
                             "uplink's rate in the kernel (tbf on the site's veth); the RTT stays in "
                             "the uplink's proxy, as this kernel has no netem. Needs root, ip and tc")


def check_sites(args: argparse.Namespace, scenario: Scenario) -> SitesOptions | None:
    """The sites to run, or UsageError (before anything starts)."""
    count = int(args.sites)
    if count == 0:
        if (args.uplink_rate is not None or args.uplink_rtt or args.site_blind or args.uplink_trace
                or args.site_netns):
            raise UsageError("--uplink-rate, --uplink-rtt, --uplink-trace, --site-blind and --site-netns "
                             "are about the uplinks of --sites: add --sites N")
        _no_site_faults(scenario, "")
        return None
    if not 1 <= count <= scenario.fleet.nodes:
        raise UsageError(f"--sites {count}: use 1..{scenario.fleet.nodes} (every site needs an agent)")
    if args.broker not in ("auto", "mosquitto") or args.tls:
        raise UsageError("--sites runs the simulator's own mosquittos (bridges): drop --broker "
                         "and --tls")
    if args.uplink_rate is not None and not args.uplink_rate > 0:
        raise UsageError(f"--uplink-rate {args.uplink_rate}: MB/s > 0")
    if not 0 <= args.uplink_rtt <= 10_000:
        raise UsageError(f"--uplink-rtt {args.uplink_rtt}: ms in 0..10000")
    network = [f.kind for f in scenario.faults if f.kind in _PER_AGENT_NETWORK]
    if network:
        raise UsageError(f"--sites: the fault {network[0]!r} shapes one agent's own link, which "
                         "runs to the single broker only; use bridge-cut or site-broker-restart")
    _no_site_faults(scenario, ", ".join(split_sites(list(range(scenario.fleet.nodes)), count)))
    if args.site_netns and (problem := kernel_shaping_supported()):
        raise UsageError(f"--site-netns: {problem}")
    rate = None if args.uplink_rate is None else args.uplink_rate * 1e6
    return SitesOptions(count, rate, args.uplink_rtt / 1000, not args.site_blind, args.uplink_trace,
                        args.site_netns)


def _no_site_faults(scenario: Scenario, names: str) -> None:
    """Every site fault names a site of this run (none at all without --sites)."""
    for index, fault in enumerate(scenario.faults):
        if isinstance(fault, BridgeCutFault | SiteBrokerRestartFault):
            if not names:
                raise UsageError(f"faults[{index}] ({fault.kind}) needs bridged sites: add --sites N")
            if fault.site not in names.split(", "):
                raise UsageError(f"faults[{index}] ({fault.kind}): no site {fault.site!r} in this "
                                 f"run (sites {names})")


def start(run_dir: Path, job: str, nodes: int, options: SitesOptions, persistence: bool) -> SiteBrokers:
    brokers = start_sites(run_dir / "brokers", job=job, nodes=nodes, sites=options.count,
                          persistence=persistence, netns=options.netns)
    brokers.shape_uplinks(options.uplink_rate, options.uplink_rtt)
    if options.trace:
        brokers.trace_uplinks()
    return brokers


class UplinkLog:
    """Per round, what crossed the uplinks so far (`bench sites --real` reads it); between
    rounds at least every UPLINK_SAMPLE_S, without a round, so that the dashboard's rates and
    bridge states move on while the fleet waits (a cut site)."""

    def __init__(self, sites: SiteBrokers, log: EventLog, clock: Callable[[], float] = time.monotonic) -> None:
        self.sites = sites
        self.log = log
        self.clock = clock
        self.round, self.at = -1, 0.0  # the last record logged

    def sample(self, fleet_round: int) -> None:
        now = self.clock()
        if fleet_round != self.round:
            self.log.add("uplinks", round=fleet_round, **self.sites.uplinks_record())
        elif now - self.at >= UPLINK_SAMPLE_S:
            self.log.add("uplinks", **self.sites.uplinks_record())
        else:
            return
        self.round, self.at = fleet_round, now
