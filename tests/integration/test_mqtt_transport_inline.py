"""MqttTransport with ``threaded=False`` (agents' mode: paho's loop driven by ``receive``)
against a real mosquitto: round trip of many frames, the Will, reconnect after a restart."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from agent.protocol.chunking import (
    SLOW_DOWNLINK_RATE,
    SLOW_LINK_CHUNK_VALUES,
    DownlinkRate,
    chunk_values_for,
)
from agent.transport.base import Message, Notice, Will
from agent.transport.mqtt import MqttTransport
from simulate.brokers import MosquittoBroker
from simulate.proxy import TcpProxy
from tests.integration.conftest import TOPICS, TransportFactory, collect, publish_until_received

pytestmark = pytest.mark.integration


def test_frames_round_trip_in_order_with_no_paho_thread(
    mosquitto_broker: MosquittoBroker, transport_factory: TransportFactory
) -> None:
    a1 = transport_factory(mosquitto_broker, 1, [TOPICS.links_to(1)], threaded=False)
    a2 = transport_factory(mosquitto_broker, 2, [TOPICS.links_to(2)], threaded=False)
    assert a1._client._thread is None and a2._client._thread is None
    frames = [np.random.default_rng(i).bytes(65536 * (1 + i % 4)) for i in range(40)]
    for frame in frames:
        a1.publish(TOPICS.link(1, 2), frame)
    a2.publish(TOPICS.link(2, 1), b"ack")
    # What the socket did not take at once goes out from the sender's ``receive``: drive both.
    got: list[Message] = []
    acks: list[Message] = []
    deadline = time.monotonic() + 10.0
    while (len(got) < len(frames) or not acks) and time.monotonic() < deadline:
        # Only the link topics: on a loaded host the transport also says that what it
        # published is still waiting to leave (a SENDING notice with no payload).
        acks += [m for m in a1.receive(0.01) if m.topic == TOPICS.link(2, 1)]
        got += [m for m in a2.receive(0.01) if m.topic == TOPICS.link(1, 2)]
    assert [m.payload for m in got] == frames
    assert [m.payload for m in acks] == [b"ack"]
    assert a1.tcp_nodelay() and a2.stats().bytes_received == sum(map(len, frames))


@pytest.mark.parametrize("protocol", ["3.1.1", "5"])
@pytest.mark.parametrize("threaded", [False, True])
def test_payloads_of_every_size_arrive_whole_through_both_read_paths(
    mosquitto_broker: MosquittoBroker, transport_factory: TransportFactory, protocol: str, threaded: bool
) -> None:
    # The transport reads large QoS 0 PUBLISHes of MQTT 3.1.1 into one buffer per packet;
    # MQTT 5 and QoS 1 deliveries take paho's own code. Sizes around the switch and beyond
    # one socket read (3 MB arrives in many pieces).
    rx = transport_factory(mosquitto_broker, 1, [TOPICS.links_to(1)], protocol=protocol, threaded=threaded)
    tx = transport_factory(mosquitto_broker, 2, [], protocol=protocol, threaded=threaded)
    payloads = [np.random.default_rng(n).bytes(n) for n in (1, 100, 4096, 4097, 70000, 1 << 20, 3 << 20)]
    for i, payload in enumerate(payloads):
        tx.publish(TOPICS.link(2, 1), payload, reliable=bool(i % 2))
    got: list[Message] = []
    deadline = time.monotonic() + 10.0
    while len(got) < len(payloads) and time.monotonic() < deadline:
        tx.receive(0.0)  # inline: what the socket did not take at once goes out from here
        # (a loaded host may also report the 3 MB one as still arriving: not a message)
        got += [m for m in rx.receive(0.01) if m.notice is not Notice.ARRIVING]
    assert [m.payload for m in got] == payloads
    assert all(type(m.payload) is bytes and m.topic == TOPICS.link(2, 1) for m in got)


def test_receive_waits_for_the_first_message_only_as_long_as_asked(
    mosquitto_broker: MosquittoBroker, transport_factory: TransportFactory
) -> None:
    a1 = transport_factory(mosquitto_broker, 1, [TOPICS.links_to(1)], threaded=False)
    t0 = time.monotonic()
    assert a1.receive(0.2) == []
    waited = time.monotonic() - t0
    # At least what was asked, and it returns: the upper bound catches a receive that goes on
    # waiting and leaves a loaded host (load 30 beside several fleets) seconds to wake us.
    assert 0.15 <= waited < 0.2 + 3.0, waited


def test_clean_close_sends_no_will_and_flushes_the_last_message(
    mosquitto_broker: MosquittoBroker, transport_factory: TransportFactory
) -> None:
    dash = transport_factory(mosquitto_broker, "dashboard", [TOPICS.all_status()])
    a4 = transport_factory(mosquitto_broker, 4, [], will=Will(TOPICS.status(4), b"offline"),
                           birth=Message(TOPICS.status(4), b"online", True), threaded=False)
    assert collect(dash, lambda ms: len(ms) >= 1)[0].payload == b"online"
    a4.publish(TOPICS.status(4), b"bye", retain=True)
    a4.close()
    assert collect(dash, lambda ms: len(ms) >= 1)[0].payload == b"bye"
    marker = transport_factory(mosquitto_broker, 5, [])
    marker.publish(TOPICS.status(5), b"marker")
    got = collect(dash, lambda ms: any(m.payload == b"marker" for m in ms))
    assert [m.payload for m in got] == [b"marker"]


def test_reconnects_resubscribes_and_rebirths_after_a_broker_restart(
    mosquitto_broker: MosquittoBroker, transport_factory: TransportFactory
) -> None:
    a1 = transport_factory(mosquitto_broker, 1, [TOPICS.links_to(1)], threaded=False,
                           birth=Message(TOPICS.status(1), b"online", True))
    a2 = transport_factory(mosquitto_broker, 2, [])
    publish_until_received(a2, TOPICS.link(2, 1), b"before", a1)
    mosquitto_broker.restart()
    # Nobody else drives a1's loop: receive() notices the loss, reconnects and says so.
    assert any(m.notice is Notice.RECONNECTED for m in collect(a1, lambda ms: any(m.notice is Notice.RECONNECTED for m in ms)))
    assert a1.stats().connects >= 2
    publish_until_received(a2, TOPICS.link(2, 1), b"after", a1)
    dash = transport_factory(mosquitto_broker, "dashboard", [TOPICS.status(1)])
    assert collect(dash, lambda ms: len(ms) >= 1)[0].payload == b"online"


def test_a_hung_broker_is_left_at_the_keepalive_although_quiet_links_ping_again(
    mosquitto_broker: MosquittoBroker, transport_factory: TransportFactory
) -> None:
    """A stopped mosquitto: its kernel still ACKs our bytes, but no PINGRESP comes. A quiet
    transport pings again every PROBE_QUIET_S while one is pending (a cut may have taken the
    PINGRESP after the ACK); the keepalive still counts from the first ping, so the broker that
    is hung is left after it, not never."""
    a1 = transport_factory(mosquitto_broker, 1, [TOPICS.links_to(1)], threaded=False, keepalive=4)
    pid = mosquitto_broker.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        stopped = time.monotonic()
        got = collect(a1, lambda ms: any(m.notice is Notice.DISCONNECTED for m in ms), timeout=15)
        left_after = time.monotonic() - stopped
    finally:
        os.kill(pid, signal.SIGCONT)
    print(f"hung broker left after {left_after:.2f} s (keepalive 4 s)")
    assert any(m.notice is Notice.DISCONNECTED for m in got) and left_after <= 8
    collect(a1, lambda ms: any(m.notice is Notice.RECONNECTED for m in ms), timeout=15)


def test_a_slow_link_shows_its_backlog_and_small_messages_overtake_bulk_data(
    mosquitto_broker: MosquittoBroker,
) -> None:
    # Both agents behind a 1 MB/s proxy each way (issue 19): the sender reports its send
    # backlog (SENDING), the receiver the large frame arriving piece by piece (ARRIVING, with
    # its topic), and a small message published after bulk data overtakes it.
    host, port = mosquitto_broker.url.rsplit("//", 1)[1].rsplit(":", 1)
    proxies = [TcpProxy(host, int(port)) for _ in range(2)]
    made: list[MqttTransport] = []
    try:
        ends = []
        for node, proxy in zip((1, 2), proxies, strict=True):
            listen = proxy.start()
            creds = mosquitto_broker.credentials_for(node)
            t = MqttTransport(f"itest-slow-{node}", f"mqtt://127.0.0.1:{listen}", username=creds.username,
                              password=creds.password, threaded=False)
            made.append(t)
            t.connect([TOPICS.links_to(node)])
            ends.append(t)
        rx, tx = ends
        for proxy in proxies:
            proxy.set_bandwidth(1_000_000)
        bulk = [np.random.default_rng(i).bytes(500_000) for i in range(4)]
        # Two frames, a second's backlog at 1 MB/s: with one, a host loaded enough to stall
        # this thread for half a second (CI beside a fleet) saw it drain before it looked.
        for payload in bulk[:2]:
            tx.publish(TOPICS.link(2, 1), payload)
        got: list[Message] = []
        sending = 0
        deadline = time.monotonic() + 20.0
        while not sending and time.monotonic() < deadline:  # the backlog lasts: SENDING
            sending += sum(m.notice is Notice.SENDING for m in tx.receive(0.01))
            got += rx.receive(0.01)
        assert sending
        for payload in bulk[2:]:
            tx.publish(TOPICS.link(2, 1), payload)
        tx.publish(TOPICS.link(2, 1), b"ack")
        while sum(m.topic == TOPICS.link(2, 1) for m in got) < 5 and time.monotonic() < deadline:
            sending += sum(m.notice is Notice.SENDING for m in tx.receive(0.01))
            got += rx.receive(0.01)
        frames = [m.payload for m in got if m.topic == TOPICS.link(2, 1)]
        # Once the backlog showed, the kernel keeps little and the rest waits in the transport,
        # where the small message overtakes it (not the packet already begun: MQTT cannot split it).
        assert frames.index(b"ack") < frames.index(bulk[-1]) and [f for f in frames if f != b"ack"] == bulk
        arriving = [m for m in got if m.notice is Notice.ARRIVING]
        assert arriving and all(m.about == TOPICS.link(2, 1) for m in arriving)
        # Each large frame is timed, first byte to last, just before it is handed over: the
        # downlink's rate, what the coordinator picks the fleet's chunk size from.
        assert [m.arrival > 0 for m in got if m.topic == TOPICS.link(2, 1)] == [
            f != b"ack" for f in frames]  # the ACK is too small to time
        rate = DownlinkRate()
        for m in got:
            rate.observe(len(m.payload), m.arrival)
        measured = rate.rate()
        assert measured is not None and 0.5e6 < measured < 1.5e6
        assert chunk_values_for(measured, 0, 262_144) == SLOW_LINK_CHUNK_VALUES
    finally:
        for t in made:
            t.close()
        for proxy in proxies:
            proxy.stop()


def test_fast_links_report_no_backlog_and_no_slow_arrival(
    mosquitto_broker: MosquittoBroker, transport_factory: TransportFactory
) -> None:
    rx = transport_factory(mosquitto_broker, 1, [TOPICS.links_to(1)], threaded=False)
    tx = transport_factory(mosquitto_broker, 2, [TOPICS.links_to(2)], threaded=False)
    payloads = [np.random.default_rng(i).bytes(1 << 20) for i in range(4)]
    for payload in payloads:
        tx.publish(TOPICS.link(2, 1), payload)
    got: list[Message] = []
    seen: list[Message] = []
    deadline = time.monotonic() + 10.0
    while sum(m.topic == TOPICS.link(2, 1) for m in got) < 4 and time.monotonic() < deadline:
        seen += tx.receive(0.005)
        got += rx.receive(0.005)
    assert [m.payload for m in got if m.topic == TOPICS.link(2, 1)] == payloads
    assert [m.notice for m in got + seen if m.notice in (Notice.ARRIVING, Notice.SENDING)] == []
    # Timed too, and fast: the fleet keeps its large chunks on loopback, however loaded.
    rate = DownlinkRate()
    for m in got:
        rate.observe(len(m.payload), m.arrival)
    measured = rate.rate()
    assert measured is not None and measured > SLOW_DOWNLINK_RATE
