"""The dashboard against a real mosquitto: malformed traffic is counted, controls publish,
and the listener reconnects by itself after a broker restart."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import paho.mqtt.client as mqtt
import pytest
from fastapi.testclient import TestClient
from paho.mqtt.enums import CallbackAPIVersion

from agent.protocol.messages import Control, Status, Telemetry, View
from agent.protocol.topics import Topics
from dashboard.app import create_app
from dashboard.settings import DashboardSettings
from simulate.brokers import Credentials, MosquittoBroker
from tests.integration.conftest import JOB, wait_until

pytestmark = pytest.mark.integration
TOPICS = Topics(JOB)
TOKEN = "integration-token"


class Client:
    """A plain paho client with a message list, for publishing and watching the control topic."""

    def __init__(self, broker: MosquittoBroker, creds: Credentials, subscribe: str | None = None):
        self.received: list[mqtt.MQTTMessage] = []
        self.subscribed = subscribe is None
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"dash-test-{id(self)}")
        self.client.username_pw_set(creds.username, creds.password)
        self.client.on_message = lambda _c, _u, m: self.received.append(m)
        self.client.on_subscribe = lambda *_a: setattr(self, "subscribed", True)
        self.client.connect(broker.host, broker.port)
        self.client.loop_start()
        if subscribe is not None:
            self.client.subscribe(subscribe, 1)
        wait_until(lambda: self.subscribed, 60, "SUBACK")

    def publish(self, topic: str, payload: bytes, retain: bool = False) -> None:
        self.client.publish(topic, payload, qos=1, retain=retain).wait_for_publish(10)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def admin(mosquitto_broker: MosquittoBroker) -> Iterator[Client]:
    client = Client(mosquitto_broker, mosquitto_broker.admin_credentials,
                    subscribe=TOPICS.control)
    yield client
    client.close()


def dashboard(broker: MosquittoBroker, creds: Credentials, **extra: Any) -> TestClient:
    settings = DashboardSettings(broker_url=broker.url, job=JOB, username=creds.username,
                                 password=creds.password, **extra)
    return TestClient(create_app(settings), base_url="http://127.0.0.1")


def fleet(client: TestClient) -> dict[str, Any]:
    response = client.get("/api/fleet")
    assert response.status_code == 200
    return response.json()


def test_malformed_telemetry_on_the_broker_is_ignored_and_counted(
    mosquitto_broker: MosquittoBroker, admin: Client
) -> None:
    bad: list[tuple[str, bytes]] = [
        (TOPICS.telemetry(1), b"{this is not json"),
        (TOPICS.telemetry(1), b"\x80\x81\x82 binary garbage"),
        (TOPICS.telemetry(1), json.dumps({"node": 1, "round": 1, "epoch": 1, "algorithm": "ft",
                                          "wall_time": 0.1, "gpu": "yes"}).encode()),
        (TOPICS.telemetry(2), json.dumps({"node": 2, "round": 1, "epoch": 1, "algorithm": "ft",
                                          "wall_time": 0.1, "links": {"1": "on fire"}}).encode()),
        (TOPICS.telemetry(3), b'{"node": 3, "pad": "' + b"x" * 1_000_000 + b'"}'),
        (TOPICS.telemetry(4), Telemetry(5, 1, 1, "ft", 0.1).encode()),
        (TOPICS.status(6), b'{"node": 6, "state": "sleepy"}'),
    ]
    expected = {"bad_json": 2, "unknown_field": 1, "bad_field": 2, "too_large": 1,
                "node_mismatch": 1}
    with dashboard(mosquitto_broker, mosquitto_broker.dashboard_credentials) as client:
        wait_until(lambda: client.get("/healthz").json()["broker_connected"], 60, "broker link")
        admin.publish(TOPICS.view_of(0), View(1, [0, 1, 2], 2, 0, 0, fingerprint="0123456789abcdef").encode(),
                      retain=True)
        for topic, payload in bad:
            admin.publish(topic, payload)
        good = Telemetry(1, 7, 1, "ft-tree", 0.1, loss=0.25, accuracy=0.9)
        admin.publish(TOPICS.telemetry(1), good.encode())
        wait_until(lambda: fleet(client)["counters"]["messages"].get("telemetry") == 1
                   and fleet(client)["counters"]["malformed_total"] == len(bad), 60,
                   "the good telemetry and every bad message")
        snapshot = fleet(client)
        assert snapshot["counters"]["malformed"] == expected
        assert snapshot["counters"]["latest_round"] == 7
        assert snapshot["view"]["members"] == [0, 1, 2]
        rounds = client.get("/api/rounds").json()
        assert [(r["round"], r["accuracy"]) for r in rounds] == [(7, 0.9)]
        assert client.get("/healthz").json() == {"ok": True, "broker_connected": True,
                                                 "version": snapshot["version"]}


def test_control_reaches_the_broker_only_with_the_token(
    mosquitto_broker: MosquittoBroker, admin: Client
) -> None:
    # The acl gives the dashboard user read-only access, so a dashboard with controls runs
    # with credentials that may write on `control` (the admin's here).
    creds = mosquitto_broker.admin_credentials
    with dashboard(mosquitto_broker, creds, control_token=TOKEN) as client:
        wait_until(lambda: client.get("/healthz").json()["broker_connected"], 60, "broker link")
        body = {"action": "cut", "node": 1, "peer": 3}
        assert client.post("/api/control", json=body).status_code == 403
        ok = client.post("/api/control", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200
        wait_until(lambda: len(admin.received) == 1, 60, "the control message on the broker")
    assert admin.received[0].topic == TOPICS.control
    assert Control.decode(admin.received[0].payload) == Control("cut", 1, 3)


def test_listener_reconnects_after_a_broker_restart(
    mosquitto_broker: MosquittoBroker,
) -> None:
    with dashboard(mosquitto_broker, mosquitto_broker.dashboard_credentials) as client:
        wait_until(lambda: client.get("/healthz").json()["broker_connected"], 60, "broker link")
        mosquitto_broker.restart()
        wait_until(lambda: fleet(client)["broker"]["connects"] >= 2
                   and fleet(client)["broker"]["connected"], 60, "a reconnect")
        agent = Client(mosquitto_broker, mosquitto_broker.credentials_for(2))
        try:
            agent.publish(TOPICS.status(2), Status(2, "online", incarnation=3).encode())
        finally:
            agent.close()
        wait_until(lambda: any(n["node"] == 2 for n in fleet(client)["nodes"]), 60,
                   "a status published after the restart")
        assert next(n for n in fleet(client)["nodes"] if n["node"] == 2)["incarnation"] == 3


def test_cli_serves_and_prints_its_url(mosquitto_broker: MosquittoBroker, tmp_path: Path) -> None:
    url_file = tmp_path / "url"
    command = [sys.executable, "-m", "edgegrove.cli", "dashboard", "--broker", mosquitto_broker.url,
               "--job", JOB, "--credentials", str(mosquitto_broker.credentials_path),
               "--port", "0", "--url-file", str(url_file)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: url_file.exists() or proc.poll() is not None, 90, "the URL file")
        assert proc.poll() is None, proc.communicate()[1]
        url = url_file.read_text().strip()
        assert url.startswith("http://127.0.0.1:")
        # Written once the server listens: the URL answers at once, no retry.
        assert httpx.get(url + "healthz", timeout=10).status_code == 200

        def healthy() -> bool:
            try:
                return bool(httpx.get(url + "healthz", timeout=2).json()["broker_connected"])
            except httpx.HTTPError:
                return False

        wait_until(healthy, 60, "the dashboard connected to the broker")
        assert httpx.get(url, timeout=5).status_code == 200
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=15)
    # uvicorn shuts down gracefully, then re-raises SIGTERM: the conventional exit by signal.
    assert proc.returncode == -signal.SIGTERM and "Traceback" not in err, err
    assert f"dashboard: {url}" in out


def test_websocket_handshake_from_a_foreign_origin_is_refused() -> None:
    """A real server, a real WebSocket handshake: a page from another site gets HTTP 403."""
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect
    from websockets.typing import Origin

    from dashboard.server import run_in_thread

    with run_in_thread(DashboardSettings(job=JOB, port=0, max_websockets=1)) as served:
        ws_url = f"ws://127.0.0.1:{served.port}/ws"
        with pytest.raises(InvalidStatus) as refused:
            connect(ws_url, origin=Origin("http://evil.example"), open_timeout=10)
        assert refused.value.response.status_code == 403
        own = Origin(f"http://127.0.0.1:{served.port}")
        with connect(ws_url, origin=own, open_timeout=10) as socket:
            assert json.loads(socket.recv(timeout=10))["type"] == "snapshot"
            # over the cap (1): refused while the first is open
            with pytest.raises(InvalidStatus) as full:
                connect(ws_url, origin=own, open_timeout=10)
            assert full.value.response.status_code == 403
