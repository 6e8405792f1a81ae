"""Installed devices on a mosquitto with dynamic security (issue 52): each device's own
credentials (made once, agent.jobs.acl) let it publish its record and executions, never a job,
another device's record or a job node it was not granted; with the grants `job submit` makes
per job, the job trains on the devices and its result comes back."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from agent.jobs import signing, topics
from agent.jobs.acl import create_commands, device_user
from agent.jobs.document import JobSpec
from agent.jobs.states import ExecState
from agent.operator.grants import grant_commands
from agent.transport.mqtt import MqttTransport
from simulate.brokers import DynsecAdmin, start_mosquitto
from tests.integration.conftest import _require_mosquitto
from tests.integration.device_fleet import Watcher, mnist_slice, submit, write_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]
NAMES = ["pi-a", "pi-b"]


def test_device_credentials_reach_only_the_devices_own_topics_and_granted_jobs(
        tmp_path: Path, mnist_cache_dir: Path) -> None:
    _require_mosquitto()
    broker = start_mosquitto(tmp_path / "broker", job="unused", nodes=1, dynsec=True)
    table = json.loads(broker.credentials_path.read_text())
    operator = (table["operator"]["username"], table["operator"]["password"])
    admin = DynsecAdmin(broker.url, broker.admin_credentials, broker.prefix)
    passwords = {name: f"pw-{name}-{time.monotonic_ns()}" for name in NAMES}
    for name in NAMES:
        for command in create_commands(name, passwords[name]):
            admin.command(command)
    key = signing.generate_key()
    data = mnist_slice(mnist_cache_dir, tmp_path / "slice.npz", 1000, 300)
    devices = [write_config(tmp_path, name, broker.url, signing.public_key_text(key),
                            {"mnist": {"format": "npz", "path": str(data)}},
                            credentials=(device_user(name), passwords[name])) for name in NAMES]
    watcher = Watcher.connect(broker.url, operator)
    publisher = MqttTransport("itest-operator", broker.url, username=operator[0], password=operator[1],
                              threaded=True)
    publisher.connect([])
    rogue = MqttTransport("itest-rogue-pi-b", broker.url, username=device_user("pi-b"),
                          password=passwords["pi-b"], threaded=True)
    rogue.connect([])
    try:
        for device in devices:
            device.start()
        watcher.wait(lambda: all(watcher.records.get(n, {}).get("state") == "idle" for n in NAMES), 180,
                     "both records")
        # pi-b's credentials: a job of its own (signed even), a record in pi-a's name, an exec as
        # pi-a. The broker drops them all: no device ever sees the job.
        forged = signing.envelope_bytes(signing.sign(JobSpec.model_validate(
            {"name": "forged", "data": "mnist", "assignments": {"pi-a": 0, "pi-b": 1}, "submitted_at": 1.0}), key))
        rogue.publish(topics.job_spec("forged"), forged, retain=True, reliable=True)
        rogue.publish(topics.device_record("pi-a"), b'{"id":"pi-a","state":"idle"}', retain=True, reliable=True)
        rogue.publish(topics.job_exec("forged", "pi-a"), b"{}", retain=True, reliable=True)
        # As `job submit` does: the grants first (a device's job connection subscribes at once),
        # then the signed job (its node ids: the devices sorted by name).
        for command in grant_commands("granted", {n: i for i, n in enumerate(sorted(NAMES))}):
            if command["command"] != "deleteRole":  # a resubmission's cleanup; nothing to delete here
                admin.command(command)
        submit(publisher, key, "granted", NAMES, stop={"rounds": 4},
               agent_options={"eval_every": 2, "eval_samples": 300, "round_deadline": 10.0})
        watcher.wait(lambda: all(watcher.state("granted", n) is ExecState.SUCCEEDED for n in NAMES)
                     and "granted" in watcher.results, 120, "the granted job to end with its result")
        assert ("forged", "pi-a") not in watcher.execs and ("forged", "pi-b") not in watcher.execs
        assert watcher.results["granted"].round == 4
    finally:
        codes = [d.stop() for d in devices]
        for client in (rogue, publisher):
            client.close()
        watcher.close()
        broker.stop()
    assert codes == [0, 0]
