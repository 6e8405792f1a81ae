"""The devices' warnings and errors on the dashboard: kept, placed at their round, searched."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from agent.device.logs import LogForwarder
from agent.jobs import topics
from agent.jobs.document import canonical_json
from agent.jobs.states import DeviceState
from dashboard.app import create_app
from dashboard.device_logs import DeviceLogBook, LogLevel, LogQuery, Place
from dashboard.settings import DashboardSettings
from dashboard.store import FleetStore
from tests.unit.dashboard.directory_messages import RUNNING, device_record, fleet_messages
from tests.unit.dashboard.test_app import feed_recording


def line(text: str, level: str = "warning", **more: object) -> bytes:
    return json.dumps({"device": "x", "level": level, "logger": "edgegrove.device", "line": text,
                       "time": 1_780_000_000.5, "dropped": 0, **more}).encode()


@pytest.fixture
def client() -> Iterator[TestClient]:
    with TestClient(create_app(DashboardSettings(job="rec")), base_url="http://127.0.0.1") as test_client:
        yield test_client


def store_of(client: TestClient) -> FleetStore:
    return client.app.state.dashboard.store  # type: ignore[attr-defined]


def test_a_line_is_placed_at_the_round_of_its_devices_execution(client: TestClient) -> None:
    store = store_of(client)
    for topic, payload in fleet_messages():
        store.ingest(topic, payload)
    store.ingest(topics.device_log("barn-pi-1"), line("slow link to parent", dropped=3))
    store.ingest(topics.device_log("hall-jetson"), line("no data source", level="error"))
    page = client.get("/api/logs").json()
    first, second = page["lines"]
    assert (first["device"], first["job"], first["round"], first["dropped"]) == ("barn-pi-1", RUNNING, 120, 3)
    assert first["node"] == 0
    assert first["time"] == 1_780_000_000.5 and first["level"] == "warning"
    assert (second["device"], second["job"], second["round"]) == ("hall-jetson", None, None)  # idle
    assert page["last_seq"] == 2 and page["devices"] == ["barn-pi-1", "hall-jetson"]


def test_the_log_filters_by_level_device_text_and_since(client: TestClient) -> None:
    store = store_of(client)
    store.ingest(topics.device_log("pi-1"), line("Broker connection lost"))
    store.ingest(topics.device_log("pi-2"), line("training failed: out of memory", level="error"))
    store.ingest(topics.device_log("pi-1"), line("checkpoint unreadable", level="critical"))
    store.ingest(topics.device_log("pi-1"), b"not json")
    store.ingest(topics.device_log("pi-1"), line("a debug line", level="debug"))

    def texts(**params: object) -> list[str]:
        return [x["line"] for x in client.get("/api/logs", params=params).json()["lines"]]

    assert texts(level="error") == ["training failed: out of memory", "checkpoint unreadable"]
    assert texts(device="pi-1") == ["Broker connection lost", "checkpoint unreadable"]
    assert texts(q="BROKER") == ["Broker connection lost"]
    assert texts(since=1) == ["training failed: out of memory", "checkpoint unreadable"]
    assert texts(limit=1) == ["checkpoint unreadable"]
    assert client.get("/api/logs").json()["unreadable"] == 2
    metrics = client.get("/metrics").text
    assert 'edgegrove_device_log_lines_total{device="pi-1",level="warning"} 1.0' in metrics
    assert 'edgegrove_device_log_lines_total{device="pi-1",level="critical"} 1.0' in metrics
    assert 'edgegrove_device_log_dropped_total{device="pi-2"} 0.0' in metrics
    assert client.get("/api/logs", params={"level": "info"}).status_code == 422


def test_the_book_keeps_the_last_lines_only() -> None:
    book = DeviceLogBook(max_lines=3)
    for k in range(5):
        book.add("pi", line(f"line {k}"), float(k), Place())
    assert [x.line for x in book.page(LogQuery())] == ["line 2", "line 3", "line 4"]
    assert [x.seq for x in book.page(LogQuery(since=3, level=LogLevel.WARNING))] == [4, 5]


def test_a_devices_forwarder_reaches_the_book_as_it_sent_it() -> None:
    """What agent.device.logs.LogForwarder publishes is what the dashboard reads."""
    book = DeviceLogBook()
    sent: list[tuple[str, bytes]] = []
    forwarder = LogForwarder("pi-7", topics.device_log("pi-7"), lambda t, p: sent.append((t, p)), 10.0, lambda: 5.0)
    logger = logging.getLogger("edgegrove.test-device-logs")
    logger.addHandler(forwarder)
    try:
        logger.error("round %d timed out", 42)
        logger.info("not forwarded")
    finally:
        logger.removeHandler(forwarder)
    [(topic, payload)] = sent
    assert topics.parse_device_log(topic) == "pi-7"
    got = book.add("pi-7", payload, 1.0, Place("job", 7, 42))
    assert got is not None and (got.level, got.line, got.logger, got.round) == (
        LogLevel.ERROR, "round 42 timed out", "edgegrove.test-device-logs", 42)


def test_a_line_of_the_followed_job_is_placed_at_its_nodes_latest_round(client: TestClient) -> None:
    store = store_of(client)
    record = device_record("pi-3", DeviceState.TRAINING, "rec", 3)
    store.ingest(topics.device_record("pi-3"), canonical_json(record).encode())
    feed_recording(store, "reroute.jsonl")
    store.ingest(topics.device_log("pi-3"), line("parent 1 silent, rerouting"))
    [got] = client.get("/api/logs").json()["lines"]
    assert got["job"] == "rec" and got["node"] == 3
    assert got["round"] == store.state.nodes[3].last_round is not None
