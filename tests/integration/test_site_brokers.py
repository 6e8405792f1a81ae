"""A bridged set of real mosquittos (broker-config/make-sites): what crosses the bridges and
what stays in a site, a bridge cut and its heal, and `edgegrove broker --sites`."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.transport.mqtt import MqttTransport
from simulate.injector import kernel_shaping_supported
from simulate.site_brokers import SiteBrokers, start_sites
from tests.integration.conftest import TOPICS, collect, publish_until_received

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def sites(tmp_path: Path) -> Iterator[SiteBrokers]:
    with start_sites(tmp_path / "brokers", job=TOPICS.job, nodes=6, sites=2) as brokers:
        yield brokers


def _agent(sites: SiteBrokers, node: int, subscribe: list[str]) -> MqttTransport:
    creds = sites.credentials_for(node)
    t = MqttTransport(creds.client_id or f"a{node}", sites.url_for(node),
                      username=creds.username, password=creds.password)
    t.connect(subscribe)
    return t


def _core_watcher(sites: SiteBrokers) -> MqttTransport:
    creds = sites.admin_credentials
    t = MqttTransport("core-watch", sites.core.url, username=creds.username, password=creds.password)
    t.connect([f"{TOPICS.prefix}/#"])
    return t


def test_cross_site_frames_pass_and_site_local_frames_stay(sites: SiteBrokers) -> None:
    assert sites.plan == {"s0": [0, 1, 2], "s1": [3, 4, 5]}
    core = _core_watcher(sites)
    a0 = _agent(sites, 0, [TOPICS.links_to(0)])
    a1 = _agent(sites, 1, [TOPICS.links_to(1)])
    a4 = _agent(sites, 4, [TOPICS.links_to(4), TOPICS.all_status(), TOPICS.all_views()])
    try:
        publish_until_received(a0, TOPICS.link(0, 4), b"cross", a4)
        a0.publish(TOPICS.link(0, 1), b"local")
        a0.publish(TOPICS.status(0), b"online", retain=True)
        a0.publish(TOPICS.view_of(0), b"view")
        assert collect(a1, lambda ms: any(m.payload == b"local" for m in ms))
        got = collect(a4, lambda ms: {m.topic for m in ms} >= {TOPICS.status(0), TOPICS.view_of(0)})
        assert len([m for m in got if m.topic == TOPICS.status(0)]) == 1  # no bridge loop
        # Waited for, not slept for: a loaded host may take more than a second to bridge them.
        at_core = [m.topic for m in collect(
            core, lambda ms: {m.topic for m in ms} >= {TOPICS.link(0, 4), TOPICS.status(0)})]
        at_core += [m.topic for m in core.receive(0.5)]
        assert TOPICS.link(0, 1) not in at_core  # the site-local frame never left site s0
        up, down = sites.uplink_bytes()["s0"]
        assert up > len(b"cross") and down > 0
    finally:
        for t in (core, a0, a1, a4):
            t.close()


def test_a_cut_bridge_stops_cross_site_frames_until_healed(sites: SiteBrokers) -> None:
    a0 = _agent(sites, 0, [TOPICS.links_to(0)])
    a1 = _agent(sites, 1, [TOPICS.links_to(1)])
    a4 = _agent(sites, 4, [TOPICS.links_to(4)])
    try:
        publish_until_received(a0, TOPICS.link(0, 4), b"before", a4)
        before = {n: sites.bridge_connections(n) for n in sites.sites}
        sites.cut_bridge("s0")
        time.sleep(0.5)
        a0.publish(TOPICS.link(0, 4), b"during")
        a0.publish(TOPICS.link(0, 1), b"inside")
        assert collect(a1, lambda ms: any(m.payload == b"inside" for m in ms))  # the site goes on
        time.sleep(1.0)
        assert all(m.payload != b"during" for m in a4.receive(0.5))
        sites.heal_bridge("s0")
        sites.wait_bridged(after={"s0": before["s0"]})
        publish_until_received(a0, TOPICS.link(0, 4), b"after", a4)
    finally:
        for t in (a0, a1, a4):
            t.close()


def test_a_traced_uplink_notes_when_it_carried_a_frame_each_way_across_a_cut(
        sites: SiteBrokers, tmp_path: Path) -> None:
    sites.trace_uplinks()
    a0 = _agent(sites, 0, [TOPICS.links_to(0)])
    a4 = _agent(sites, 4, [TOPICS.links_to(4)])
    frame = bytes(200_000)
    try:
        before = {n: sites.bridge_connections(n) for n in sites.sites}
        sites.cut_bridge("s1")
        sites.heal_bridge("s1")  # the trace goes on in the new proxy
        sites.wait_bridged(after={"s1": before["s1"]})
        sent = time.time()
        publish_until_received(a0, TOPICS.link(0, 4), frame, a4)
        sites.write_uplink_trace(tmp_path / "trace.json")
    finally:
        for t in (a0, a4):
            t.close()
    trace = json.loads((tmp_path / "trace.json").read_text())
    for site, way in (("s0", "up"), ("s1", "down")):  # out of site s0, into site s1
        writes = [(t, n) for t, n in trace[site][way] if t >= sent]
        assert sum(n for _, n in writes) >= len(frame), (site, way, writes)
        assert all(t <= time.time() for t, _ in writes)
    assert sum(n for _, n in trace["s0"]["down"]) < len(frame)  # nothing of it came back


def test_an_untraced_set_writes_no_uplink_trace(sites: SiteBrokers, tmp_path: Path) -> None:
    sites.write_uplink_trace(tmp_path / "trace.json")
    assert not (tmp_path / "trace.json").exists()


def test_a_bridge_cut_for_long_redials_within_seconds_of_the_heal(sites: SiteBrokers) -> None:
    """The site's broker keeps dialling the core every 1-2 s however long the cut: its agents
    rejoin as soon as the uplink is back. (mosquitto's default backoff, or a single
    restart_timeout value, which 2.0.11 ignores, left a site away 7-19 s after a 20 s cut.)"""
    before = sites.bridge_connections("s1")
    sites.cut_bridge("s1")
    time.sleep(15.0)  # the default backoff is at 5-30 s between dials by now
    healed = time.monotonic()
    sites.heal_bridge("s1")
    sites.wait_bridged(timeout=30.0, after={"s1": before})
    assert time.monotonic() - healed < 4.0


def test_broker_command_starts_bridged_sites(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgegrove.cli", "broker", "--sites", "2", "--nodes", "4", "--json",
         "--job", TOPICS.job, "--workdir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        assert info["kind"] == "mosquitto-sites"
        assert [s["ids"] for s in info["sites"].values()] == [[0, 1], [2, 3]]
        creds = json.loads(Path(info["credentials"]).read_text())["agents"]
        clients = []
        for node, site in ((0, "s0"), (3, "s1")):
            entry = creds[str(node)]
            t = MqttTransport(entry["client_id"], info["sites"][site]["url"],
                              username=entry["username"], password=entry["password"])
            t.connect([TOPICS.links_to(node)])
            clients.append(t)
        publish_until_received(clients[0], TOPICS.link(0, 3), b"hi", clients[1])
        for t in clients:
            t.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


# -- sites in network namespaces (simulate --site-netns) ----------------------------------

_PUBLISH_FROM_INSIDE = """
import sys, time
from agent.transport.mqtt import MqttTransport
url, user, password, client_id = sys.argv[1:5]
t = MqttTransport(client_id, url, username=user, password=password)
t.connect([])
for _ in range(40):
    for topic in sys.argv[5:]:
        t.publish(topic, b"from-inside")
    time.sleep(0.1)
t.close()
"""


@pytest.mark.skipif(bool(kernel_shaping_supported()), reason="needs root, ip, tc and iptables")
def test_sites_in_namespaces_reach_the_core_only_over_their_shaped_uplink(tmp_path: Path) -> None:
    with start_sites(tmp_path / "brokers", job=TOPICS.job, nodes=6, sites=2, netns=True) as sites:
        names = {site: ns.name for site, ns in sites.namespaces.items()}
        host_ns = os.readlink("/proc/self/ns/net")
        broker_ns = {site: os.readlink(f"/proc/{b.pid}/ns/net") for site, b in sites.sites.items()}
        assert host_ns not in broker_ns.values() and broker_ns["s0"] != broker_ns["s1"]
        with pytest.raises(OSError):  # the site's broker listens in its namespace only
            socket.create_connection(("127.0.0.1", sites.sites["s1"].port), timeout=2).close()
        sites.shape_uplinks(2e6, 0.02)
        ns = sites.namespaces["s1"]
        qdisc = subprocess.run([*ns.prefix(), "tc", "qdisc", "show", "dev", ns.ns_if],
                               capture_output=True, text=True, check=True).stdout
        assert "tbf" in qdisc and "rate 16" in qdisc, qdisc  # 2 MB/s of payload: 16.0xMbit
        assert sites.uplinks["s1"].shaping_up.bytes_per_second is None  # the proxy: latency only
        core = _core_watcher(sites)
        try:
            creds = sites.credentials_for(3)
            inside = subprocess.run(
                [*sites.command_prefix(3), sys.executable, "-c", _PUBLISH_FROM_INSIDE, sites.url_for(3),
                 creds.username, creds.password, creds.client_id or "a3",
                 TOPICS.link(3, 0), TOPICS.link(3, 4)],
                capture_output=True, text=True, timeout=60, cwd=REPO)
            assert inside.returncode == 0, inside.stderr[-2000:]
            at_core = {m.topic for m in core.receive(1.0)}
            assert TOPICS.link(3, 0) in at_core  # across the bridge, over the veth
            assert TOPICS.link(3, 4) not in at_core  # site-local: stays in s1
            assert sites.uplink_bytes()["s1"][0] > 0
        finally:
            core.close()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert not any(name in listed for name in names.values()), listed
