"""Revoking one link at the broker: delivery of link/i/j stops silently while other links
flow, and restoring brings it back. Dynamic security (control API) and acl_file + SIGHUP."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from simulate.brokers import BrokerError, MosquittoBroker
from tests.integration.conftest import (
    TOPICS,
    TransportFactory,
    collect,
    publish_until_received,
    wait_until,
)


@pytest.mark.parametrize("dynsec", [True, False], ids=["dynsec", "acl_file"])
def test_revoked_link_stops_silently_and_restore_brings_it_back(
    mosquitto_factory: Callable[..., MosquittoBroker], transport_factory: TransportFactory,
    dynsec: bool,
) -> None:
    broker = mosquitto_factory(dynsec=dynsec)
    dash = transport_factory(broker, "dashboard", [f"{TOPICS.prefix}/link/#"])
    a0 = transport_factory(broker, 0, [TOPICS.links_to(0)])
    a1 = transport_factory(broker, 1, [])
    a2 = transport_factory(broker, 2, [TOPICS.links_to(2)])

    broker.revoke_link(1, 0)
    if dynsec:
        # mosquitto 2.0 disconnects the clients of a role it changed; agent 1 comes back.
        wait_until(lambda: a1.stats().connects >= 2, what="agent 1 to reconnect")
    publish_until_received(a1, TOPICS.link(1, 2), b"warm-up", a2)
    for i in range(3):
        a1.publish(TOPICS.link(1, 0), b"revoked-%d" % i)
        a1.publish(TOPICS.link(1, 2), b"flows-%d" % i)
    got = collect(dash, lambda ms: any(m.payload == b"flows-2" for m in ms))
    assert {m.topic for m in got} == {TOPICS.link(1, 2)}
    assert a0.receive(0.2) == []
    assert [m.payload for m in collect(a2, lambda ms: len(ms) >= 3)][-3:] == [
        b"flows-0", b"flows-1", b"flows-2"]

    broker.restore_link(1, 0)
    publish_until_received(a1, TOPICS.link(1, 0), b"back", a0)
    if not dynsec:
        assert a1.stats().connects == 1  # acl_file + SIGHUP: no client was disconnected


def test_revoke_needs_a_running_dynsec_or_acl_broker(
    mosquitto_factory: Callable[..., MosquittoBroker],
) -> None:
    broker = mosquitto_factory(dynsec=False)
    broker.stop()
    with pytest.raises(BrokerError, match="not running"):
        broker.revoke_link(1, 0)
