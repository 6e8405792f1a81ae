"""The ACL of broker-config/ (both as acl_file and as dynamic-security roles): an agent can
publish only its own link/status/telemetry, a client without credentials cannot connect."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agent.transport.base import TransportError
from agent.transport.mqtt import MqttTransport
from simulate.brokers import MosquittoBroker
from tests.integration.conftest import TOPICS, TransportFactory, collect


@pytest.fixture(params=["dynsec", "acl_file"])
def broker(request: pytest.FixtureRequest,
           mosquitto_factory: Callable[..., MosquittoBroker]) -> MosquittoBroker:
    return mosquitto_factory(dynsec=request.param == "dynsec")


def test_agent_cannot_publish_as_another_agent(
    broker: MosquittoBroker, transport_factory: TransportFactory
) -> None:
    dash = transport_factory(broker, "dashboard", [f"{TOPICS.prefix}/#"])
    a1 = transport_factory(broker, 1, [])
    forged = [TOPICS.link(2, 0), TOPICS.link(2, 1), TOPICS.status(2), TOPICS.telemetry(2),
              TOPICS.control, TOPICS.view_of(2), TOPICS.view, TOPICS.suspect(2), TOPICS.fanout(2),
              TOPICS.state(2)]
    for topic in forged:
        a1.publish(topic, b"forged")
    own = [TOPICS.link(1, 0), TOPICS.status(1), TOPICS.telemetry(1), TOPICS.suspect(1),
           TOPICS.fanout(1), TOPICS.state(1), TOPICS.view_of(1)]
    for topic in own:
        a1.publish(topic, b"own")
    # One publisher's messages reach the dashboard in order: once the last allowed one is
    # in, any forged one the broker let through would have arrived before it.
    got = collect(dash, lambda ms: any(m.topic == TOPICS.view_of(1) for m in ms))
    assert [m.topic for m in got] == own
    assert all(m.payload == b"own" for m in got)


def test_agent_cannot_read_frames_meant_for_another_agent(
    broker: MosquittoBroker, transport_factory: TransportFactory
) -> None:
    snoop = [TOPICS.links_to(2), TOPICS.links_to(1)]
    if broker.dynsec:
        # Dynamic security refuses the subscription itself (SUBACK failure).
        with pytest.raises(TransportError, match="refused the subscription"):
            transport_factory(broker, 1, snoop)
        snoop = snoop[1:]
    # With acl_file, mosquitto grants any subscription and filters each delivery instead.
    spy = transport_factory(broker, 1, [*snoop, TOPICS.all_status(), TOPICS.all_views(),
                                        TOPICS.control, TOPICS.all_fanout()])
    admin = transport_factory(broker, "admin", [])
    admin.publish(TOPICS.link(0, 2), b"for agent 2")
    admin.publish(TOPICS.fanout(0), b"for every member")  # the fan-out is every member's to read
    admin.publish(TOPICS.link(0, 1), b"for agent 1")
    got = collect(spy, lambda ms: any(m.payload == b"for agent 1" for m in ms))
    assert [m.payload for m in got] == [b"for every member", b"for agent 1"]


@pytest.mark.parametrize("username,password", [(None, None), ("agent-1", "wrong"),
                                               ("intruder", "x")])
def test_clients_without_valid_credentials_cannot_connect(
    broker: MosquittoBroker, username: str | None, password: str | None
) -> None:
    transport = MqttTransport("intruder", broker.url, username=username, password=password)
    with pytest.raises(TransportError, match="refused client 'intruder'"):
        transport.connect([TOPICS.all_status()])
    assert not transport.is_connected


def test_an_agents_credentials_connect_only_with_its_own_client_id(
    mosquitto_factory: Callable[..., MosquittoBroker],
) -> None:
    """Issue 16: mosquitto lets any user take any client id (the old session is kicked off),
    so one device's credentials could halt another. With dynamic security each agent user is
    bound to the client id in credentials.json (whose random part nobody else knows)."""
    broker = mosquitto_factory(dynsec=True, bind_client_ids=True)
    own, other = broker.credentials_for(3), broker.credentials_for(0)
    assert own.client_id and other.client_id and own.client_id != other.client_id
    assert own.client_id.startswith(f"edgegrove-{broker.job}-3-")
    for client_id in (other.client_id, f"edgegrove-{broker.job}-0", "anything"):
        thief = MqttTransport(client_id, broker.url, username=own.username, password=own.password)
        with pytest.raises(TransportError, match="refused client"):
            thief.connect([])
    mine = MqttTransport(own.client_id, broker.url, username=own.username, password=own.password)
    try:
        mine.connect([TOPICS.all_status()])
        assert mine.is_connected
    finally:
        mine.close()
