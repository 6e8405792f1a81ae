"""MqttTransport against a real mosquitto (and the embedded broker): round trip, retained
status, the Last Will of a SIGKILLed process, reconnect after a broker restart."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from agent.protocol.messages import Status
from agent.transport.base import Message, Notice, TransportError, Will
from agent.transport.mqtt import MqttTransport
from simulate.brokers import EmbeddedBroker, MosquittoBroker, free_port
from tests.integration.conftest import (
    TOPICS,
    TransportFactory,
    collect,
    publish_until_received,
    wait_until,
)

REPO = Path(__file__).resolve().parents[2]


def status_msg(node: int, state: str) -> Message:
    return Message(TOPICS.status(node), Status(node=node, state=state).encode(),  # type: ignore[arg-type]
                   retained=True)


@pytest.mark.parametrize("protocol", ["3.1.1", "5"])
def test_link_frames_round_trip_between_two_agents(
    mosquitto_broker: MosquittoBroker, transport_factory: TransportFactory, protocol: str
) -> None:
    a1 = transport_factory(mosquitto_broker, 1, [TOPICS.links_to(1)], protocol=protocol)
    a2 = transport_factory(mosquitto_broker, 2, [TOPICS.links_to(2)], protocol=protocol)
    frames = [np.random.default_rng(i).bytes(65536) for i in range(5)]
    for frame in frames:
        a1.publish(TOPICS.link(1, 2), frame)
    a2.publish(TOPICS.link(2, 1), b"ack")

    got = collect(a2, lambda ms: len(ms) >= 5)
    assert [m.payload for m in got] == frames  # one publisher, QoS 0: order kept on loopback
    assert all(m.topic == TOPICS.link(1, 2) for m in got)
    assert collect(a1, lambda ms: len(ms) >= 1)[0].payload == b"ack"
    assert a1.tcp_nodelay() and a2.tcp_nodelay()
    assert a1.stats().bytes_sent == 5 * 65536 and a1.stats().messages_sent == 5
    assert a2.stats().bytes_received == 5 * 65536 and a2.dropped() == 0


def test_full_receive_queue_drops_and_counts_instead_of_blocking(
    mosquitto_broker: MosquittoBroker, transport_factory: TransportFactory
) -> None:
    a0 = transport_factory(mosquitto_broker, 0, [TOPICS.links_to(0)], queue_size=3)
    a1 = transport_factory(mosquitto_broker, 1, [])
    for i in range(10):
        a1.publish(TOPICS.link(1, 0), bytes([i]))
    wait_until(lambda: a0.stats().messages_received == 10, what="10 messages at agent 0")
    assert [m.payload for m in a0.receive(0.0)] == [b"\x00", b"\x01", b"\x02"]
    assert a0.dropped() == 7
    # The byte bound works the same way: 3 frames of 40 KB do not fit into 100 KB.
    a2 = transport_factory(mosquitto_broker, 2, [TOPICS.links_to(2)], queue_bytes=100_000)
    for i in range(3):
        a1.publish(TOPICS.link(1, 2), bytes([i]) * 40_000)
    wait_until(lambda: a2.stats().messages_received == 3, what="3 messages at agent 2")
    assert [m.payload[0] for m in a2.receive(0.0)] == [0, 1]
    assert a2.dropped() == 1
    a1.publish(TOPICS.link(1, 2), b"room again")  # draining freed the space
    assert collect(a2, lambda ms: len(ms) >= 1)[0].payload == b"room again"


_HOLDER = """
import sys
from agent.transport.base import Message, Will
from agent.transport.mqtt import MqttTransport
url, user, password, topic, online, offline = sys.argv[1:7]
t = MqttTransport("holder", url, username=user, password=password)
t.connect([], Will(topic, offline.encode()), Message(topic, online.encode(), True))
print("CONNECTED", flush=True)
sys.stdin.read()  # hold the connection until killed
"""


def test_retained_online_status_and_last_will_offline_after_sigkill(
    mosquitto_broker: MosquittoBroker, transport_factory: TransportFactory
) -> None:
    creds = mosquitto_broker.credentials_for(3)
    online, offline = status_msg(3, "online"), status_msg(3, "offline")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, mosquitto_broker.url, creds.username, creds.password,
         online.topic, online.payload.decode(), offline.payload.decode()],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "CONNECTED"
        # The holder's publish is asynchronous: once a first subscriber has it (live or
        # retained), the broker holds it, and a subscriber after that gets it retained.
        probe = transport_factory(mosquitto_broker, "dashboard", [TOPICS.all_status()])
        assert collect(probe, lambda ms: len(ms) >= 1)[0].payload == online.payload
        dash = transport_factory(mosquitto_broker, "dashboard", [TOPICS.all_status()])
        first = collect(dash, lambda ms: len(ms) >= 1)[0]
        assert (first.payload, first.retained) == (online.payload, True)
        proc.kill()
        proc.wait(10)
        will = collect(dash, lambda ms: len(ms) >= 1)[0]
        assert Status.decode(will.payload) == Status(node=3, state="offline")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    # ... and the Will was retained: a newcomer learns that node 3 is offline.
    late = transport_factory(mosquitto_broker, "dashboard", [TOPICS.all_status()])
    assert collect(late, lambda ms: len(ms) >= 1)[0] == offline


def test_close_is_clean_so_the_broker_does_not_send_the_will(
    mosquitto_broker: MosquittoBroker, transport_factory: TransportFactory
) -> None:
    dash = transport_factory(mosquitto_broker, "dashboard", [TOPICS.all_status()])
    a4 = transport_factory(mosquitto_broker, 4, [], will=Will(TOPICS.status(4), b"offline"),
                           birth=Message(TOPICS.status(4), b"online", True))
    assert collect(dash, lambda ms: len(ms) >= 1)[0].payload == b"online"
    a4.publish(TOPICS.status(4), b"bye", retain=True)
    a4.close()
    with pytest.raises(TransportError, match="closed"):
        a4.publish(TOPICS.status(4), b"late")
    # The final message published before close() arrives; the Will never does.
    assert collect(dash, lambda ms: len(ms) >= 1)[0].payload == b"bye"
    marker = transport_factory(mosquitto_broker, 5, [])
    marker.publish(TOPICS.status(5), b"marker")
    got = collect(dash, lambda ms: any(m.payload == b"marker" for m in ms))
    assert [m.payload for m in got] == [b"marker"]


def test_reconnects_resubscribes_and_rebirths_after_a_broker_restart(
    mosquitto_broker: MosquittoBroker, transport_factory: TransportFactory
) -> None:
    a1 = transport_factory(mosquitto_broker, 1, [TOPICS.links_to(1)],
                           birth=status_msg(1, "online"))
    a2 = transport_factory(mosquitto_broker, 2, [])
    publish_until_received(a2, TOPICS.link(2, 1), b"before", a1)

    mosquitto_broker.restart()  # persistence is off: retained messages and sessions are gone
    wait_until(lambda: a1.stats().connects >= 2 and a2.stats().connects >= 2,
               what="both transports reconnected")
    # The runtime is told (the agent core then says again who it is, and waits for the
    # statuses a restarted broker has lost before it decides any view).
    assert any(m.notice is Notice.RECONNECTED for m in collect(a1, lambda ms: any(m.notice is Notice.RECONNECTED for m in ms)))
    publish_until_received(a2, TOPICS.link(2, 1), b"after", a1)
    # The birth message was re-published on reconnect, so the retained status is back.
    dash = transport_factory(mosquitto_broker, "dashboard", [TOPICS.status(1)])
    assert collect(dash, lambda ms: len(ms) >= 1)[0] == status_msg(1, "online")


def test_unreachable_broker_and_bad_url_give_readable_errors() -> None:
    with pytest.raises(TransportError, match="cannot reach the MQTT broker"):
        MqttTransport("x", f"mqtt://127.0.0.1:{free_port()}").connect([])
    with pytest.raises(ValueError, match="mqtt://HOST:PORT"):
        MqttTransport("x", "http://127.0.0.1:1883")


def test_embedded_broker_round_trip_with_paced_publishing(
    embedded_broker: EmbeddedBroker, transport_factory: TransportFactory
) -> None:
    a0 = transport_factory(embedded_broker, None, [TOPICS.links_to(0)])
    a1 = transport_factory(embedded_broker, None, [TOPICS.view],
                           max_publish_bytes_per_s=20e6, publish_burst_bytes=256 * 1024)
    frames = [bytes([i]) * 65536 for i in range(40)]
    for frame in frames:
        a1.publish(TOPICS.link(1, 0), frame)
    assert [m.payload for m in collect(a0, lambda ms: len(ms) >= 40)] == frames
    assert a1.stats().paced_seconds > 0  # 2.6 MB through a 256 KB burst had to wait
    a0.publish(TOPICS.view, b"view-1", retain=True)
    assert collect(a1, lambda ms: len(ms) >= 1)[0].payload == b"view-1"
