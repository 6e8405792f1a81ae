"""The TLS variant of broker-config/ with a throw-away CA made by openssl."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from agent.transport.base import TransportError
from agent.transport.mqtt import MqttTransport
from simulate.brokers import MosquittoBroker
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
