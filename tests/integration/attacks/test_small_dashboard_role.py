"""The dashboard's broker users, on a real dynamic-security mosquitto (issue 54): ``dashboard``
reads the job and may publish nothing; ``dashboard-control`` (the dashboard with fault
controls) may also publish the job's control topic, and nothing else. Neither is the admin.

MQTT 5 answers every QoS 1 publish with its reason: mosquitto says "not authorized" (0x87) for
one its ACL denies, so each refusal is read from the broker itself, not inferred from silence;
an admin listening on the whole job confirms that nothing refused was delivered."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from simulate.brokers import Credentials, MosquittoBroker
from tests.integration.conftest import TOPICS, wait_until

pytestmark = pytest.mark.integration
NOT_AUTHORIZED = 0x87
SUCCESS = 0x00

# What an agent (or the operator, or the admin) publishes: none of it is the dashboard's.
FORBIDDEN = [TOPICS.status(0), TOPICS.link(0, 1), TOPICS.fanout(0), TOPICS.view_of(0),
             TOPICS.suspect(0), TOPICS.state(0), TOPICS.telemetry(0), TOPICS.view,
             "edgegrove/devices/pi-1", "edgegrove/jobs/job-1/spec", "edgegrove/jobs/job-1/control",
             "$CONTROL/dynamic-security/v1"]


class V5Client:
    """A paho MQTT 5 client that keeps each QoS 1 publish's PUBACK reason code."""

    def __init__(self, broker: MosquittoBroker, creds: Credentials, name: str) -> None:
        self.acks: dict[int, int] = {}
        self.granted: list[int] = []
        self.received: list[str] = []
        self._lock = threading.Lock()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"itest-{name}",
                                  protocol=mqtt.MQTTv5)
        self.client.username_pw_set(creds.username, creds.password)
        self.client.on_publish = self._on_publish
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = self._on_message
        connected = threading.Event()
        self.client.on_connect = lambda *a: connected.set() if not a[3].is_failure else None
        host, port = broker.url.split("//")[1].split(":")
        self.client.connect(host, int(port))
        self.client.loop_start()
        assert connected.wait(30), f"{creds.username} could not connect"

    def _on_publish(self, _c: Any, _u: Any, mid: int, reason: Any, _p: Any) -> None:
        with self._lock:
            self.acks[mid] = reason.value

    def _on_subscribe(self, _c: Any, _u: Any, _mid: int, reasons: list[Any], _p: Any) -> None:
        with self._lock:
            self.granted += [r.value for r in reasons]

    def _on_message(self, _c: Any, _u: Any, message: mqtt.MQTTMessage) -> None:
        with self._lock:
            self.received.append(message.topic)

    def publish(self, topic: str) -> int:
        """The broker's reason code for one QoS 1 publish on ``topic``."""
        mid = self.client.publish(topic, b'{"forged": true}', qos=1).mid
        wait_until(lambda: mid in self.acks, what=f"the PUBACK of {topic}")
        return self.acks[mid]

    def subscribe(self, topic: str) -> int:
        before = len(self.granted)
        self.client.subscribe(topic, qos=1)
        wait_until(lambda: len(self.granted) > before, what=f"the SUBACK of {topic}")
        return self.granted[before]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def clients(mosquitto_broker: MosquittoBroker) -> Iterator[Callable[[Credentials, str], V5Client]]:
    made: list[V5Client] = []

    def make(creds: Credentials, name: str) -> V5Client:
        made.append(V5Client(mosquitto_broker, creds, name))
        return made[-1]

    yield make
    for client in made:
        client.close()


def test_the_dashboard_reads_the_job_and_publishes_nothing(
    mosquitto_broker: MosquittoBroker, clients: Callable[[Credentials, str], V5Client]
) -> None:
    admin = clients(mosquitto_broker.admin_credentials, "admin")
    assert admin.subscribe(f"{TOPICS.prefix}/#") < 0x80
    dashboard = clients(mosquitto_broker.dashboard_credentials, "dashboard")
    assert dashboard.subscribe(f"{TOPICS.prefix}/#") < 0x80  # it watches the whole job
    assert dashboard.subscribe("$CONTROL/dynamic-security/#") == NOT_AUTHORIZED
    refused = {topic: dashboard.publish(topic) for topic in [*FORBIDDEN, TOPICS.control]}
    assert refused == {topic: NOT_AUTHORIZED for topic in refused}
    # The admin's status after them reaches both: nothing the dashboard sent reached anybody.
    assert admin.publish(TOPICS.status(5)) == SUCCESS
    wait_until(lambda: TOPICS.status(5) in dashboard.received and TOPICS.status(5) in admin.received,
               what="the admin's status at the dashboard")
    assert admin.received == [TOPICS.status(5)]


def test_the_dashboard_with_controls_may_publish_control_alone(
    mosquitto_broker: MosquittoBroker, clients: Callable[[Credentials, str], V5Client]
) -> None:
    admin = clients(mosquitto_broker.admin_credentials, "admin")
    assert admin.subscribe(f"{TOPICS.prefix}/#") < 0x80
    control = clients(mosquitto_broker.dashboard_control_credentials, "dashboard-control")
    assert control.subscribe(f"{TOPICS.prefix}/#") < 0x80
    refused = {topic: control.publish(topic) for topic in FORBIDDEN}
    assert refused == {topic: NOT_AUTHORIZED for topic in refused}
    assert control.publish(TOPICS.control) == SUCCESS
    wait_until(lambda: TOPICS.control in admin.received, what="the control message at the admin")
    assert admin.received == [TOPICS.control]  # the refused ones never arrived before it
