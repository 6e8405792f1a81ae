"""Issue 17, the broker side: mosquitto restarted on the same port keeps the retained statuses
and view with persistence (the default) and forgets them without; an external broker's
dynamic security answers the admin of its credentials."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agent.transport.mqtt import MqttTransport
from simulate.brokers import Credentials, DynsecAdmin, MosquittoBroker
from tests.integration.conftest import TOPICS, TransportFactory, collect

RETAINED = [(TOPICS.status(3), b'{"node": 3, "state": "online"}'), (TOPICS.view, b'{"epoch": 7}')]


def _publish_retained(transport: MqttTransport) -> None:
    for topic, payload in RETAINED:
        transport.publish(topic, payload, retain=True, reliable=True)


def _retained_after_restart(broker: MosquittoBroker, make: TransportFactory) -> set[str]:
    """Retained topics a fresh admin subscriber gets from the restarted broker, waited for with
    a probe message published after the subscription (so 'none' is a real answer)."""
    port = broker.port
    writer = make(broker, "admin", [])
    _publish_retained(writer)
    reader = make(broker, "admin", [TOPICS.view, TOPICS.all_status()])
    collect(reader, lambda ms: len(ms) >= len(RETAINED))  # stored before the restart
    writer.close()
    reader.close()
    broker.restart()
    assert broker.port == port and broker.is_running
    fresh = make(broker, "admin", [TOPICS.view, TOPICS.all_status()])
    probe = (TOPICS.status(6), b"probe")
    fresh.publish(*probe)
    got = collect(fresh, lambda ms: any(m.payload == b"probe" for m in ms), timeout=20)
    return {m.topic for m in got if m.retained}


def test_persistence_keeps_retained_statuses_and_view_across_a_restart(
        mosquitto_factory: Callable[..., MosquittoBroker], transport_factory: TransportFactory) -> None:
    broker = mosquitto_factory(dynsec=True)
    assert _retained_after_restart(broker, transport_factory) == {TOPICS.status(3), TOPICS.view}
    assert (broker.workdir / "mosquitto.db").is_file()


def test_without_persistence_a_restart_forgets_them(
        mosquitto_factory: Callable[..., MosquittoBroker], transport_factory: TransportFactory) -> None:
    broker = mosquitto_factory(dynsec=True, persistence=False)
    assert _retained_after_restart(broker, transport_factory) == set()


@pytest.mark.parametrize("dynsec", [True, False])
def test_an_external_brokers_dynsec_answers_its_admin_or_says_why_not(
        mosquitto_factory: Callable[..., MosquittoBroker], dynsec: bool) -> None:
    broker = mosquitto_factory(dynsec=dynsec)
    admin = DynsecAdmin(broker.url, broker.admin_credentials, broker.prefix)
    try:
        problem = admin.probe(timeout=5.0)
    finally:
        admin.close()
    assert (problem == "") is dynsec, problem
    wrong = DynsecAdmin(broker.url, Credentials("admin", "wrong"), broker.prefix)
    assert wrong.probe(timeout=5.0) != ""
