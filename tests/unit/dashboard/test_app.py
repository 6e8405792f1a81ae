"""The dashboard's HTTP and WebSocket API, with messages fed straight into its store (no broker)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from agent.protocol.messages import MAX_MESSAGE_BYTES, Control, Status, Telemetry, View
from dashboard.app import create_app
from dashboard.settings import DashboardSettings
from dashboard.store import FleetStore

TOKEN = "s3cret-token"
WS_URL = "ws://127.0.0.1/ws"  # TestClient would send Host "testserver", a name not allowed
RECORDINGS = Path(__file__).resolve().parent / "recordings"


def feed_recording(store: FleetStore, name: str) -> None:
    for text in (RECORDINGS / name).read_text().splitlines():
        line = json.loads(text)
        store.ingest(line["topic"], json.dumps(line["payload"]).encode())


@pytest.fixture
def published() -> list[tuple[str, bytes]]:
    return []


@pytest.fixture
def client(published: list[tuple[str, bytes]]) -> Iterator[TestClient]:
    settings = DashboardSettings(job="rec", control_token=TOKEN)
    app = create_app(settings, publisher=lambda topic, payload: published.append((topic, payload)))
    with TestClient(app, base_url="http://127.0.0.1") as test_client:
        yield test_client


def store_of(client: TestClient) -> FleetStore:
    return client.app.state.dashboard.store  # type: ignore[attr-defined]


def test_fleet_rounds_events_after_a_recording(client: TestClient) -> None:
    feed_recording(store_of(client), "reroute.jsonl")
    fleet = client.get("/api/fleet").json()
    assert [n["node"] for n in fleet["nodes"]] == list(range(7))
    assert {n["state"] for n in fleet["nodes"]} == {"online"}
    node3 = next(n for n in fleet["nodes"] if n["node"] == 3)
    assert (node3["parent"], node3["backup"], node3["depth"]) == (1, 4, 2)
    assert fleet["counters"]["reroutes"] == 3
    assert fleet["view"]["members"] == list(range(7))
    assert {(link["a"], link["b"]) for link in fleet["links"] if link["kind"] == "tree"} == {
        (0, 1), (0, 2), (1, 3), (1, 4), (2, 5), (2, 6)}

    rounds = client.get("/api/rounds", params={"since": 5}).json()
    assert [r["round"] for r in rounds] == [6, 7, 8]
    assert rounds[0]["reroutes"] == 1 and rounds[0]["round_seconds"] == pytest.approx(0.55)

    events = client.get("/api/events").json()
    assert "link_rerouted" in [e["kind"] for e in events]
    last_seq = events[-1]["seq"]
    assert client.get("/api/events", params={"since": last_seq}).json() == []
    assert [e["seq"] for e in client.get("/api/events", params={"since": last_seq - 2}).json()] == [
        last_seq - 1, last_seq]


def test_healthz_and_docs(client: TestClient) -> None:
    health = client.get("/healthz").json()
    assert health["ok"] is True and health["broker_connected"] is False
    schema = client.get("/openapi.json").json()
    assert {"/api/fleet", "/api/rounds", "/api/events", "/api/control", "/healthz"} <= set(schema["paths"])
    assert "FleetModel" in schema["components"]["schemas"]


def test_page_and_static_files_are_served(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and "/static/app.js" in page.text
    assert "cdn" not in page.text.lower() and "https://" not in page.text
    for name in ("app.js", "charts.js", "style.css"):
        assert client.get(f"/static/{name}").status_code == 200
    # The chart library is vendored from npm with its licence, served from the package.
    for name in ("uPlot.iife.min.js", "uPlot.min.css"):
        assert f"/static/vendor/uplot/{name}" in page.text
        assert client.get(f"/static/vendor/uplot/{name}").status_code == 200
    licence = client.get("/static/vendor/uplot/LICENSE")
    assert licence.status_code == 200 and "MIT License" in licence.text and "Leon Sorokin" in licence.text


MALFORMED = [
    ("telemetry/1", b"{not json", "bad_json"),
    ("telemetry/1", b"\xff\xfe\x00", "bad_json"),
    ("telemetry/1", b"[1, 2]", "bad_json"),
    ("telemetry/1", json.dumps({"node": 1, "round": 1, "epoch": 1, "algorithm": "ft",
                                "wall_time": 0.1, "surprise": 1}).encode(), "unknown_field"),
    ("telemetry/1", json.dumps({"node": 1, "round": -4, "epoch": 1, "algorithm": "ft",
                                "wall_time": 0.1}).encode(), "bad_field"),
    ("telemetry/1", b"{" + b" " * (MAX_MESSAGE_BYTES + 10) + b"}", "too_large"),
    ("telemetry/2", Telemetry(1, 1, 1, "ft", 0.1).encode(), "node_mismatch"),
    ("status/3", json.dumps({"node": 3, "state": "dancing"}).encode(), "bad_field"),
    ("view", json.dumps({"epoch": 1, "members": [3, 1], "arity": 2, "coordinator": 1,
                         "from_round": 0}).encode(), "bad_field"),
    ("link/1/2", b"frame", "unknown_topic"),
]


def test_malformed_messages_are_ignored_and_counted(client: TestClient) -> None:
    store = store_of(client)
    for topic, payload, _reason in MALFORMED:
        store.ingest(f"edgegrove/rec/{topic}", payload)
    store.ingest("edgegrove/rec/telemetry/1", Telemetry(1, 1, 1, "ft", 0.1, loss=1.0).encode())
    fleet = client.get("/api/fleet").json()
    expected: dict[str, int] = {}
    for _topic, _payload, reason in MALFORMED:
        expected[reason] = expected.get(reason, 0) + 1
    assert fleet["counters"]["malformed"] == expected
    assert fleet["counters"]["malformed_total"] == len(MALFORMED)
    assert [n["node"] for n in fleet["nodes"]] == [1]  # the good message still counted
    assert client.get("/healthz").json()["ok"] is True


def test_control_is_refused_without_the_right_token(client: TestClient, published: list) -> None:
    body = {"action": "cut", "node": 1, "peer": 3}
    assert client.post("/api/control", json=body).status_code == 403
    wrong = {"Authorization": "Bearer nope-nope-nope"}
    assert client.post("/api/control", json=body, headers=wrong).status_code == 403
    assert client.post("/api/control", json=body, headers={"Authorization": TOKEN}).status_code == 403
    assert published == []
    counters = client.get("/api/fleet").json()["counters"]
    assert counters["refused_requests"] == {"control_token": 3} and counters["refused_requests_total"] == 3


def test_control_with_token_publishes_a_control_message(client: TestClient, published: list) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    response = client.post("/api/control", json={"action": "cut", "node": 1, "peer": 3}, headers=headers)
    assert response.status_code == 200
    assert response.json() == {"published": True, "topic": "edgegrove/rec/control",
                               "after": 0}
    [(topic, payload)] = published
    assert topic == "edgegrove/rec/control"
    assert Control.decode(payload) == Control("cut", 1, 3)
    bad = client.post("/api/control", json={"action": "cut", "node": 1}, headers=headers)
    assert bad.status_code == 422  # a cut needs a peer
    assert len(published) == 1
    # The accepted request is no refusal; the invalid one is.
    assert client.get("/api/fleet").json()["counters"]["refused_requests"] == {"control_invalid": 1}


def test_control_disabled_without_a_server_token() -> None:
    sent: list[tuple[str, bytes]] = []
    app = create_app(DashboardSettings(job="rec"), publisher=lambda t, p: sent.append((t, p)))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        response = client.post("/api/control", json={"action": "crash", "node": 2},
                               headers={"Authorization": "Bearer anything-at-all"})
        assert response.status_code == 403 and "--control-token" in response.json()["detail"]
        assert client.get("/api/config").json()["controls_enabled"] is False
        assert client.get("/api/fleet").json()["controls_enabled"] is False
        assert client.get("/api/fleet").json()["counters"]["refused_requests"] == {"control_disabled": 1}
    assert sent == []


def test_control_without_broker_is_503() -> None:
    app = create_app(DashboardSettings(job="rec", control_token=TOKEN))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        response = client.post("/api/control", json={"action": "crash", "node": 2},
                               headers={"Authorization": f"Bearer {TOKEN}"})
        assert response.status_code == 503


def test_websocket_sends_full_snapshot_then_deltas(client: TestClient) -> None:
    store = store_of(client)
    store.ingest("edgegrove/rec/view", View(1, [0, 1, 2], 2, 0, 0, fingerprint="0123456789abcdef").encode())
    store.ingest("edgegrove/rec/status/0", Status(0, "online", fingerprint="0123456789abcdef").encode())
    store.ingest("edgegrove/rec/telemetry/0", Telemetry(0, 1, 1, "ft", 0.1, loss=2.0).encode())
    with client.websocket_connect(WS_URL) as socket:
        first = socket.receive_json()
        assert first["full"] is True and first["type"] == "snapshot"
        assert [r["round"] for r in first["rounds"]] == [1]
        assert [e["kind"] for e in first["events"]] == ["view_change", "join"]
        store.ingest("edgegrove/rec/telemetry/0", Telemetry(0, 2, 1, "ft", 0.1, loss=1.5).encode())
        second = socket.receive_json()
        assert second["full"] is False
        assert [r["round"] for r in second["rounds"]] == [2]
        assert second["events"] == []
        assert second["fleet"]["counters"]["latest_round"] == 2


def test_event_log_file_gets_every_event(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "events.jsonl"
    app = create_app(DashboardSettings(job="rec", event_log=log))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        feed_recording(store_of(client), "crash.jsonl")
        total = client.get("/api/fleet").json()["counters"]["events"]
        api_events = client.get("/api/events").json()
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert len(lines) == total
    assert lines[-1] == api_events[-1]  # same record, Unix time included
    assert [x["seq"] for x in lines] == list(range(1, total + 1))
    assert any(x["kind"] == "crash" and x["node"] == 4 for x in lines)


def test_settings_reject_bad_input() -> None:
    with pytest.raises(ValueError, match="mqtt://HOST:PORT"):
        DashboardSettings(broker_url="http://x:1")
    with pytest.raises(ValueError, match="job name"):
        DashboardSettings(job="no/slashes")
    with pytest.raises(ValueError, match="8 characters"):
        DashboardSettings(control_token="short")


# ---------------------------------------------------------------- WebSocket origin and cap


def test_websocket_refuses_a_foreign_origin_and_takes_its_own(client: TestClient) -> None:
    # The requests go to host 127.0.0.1; a page served from there may connect.
    with client.websocket_connect(WS_URL, headers={"Origin": "http://127.0.0.1"}) as socket:
        assert socket.receive_json()["type"] == "snapshot"
    for foreign in ("http://evil.example", "http://127.0.0.1.evil.example", "null"):
        with pytest.raises(WebSocketDisconnect) as refused, \
                client.websocket_connect(WS_URL, headers={"Origin": foreign}):
            pass
        assert refused.value.code == 1008
    assert client.get("/api/fleet").json()["counters"]["refused_requests"] == {"websocket_origin": 3}


def test_websocket_allows_configured_origins_and_caps_connections() -> None:
    settings = DashboardSettings(job="rec", allowed_origins=("https://fleet.example.org",),
                                 max_websockets=2)
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
        headers = {"Origin": "https://fleet.example.org"}
        with client.websocket_connect(WS_URL, headers=headers) as one, \
                client.websocket_connect(WS_URL) as two:
            one.receive_json()
            two.receive_json()
            with pytest.raises(WebSocketDisconnect) as refused, client.websocket_connect(WS_URL):
                pass
            assert refused.value.code == 1013
        assert client.get("/api/fleet").json()["counters"]["refused_requests"] == {"websocket_full": 1}
        # closed sockets free their places
        with client.websocket_connect(WS_URL) as again:
            assert again.receive_json()["type"] == "snapshot"


def test_settings_reject_bad_origins_and_caps() -> None:
    with pytest.raises(ValueError, match="origin"):
        DashboardSettings(allowed_origins=("evil.example",))
    with pytest.raises(ValueError, match="max-websockets"):
        DashboardSettings(max_websockets=0)


# ---------------------------------------------------------------- controls checked against the fleet


@pytest.mark.parametrize(("body", "reason"), [
    ({"action": "crash", "node": 99}, "node 99 is not in this fleet (nodes 0-6)"),
    ({"action": "cut", "node": 1, "peer": 1}, "two different nodes"),
    ({"action": "cut", "node": 1, "peer": 12}, "peer 12 is not in this fleet"),
    ({"action": "loss", "node": 4, "value": 5}, "between 0 and 1"),
    ({"action": "latency", "node": 4, "value": -1}, "latency is seconds"),
])
def test_control_naming_no_such_node_is_refused(client: TestClient, published: list,
                                                body: dict, reason: str) -> None:
    feed_recording(store_of(client), "reroute.jsonl")  # nodes 0..6
    response = client.post("/api/control", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 422
    assert reason in response.json()["detail"]
    assert published == []


def test_control_outcome_from_the_simulator_reaches_the_fleet(client: TestClient) -> None:
    store = store_of(client)
    feed_recording(store, "reroute.jsonl")
    sent = client.post("/api/control", json={"action": "resume", "node": 2},
                       headers={"Authorization": f"Bearer {TOKEN}"}).json()
    store.ingest_record({"type": "dashboard_control", "action": "resume", "node": 2,
                         "outcome": "ignored: node 2 is not hung"})
    controls = client.get("/api/fleet").json()["controls"]
    assert [(c["seq"] > sent["after"], c["applied"], c["outcome"]) for c in controls] == [
        (True, False, "ignored: node 2 is not hung")]


def test_a_foreign_host_is_refused_and_pages_may_not_be_framed(client: TestClient) -> None:
    page = client.get("/")
    assert page.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    for host in ("localhost:8080", "127.0.0.1", "[::1]:80", "10.1.2.3:8080"):
        assert client.get("/api/fleet", headers={"Host": host}).status_code == 200, host
    refused = client.get("/api/fleet", headers={"Host": "rebind.evil.example:8080"})
    assert refused.status_code == 400 and "--allow-host" in refused.text
    assert refused.headers["x-frame-options"] == "DENY"
    with pytest.raises(WebSocketDisconnect), client.websocket_connect("ws://rebind.evil.example/ws"):
        pass
    assert client.get("/api/fleet").json()["counters"]["refused_requests"]["host_not_allowed"] == 2


def test_an_allowed_host_name_is_served() -> None:
    settings = DashboardSettings(job="rec", allowed_hosts=("fleet.example.org",))
    with TestClient(create_app(settings), base_url="http://fleet.example.org") as named:
        assert named.get("/healthz").status_code == 200
        assert named.get("/healthz", headers={"Host": "other.example.org"}).status_code == 400
    with TestClient(create_app(DashboardSettings(allowed_hosts=("*",))), base_url="http://any.example") as anyhost:
        assert anyhost.get("/healthz").status_code == 200


def test_api_docs_are_served_without_a_cdn(client: TestClient) -> None:
    docs = client.get("/docs")
    assert docs.status_code == 200 and "/api/fleet" in docs.text and "/openapi.json" in docs.text
    assert "cdn" not in docs.text.lower() and "https://" not in docs.text
    assert client.get("/redoc").status_code == 404


def test_metrics_in_prometheus_text_format(client: TestClient) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    feed_recording(store_of(client), "reroute.jsonl")
    fleet = client.get("/api/fleet").json()
    reply = client.get("/metrics")
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    samples = {(s.name, s.labels.get("node", "")): s for f in text_string_to_metric_families(reply.text)
               for s in f.samples}
    assert samples[("edgegrove_rounds_total", "")].value == fleet["counters"]["rounds"] > 0
    assert samples[("edgegrove_reroutes_total", "")].value == fleet["counters"]["reroutes"] == 3
    assert samples[("edgegrove_bytes_sent_total", "")].value == fleet["counters"]["bytes_sent"]
    assert samples[("edgegrove_nodes_online", "")].value == 7
    assert samples[("edgegrove_latest_round", "")].value == fleet["counters"]["latest_round"]
    assert samples[("edgegrove_rounds_total", "")].labels["fleet_job"] == "rec"
    for node in fleet["nodes"]:
        key = str(node["node"])
        assert samples[("edgegrove_node_bytes_sent_total", key)].value == node["bytes_sent"]
        assert samples[("edgegrove_node_last_round", key)].value == node["last_round"]
        assert samples[("edgegrove_node_online", key)].value == 1


def test_every_event_is_kept_and_served_in_pages() -> None:
    settings = DashboardSettings(job="rec", max_events=50)  # the state's ring buffer: small
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as many:
        store = store_of(many)
        for round_no in range(400):  # a degraded round is one event each
            msg = Telemetry(1, round_no, 1, "ft", 0.1, degraded=True, missing_chunks=1)
            store.ingest("edgegrove/rec/telemetry/1", msg.encode())
        total = store.state.next_seq - 1
        assert len(store.state.events) == 50 and total >= 400
        everything = many.get("/api/events").json()
        assert [e["seq"] for e in everything] == list(range(1, total + 1))
        page = many.get("/api/events", params={"before": 101, "limit": 30}).json()
        assert [e["seq"] for e in page] == list(range(71, 101))
        forward = many.get("/api/events", params={"since": 10, "limit": 5}).json()
        assert [e["seq"] for e in forward] == [11, 12, 13, 14, 15]
        last = many.get("/api/events", params={"limit": 3}).json()
        assert [e["seq"] for e in last] == [total - 2, total - 1, total]


def test_every_round_is_kept_and_served_in_pages() -> None:
    settings = DashboardSettings(job="rec", max_rounds=40)  # the state's ring buffer: small
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as many:
        store = store_of(many)
        for round_no in range(300):
            for node in (1, 2):  # two reports per round: a round leaves the ring once, whole
                msg = Telemetry(node, round_no, 1, "ft", 0.1 * (node + 1), loss=1.0 / (round_no + 1))
                store.ingest(f"edgegrove/rec/telemetry/{node}", msg.encode())
        assert len(store.state.rounds) == 40
        everything = many.get("/api/rounds").json()
        assert [r["round"] for r in everything] == list(range(300))
        assert all(r["reports"] == 2 for r in everything)
        assert everything[5]["loss"] == pytest.approx(1 / 6)
        page = many.get("/api/rounds", params={"before": 100, "limit": 30}).json()
        assert [r["round"] for r in page] == list(range(70, 100))
        forward = many.get("/api/rounds", params={"since": 10, "limit": 5}).json()
        assert [r["round"] for r in forward] == [11, 12, 13, 14, 15]
        counters = many.get("/api/fleet").json()["counters"]
        # The page is told where the run's rounds begin, and that nothing was dropped.
        assert counters["first_round"] == 0 and counters["latest_round"] == 299
        assert counters["rounds"] == 300 and counters["events_dropped"] == 0


def test_a_report_that_arrives_twice_counts_once(client: TestClient) -> None:
    store = store_of(client)
    first = Telemetry(2, 7, 1, "ft", 0.1, bytes_sent=1000, loss=0.5).encode()
    store.ingest("edgegrove/rec/telemetry/2", first)
    store.ingest("edgegrove/rec/telemetry/2", first)  # a QoS 1 resend: the same bytes
    fleet = client.get("/api/fleet").json()
    assert fleet["counters"]["bytes_sent"] == 1000
    assert fleet["counters"]["malformed"] == {"telemetry_repeat": 1}
    assert client.get("/api/rounds").json()[0]["reports"] == 1
    # The node ran the round again: another report of it, counted.
    store.ingest("edgegrove/rec/telemetry/2", Telemetry(2, 7, 1, "ft", 0.2, bytes_sent=900).encode())
    assert client.get("/api/fleet").json()["counters"]["bytes_sent"] == 1900
    assert client.get("/api/rounds").json()[0]["reports"] == 2


def test_a_nodes_own_series_is_served_paged(client: TestClient) -> None:
    store = store_of(client)
    for r in range(6):
        tel = Telemetry(2, r, 1, "ft", 0.1, loss=1.0, phase_seconds={"total": 0.5 + r}, bytes_sent=100 * r,
                        bytes_received=7 * r, cpu_percent=40.0 + r, rss_bytes=(50 + r) * 1_000_000)
        store.ingest("edgegrove/rec/telemetry/2", tel.encode())
    # A simulator's record (live or replayed) feeds the same series.
    store.ingest_record({"type": "telemetry", **json.loads(Telemetry(
        2, 6, 1, "ft", 0.1, phase_seconds={"total": 9.0}, cpu_percent=99.5, rss_bytes=1).encode())})
    whole = client.get("/api/nodes/2/series").json()
    assert (whole["node"], whole["first_round"], whole["last_round"], whole["dropped"]) == (2, 0, 6, 0)
    assert [p["round"] for p in whole["points"]] == list(range(7))
    assert whole["points"][3] == {"round": 3, "round_seconds": 3.5, "cpu_percent": 43.0,
                                  "rss_bytes": 53_000_000, "bytes_sent": 300, "bytes_received": 21}
    assert whole["points"][6]["cpu_percent"] == 99.5
    page = client.get("/api/nodes/2/series", params={"since": 1, "limit": 2}).json()
    assert [p["round"] for p in page["points"]] == [2, 3]
    back = client.get("/api/nodes/2/series", params={"before": 3, "limit": 2}).json()
    assert [p["round"] for p in back["points"]] == [1, 2]
    node2 = next(n for n in client.get("/api/fleet").json()["nodes"] if n["node"] == 2)
    assert (node2["cpu_percent"], node2["rss_bytes"]) == (99.5, 1)  # its latest report's
    assert client.get("/api/nodes/5/series").status_code == 404  # no report from it
    assert client.get("/api/nodes/2000/series").status_code == 422
    assert client.get("/api/nodes/2/series", params={"limit": 0}).status_code == 422


def test_a_link_cut_from_the_page_is_the_operators_incident_with_its_window(client: TestClient) -> None:
    store = store_of(client)
    feed_recording(store, "reroute.jsonl")
    round_now = store.state.fleet_round
    headers = {"Authorization": f"Bearer {TOKEN}"}
    assert client.post("/api/control", json={"action": "cut", "node": 3, "peer": 1}, headers=headers).status_code == 200
    fleet = client.get("/api/fleet").json()
    [cut] = fleet["incidents"]
    assert (cut["kind"], cut["targets"], cut["source"], cut["active"]) == ("link", [1, 3], "operator", True)
    assert cut["start_round"] == round_now and "operator" in cut["title"]
    [action] = fleet["operator_actions"]
    assert (action["action"], action["targets"], action["round"], action["incident"], action["undoes"],
            action["outcome"]) == ("cut", [1, 3], round_now, "link", False, "")
    # The simulator's answer is the same action's outcome, not a second one nor a second incident.
    store.ingest_record({"type": "dashboard_control", "action": "cut", "node": 3, "peer": 1, "applied": True,
                         "outcome": "applied: cut link 3->1, by the agents themselves"})
    fleet = client.get("/api/fleet").json()
    assert len(fleet["incidents"]) == 1
    assert [a["outcome"] for a in fleet["operator_actions"]] == ["applied: cut link 3->1, by the agents themselves"]
    assert client.post("/api/control", json={"action": "heal", "node": 1, "peer": 3}, headers=headers).status_code == 200
    fleet = client.get("/api/fleet").json()
    assert [(a["action"], a["undoes"]) for a in fleet["operator_actions"]] == [("cut", False), ("heal", True)]
    assert fleet["incidents"][0]["healed_round"] == round_now


def test_an_operator_command_the_simulator_did_not_carry_out_is_undone(client: TestClient) -> None:
    store = store_of(client)
    feed_recording(store, "reroute.jsonl")
    headers = {"Authorization": f"Bearer {TOKEN}"}
    client.post("/api/control", json={"action": "hang", "node": 2}, headers=headers)
    store.ingest_record({"type": "dashboard_control", "action": "hang", "node": 2, "applied": False,
                         "outcome": "ignored: node 2 is not running"})
    [hang] = client.get("/api/fleet").json()["incidents"]
    assert (hang["kind"], hang["source"], hang["healed_round"]) == ("hang", "operator", store.state.fleet_round)
