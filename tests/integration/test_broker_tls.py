"""The TLS variant of broker-config/ with a throw-away CA made by openssl."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pytest

from agent.transport.base import Message, Notice, TransportError
from agent.transport.mqtt import MqttTransport
from simulate.brokers import MosquittoBroker
from simulate.proxy import TcpProxy
from tests.integration.conftest import TOPICS, TransportFactory, collect


def test_tls_listener_round_trip_and_untrusted_certificate_refused(
    mosquitto_factory: Callable[..., MosquittoBroker], transport_factory: TransportFactory
) -> None:
    broker = mosquitto_factory(tls=True, dynsec=False)
    assert broker.url.startswith("mqtts://127.0.0.1:")
    a0 = transport_factory(broker, 0, [TOPICS.links_to(0)])
    a1 = transport_factory(broker, 1, [])
    a1.publish(TOPICS.link(1, 0), b"over tls")
    assert collect(a0, lambda ms: len(ms) >= 1)[0].payload == b"over tls"
    assert a0.tcp_nodelay()

    creds = broker.credentials_for(2)
    # Without our CA the system trust store does not know the broker's certificate.
    stranger = MqttTransport("no-ca", broker.url, username=creds.username,
                             password=creds.password)
    with pytest.raises(TransportError, match="cannot reach the MQTT broker"):
        stranger.connect([])
    # Plain MQTT against the TLS port does not get a CONNACK.
    plain = MqttTransport("plain", broker.url.replace("mqtts://", "mqtt://"),
                          username=creds.username, password=creds.password)
    with pytest.raises(TransportError, match="closed before CONNACK"):
        plain.connect([])


def test_tls_with_dynamic_security_binds_client_ids_and_revokes_links(
    mosquitto_factory: Callable[..., MosquittoBroker],
) -> None:
    """Issue 38: the configuration that binds client ids was plain TCP only. Now TLS and
    dynamic security together: frames cross TLS, an agent's credentials connect only with its
    own client id, and the admin still revokes a link at run time (over TLS)."""
    broker = mosquitto_factory(tls=True, dynsec=True, bind_client_ids=True)
    assert broker.url.startswith("mqtts://") and broker.dynsec
    ca = broker.ca_file
    own, peer = broker.credentials_for(1), broker.credentials_for(0)
    thief = MqttTransport(peer.client_id or "", broker.url, username=own.username,
                          password=own.password, tls_ca=ca)
    with pytest.raises(TransportError, match="refused client"):
        thief.connect([])
    a0 = MqttTransport(peer.client_id or "", broker.url, username=peer.username, password=peer.password, tls_ca=ca)
    a1 = MqttTransport(own.client_id or "", broker.url, username=own.username, password=own.password, tls_ca=ca)
    try:
        a0.connect([TOPICS.links_to(0)])
        a1.connect([])
        a1.publish(TOPICS.link(1, 0), b"over tls")
        assert collect(a0, lambda ms: len(ms) >= 1)[0].payload == b"over tls"
        broker.revoke_link(1, 0)
        a1.publish(TOPICS.link(1, 0), b"revoked")
        time.sleep(1.0)  # nothing may come: waiting is the test
        assert a0.receive(0.2) == []
    finally:
        a0.close()
        a1.close()


def test_small_messages_overtake_bulk_data_over_tls_and_the_stream_stays_whole(
    mosquitto_factory: Callable[..., MosquittoBroker],
) -> None:
    # The sender behind a 1 MB/s proxy, TLS end to end: its socket fills, and a TLS write that
    # could not finish (WANT_WRITE) must be retried with the same bytes. A small message put
    # ahead of that packet broke the TLS stream (SSL BAD_LENGTH, or a PUBLISH spliced into
    # another: mosquitto's "Protocol error"), every connection of a loaded fleet again and again.
    broker = mosquitto_factory(tls=True, dynsec=False)
    host, port = broker.url.rsplit("//", 1)[1].rsplit(":", 1)
    proxy = TcpProxy(host, int(port))
    made: list[MqttTransport] = []
    try:
        listen = proxy.start()
        ends = []
        for node, url in ((1, broker.url), (2, f"mqtts://127.0.0.1:{listen}")):
            creds = broker.credentials_for(node)
            t = MqttTransport(f"itest-tls-slow-{node}", url, username=creds.username, password=creds.password,
                              tls_ca=broker.ca_file, threaded=False)
            made.append(t)
            t.connect([TOPICS.links_to(node)])
            ends.append(t)
        rx, tx = ends
        proxy.set_bandwidth(1_000_000)
        bulk = [np.random.default_rng(i).bytes(500_000) for i in range(4)]
        small = [f"ack {i}".encode() for i in range(len(bulk))]
        got: list[Message] = []
        for payload in bulk[:2]:  # a second's backlog: the kernel takes no more (SENDING)
            tx.publish(TOPICS.link(2, 1), payload)
        sending = 0
        deadline = time.monotonic() + 30.0
        while not sending and time.monotonic() < deadline:
            sending += sum(m.notice is Notice.SENDING for m in tx.receive(0.01))
            got += rx.receive(0.01)
        assert sending
        for payload, ack in zip(bulk[2:], small[2:], strict=True):
            tx.publish(TOPICS.link(2, 1), payload)
            tx.publish(TOPICS.link(2, 1), ack)  # behind a packet the TLS layer may have begun
            got += rx.receive(0.0)
        for ack in small[:2]:
            tx.publish(TOPICS.link(2, 1), ack)
        while sum(m.topic == TOPICS.link(2, 1) for m in got) < 2 * len(bulk) and time.monotonic() < deadline:
            tx.receive(0.01)
            got += rx.receive(0.01)
        frames = [m.payload for m in got if m.topic == TOPICS.link(2, 1)]
        assert [f for f in frames if f not in small] == bulk
        assert sorted(f for f in frames if f in small) == sorted(small)
        assert frames.index(small[-1]) < frames.index(bulk[-1])  # it did overtake
        assert tx.stats().connects == 1 and tx.stats().unsent == 0
    finally:
        for t in made:
            t.close()
        proxy.stop()
