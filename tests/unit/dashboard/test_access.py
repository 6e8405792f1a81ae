"""Named operator accounts on the dashboard's API: login, roles, the audit line, the gate."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from dashboard.accounts import Role, save_accounts, with_account
from dashboard.app import create_app
from dashboard.sessions import SESSION_COOKIE
from dashboard.settings import DashboardSettings

TOKEN = "s3cret-token"
WS_URL = "ws://127.0.0.1/ws"
CUT = {"action": "cut", "node": 1, "peer": 3}


@pytest.fixture
def accounts_file(tmp_path: Path) -> Path:
    path = tmp_path / "accounts.json"
    accounts = with_account({}, "ana", Role.OPERATOR, "ana-password")
    save_accounts(path, with_account(accounts, "vic", Role.VIEWER, "vic-password"))
    return path


@pytest.fixture
def published() -> list[tuple[str, bytes]]:
    return []


@pytest.fixture
def client(accounts_file: Path, published: list[tuple[str, bytes]]) -> Iterator[TestClient]:
    settings = DashboardSettings(job="rec", control_token=TOKEN, accounts_file=accounts_file,
                                 event_log=accounts_file.parent / "events.jsonl")
    app = create_app(settings, publisher=lambda topic, payload: published.append((topic, payload)))
    with TestClient(app, base_url="http://127.0.0.1") as test_client:
        yield test_client


def log_in(client: TestClient, name: str, password: str) -> int:
    return client.post("/api/login", json={"name": name, "password": password}).status_code


def test_reading_needs_a_login_and_metrics_stay_open(client: TestClient) -> None:
    assert client.get("/api/fleet").status_code == 401
    assert client.get("/api/events").status_code == 401
    assert client.get("/metrics").status_code == 200 and client.get("/healthz").status_code == 200
    assert client.get("/api/me").json() == {"accounts": True, "name": None, "role": None, "via": None}
    with pytest.raises(WebSocketDisconnect), client.websocket_connect(WS_URL) as ws:
        ws.receive_text()
    assert log_in(client, "vic", "wrong-password") == 401
    assert log_in(client, "nobody", "vic-password") == 401
    assert log_in(client, "vic", "vic-password") == 200
    assert client.get("/api/me").json() == {"accounts": True, "name": "vic", "role": "viewer", "via": "session"}
    assert client.get("/api/fleet").status_code == 200
    with client.websocket_connect(WS_URL) as ws:
        assert '"fleet"' in ws.receive_text()
    refused = client.get("/api/fleet").json()["counters"]["refused_requests"]
    assert refused["login_failed"] == 2 and refused["login_needed"] == 3


def test_a_viewer_cannot_send_a_command_an_operator_can_and_the_log_names_them(
        client: TestClient, published: list, accounts_file: Path) -> None:
    assert log_in(client, "vic", "vic-password") == 200
    refused = client.post("/api/control", json=CUT)
    assert refused.status_code == 403 and "vic is a viewer" in refused.json()["detail"]
    assert published == []
    assert log_in(client, "ana", "ana-password") == 200  # the cookie now is ana's
    assert client.post("/api/control", json=CUT).status_code == 200
    assert len(published) == 1
    [line] = [e for e in client.get("/api/events").json() if e["kind"] == "control"]
    assert line["by"] == "ana" and "sent by operator ana" in line["detail"] and line["time"] > 0
    [incident] = client.get("/api/incidents").json()
    assert incident["source"] == "operator" and "made by operator ana" in incident["title"]
    logged = (accounts_file.parent / "events.jsonl").read_text()
    assert '"by":"ana"' in logged and "cut link 1-3" in logged


def test_the_control_token_still_acts_as_the_operator_token(client: TestClient, published: list) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    assert client.get("/api/me", headers=headers).json()["name"] == "token"
    assert client.post("/api/control", json=CUT, headers=headers).status_code == 200
    [line] = [e for e in client.get("/api/events", headers=headers).json() if e["kind"] == "control"]
    assert line["by"] == "token" and "sent by the operator with the control token" in line["detail"]
    [action] = client.get("/api/fleet", headers=headers).json()["operator_actions"]
    assert action["by"] == "token"


def test_a_session_from_a_foreign_page_does_not_act(client: TestClient, published: list) -> None:
    assert log_in(client, "ana", "ana-password") == 200
    foreign = {"Origin": "http://evil.example"}
    assert client.post("/api/control", json=CUT, headers=foreign).status_code == 401  # not logged in, for it
    assert client.post("/api/login", json={"name": "ana", "password": "ana-password"},
                       headers=foreign).status_code == 403
    assert client.post("/api/control", json=CUT, headers={"Origin": "http://127.0.0.1"}).status_code == 200
    assert len(published) == 1


def test_logout_ends_the_session(client: TestClient) -> None:
    assert log_in(client, "ana", "ana-password") == 200
    cookie = client.cookies.get(SESSION_COOKIE)
    assert cookie
    client.post("/api/logout")
    client.cookies.set(SESSION_COOKIE, cookie)  # the old cookie no longer opens anything
    assert client.get("/api/fleet").status_code == 401


def test_without_accounts_reading_is_open_and_login_is_absent() -> None:
    app = create_app(DashboardSettings(job="rec"))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        assert client.get("/api/fleet").status_code == 200
        assert client.get("/api/me").json()["accounts"] is False
        assert log_in(client, "ana", "ana-password") == 404


def test_an_operators_broker_restart_is_her_incident_until_the_broker_is_back(
        client: TestClient, published: list) -> None:
    from dashboard.records import apply_record

    assert log_in(client, "ana", "ana-password") == 200
    bad = client.post("/api/control", json={"action": "broker_restart", "node": 0, "value": 600})
    assert bad.status_code == 422 and "outage" in bad.json()["detail"]
    sent = client.post("/api/control", json={"action": "broker_restart", "node": 0, "value": 3})
    assert sent.status_code == 200 and len(published) == 1
    [incident] = client.get("/api/incidents").json()
    assert (incident["kind"], incident["targets"], incident["source"]) == ("broker-restart", [], "operator")
    assert incident["end_time"] is None
    [line] = [e for e in client.get("/api/events").json() if e["kind"] == "control"]
    assert line["node"] is None and "broker_restart the broker: sent by operator ana" in line["detail"]
    store = client.app.state.dashboard.store  # type: ignore[attr-defined]
    store.ingest_record({"type": "dashboard_control", "action": "broker_restart", "node": 0, "value": 3.0,
                         "applied": True, "outcome": "applied: broker stopped, back in 3 s"})
    store.ingest_record({"type": "broker", "event": "stopped", "pid": 1})
    assert client.get("/api/incidents").json()[0]["end_time"] is None
    store.ingest_record({"type": "broker", "event": "started", "pid": 2})
    [over] = client.get("/api/incidents").json()
    assert over["end_time"] is not None
    assert apply_record(store.state, {"type": "broker", "event": "started"}, 0.0)[1] == ()  # once
