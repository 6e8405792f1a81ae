"""`edgegrove broker` as a process: prints its URL and credentials, serves, stops on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from agent.transport.mqtt import MqttTransport
from tests.integration.conftest import TOPICS, collect

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("kind", ["mosquitto", "embedded"])
def test_broker_command_serves_until_sigterm(tmp_path: Path, kind: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgegrove.cli", "broker", "--kind", kind, "--json", "--nodes", "2",
         "--job", TOPICS.job, "--workdir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        assert info["kind"] == kind and info["url"].startswith("mqtt://127.0.0.1:")
        user = password = None
        if kind == "mosquitto":
            creds = json.loads(Path(info["credentials"]).read_text())["agents"]["1"]
            user, password = creds["username"], creds["password"]
        client_id = creds["client_id"] if kind == "mosquitto" else "cli-test"  # bound to agent-1
        t = MqttTransport(client_id, info["url"], username=user, password=password)
        t.connect([TOPICS.links_to(1)])
        t.publish(TOPICS.link(1, 1), b"loop")
        assert collect(t, lambda ms: len(ms) >= 1)[0].payload == b"loop"
        t.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        assert not psutil.pid_exists(info["pid"]) or \
            psutil.Process(info["pid"]).status() == psutil.STATUS_ZOMBIE
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
