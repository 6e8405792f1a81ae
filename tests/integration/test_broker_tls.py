"""The TLS variant of broker-config/ with a throw-away CA made by openssl."""

from __future__ import annotations

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
