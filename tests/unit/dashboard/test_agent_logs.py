"""An agent's log tail from a run directory: the module and its route, path-safe."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from dashboard.agent_logs import MAX_TAIL_BYTES, LogUnavailable, log_path, tail_log
from dashboard.app import create_app
from dashboard.settings import DashboardSettings


def run_with_logs(run_dir: Path, logs: dict[int, str]) -> Path:
    (run_dir / "agents").mkdir(parents=True)
    for node, text in logs.items():
        (run_dir / "agents" / f"agent-{node}.log").write_text(text)
    (run_dir / "secret.txt").write_text("not a log\n")
    return run_dir


def test_the_last_lines_of_a_nodes_log(tmp_path: Path) -> None:
    run = run_with_logs(tmp_path / "run", {3: "".join(f"line {i}\n" for i in range(50))})
    tail = tail_log(run, 3, 5)
    assert tail.lines == ("line 45", "line 46", "line 47", "line 48", "line 49")
    assert tail.truncated and tail.path == "agents/agent-3.log"
    assert tail.size == (run / "agents" / "agent-3.log").stat().st_size
    whole = tail_log(run, 3, 100)
    assert len(whole.lines) == 50 and not whole.truncated


def test_a_huge_log_is_read_from_its_end_only(tmp_path: Path) -> None:
    line = "x" * 99 + "\n"
    run = run_with_logs(tmp_path / "run", {0: line * (3 * MAX_TAIL_BYTES // len(line)) + "last\n"})
    tail = tail_log(run, 0, 10_000)
    assert tail.lines[-1] == "last" and tail.truncated
    assert all(len(text) == 99 for text in tail.lines[:-1])  # no line cut at the window's start
    assert len(tail.lines) < MAX_TAIL_BYTES // 100 + 2


def test_bad_node_ids_and_missing_logs(tmp_path: Path) -> None:
    run = run_with_logs(tmp_path / "run", {1: "hello\n"})
    for bad in (-1, 1024, True):
        with pytest.raises(ValueError, match="node id"):
            log_path(run, bad)
    with pytest.raises(LogUnavailable, match="no log"):
        tail_log(run, 2, 10)
    with pytest.raises(LogUnavailable, match="no run directory"):
        tail_log(None, 1, 10)


def test_a_log_that_links_out_of_the_run_is_refused(tmp_path: Path) -> None:
    run = run_with_logs(tmp_path / "run", {})
    (run / "agents" / "agent-4.log").symlink_to(run / "secret.txt")
    with pytest.raises(LogUnavailable, match="outside"):
        tail_log(run, 4, 10)


@pytest.fixture
def client(tmp_path: Path) -> TestClient:
    run = run_with_logs(tmp_path / "run", {2: "started\nround 1 done\n"})
    app = create_app(DashboardSettings(job="rec", run_dir=run))
    return TestClient(app, base_url="http://127.0.0.1")


def test_the_route_serves_a_tail_and_refuses_traversal(client: TestClient) -> None:
    reply = client.get("/api/nodes/2/log", params={"lines": 1})
    assert reply.status_code == 200
    assert reply.json() == {"node": 2, "path": "agents/agent-2.log", "size": 21,
                            "lines": ["round 1 done"], "truncated": True}
    assert client.get("/api/nodes/5/log").status_code == 404
    for bad in ("-1", "1024", "..%2Fsecret.txt", "..", "2.log", "%2e%2e"):
        reply = client.get(f"/api/nodes/{bad}/log")
        assert reply.status_code in (404, 422), (bad, reply.status_code)
        assert "not a log" not in reply.text
    assert client.get("/api/nodes/2/log", params={"lines": 0}).status_code == 422
    assert client.get("/api/nodes/2/log", params={"lines": 999_999}).status_code == 422


def test_without_a_run_directory_the_route_says_how_to_get_one() -> None:
    with TestClient(create_app(DashboardSettings(job="rec")), base_url="http://127.0.0.1") as bare:
        reply = bare.get("/api/nodes/0/log")
    assert reply.status_code == 404 and "--run-dir" in reply.json()["detail"]
