"""A device killed mid-job (SIGKILL: a crash, a pulled plug) and started again resumes the same
job as the same node from its state directory, and the job ends with both devices (issue 52)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.jobs import signing
from agent.jobs.states import ExecState
from agent.transport.mqtt import MqttTransport
from tests.integration.device_fleet import (
    Watcher,
    mnist_slice,
    plain_mosquitto,
    submit,
    write_config,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROUNDS = 60


def test_a_device_killed_mid_job_resumes_it_as_the_same_node(tmp_path: Path, mnist_cache_dir: Path) -> None:
    broker, url = plain_mosquitto(tmp_path)
    key = signing.generate_key()
    data = mnist_slice(mnist_cache_dir, tmp_path / "slice.npz", 1000, 300)
    devices = [write_config(tmp_path, name, url, signing.public_key_text(key),
                            {"mnist": {"format": "npz", "path": str(data)}}) for name in ("dev-a", "dev-b")]
    watcher = Watcher.connect(url)
    operator = MqttTransport("itest-operator", url, threaded=True)
    operator.connect([])
    telemetry = MqttTransport("itest-telemetry", url, threaded=True)
    telemetry.connect(["edgegrove/resume/telemetry/1"])
    try:
        for device in devices:
            device.start()
        watcher.wait(lambda: all(watcher.records.get(d.name, {}).get("state") == "idle" for d in devices),
                     180, "idle records")
        submit(operator, key, "resume", ["dev-a", "dev-b"], stop={"rounds": ROUNDS},
               agent_options={"eval_every": 0, "checkpoint_every": 3, "round_deadline": 10.0})
        seen = [-1]

        def dev_b_at_round_5() -> bool:
            seen.extend(json.loads(m.payload)["round"] for m in telemetry.receive(0.05))
            return max(seen) >= 5

        watcher.wait(dev_b_at_round_5, 120, "dev-b at round 5")
        devices[1].kill()
        killed_at = max(seen)
        assert (devices[1].config.parent / "state" / "device-state.json").exists()
        devices[1].start()
        watcher.wait(lambda: all(watcher.state("resume", d.name) is ExecState.SUCCEEDED for d in devices),
                     180, "the job to end on both devices")
        history = watcher.history[("resume", "dev-b")]
        # The second life starts where the job is queued again (the first life's last states
        # may still have been on their way when it was killed).
        lives = [i for i, s in enumerate(history) if s.state is ExecState.QUEUED]
        assert len(lives) == 2, [s.state for s in history]
        before, after = history[:lives[1]], history[lives[1]:]
        assert [s.state for s in after][:3] == [ExecState.QUEUED, ExecState.ACCEPTED, ExecState.TRAINING]
        assert {s.node for s in history} == {1}
        assert after[-1].round == ROUNDS and after[0].seq > max(s.seq for s in before)
        assert killed_at < ROUNDS
        log = devices[1].log.read_text()
        assert "resumed from checkpoint" in log or "installed the fleet's state" in log, log[-3000:]
        watcher.wait(lambda: "resume" in watcher.results, 30, "the result")
        assert watcher.results["resume"].round == ROUNDS
    finally:
        codes = [d.stop() for d in devices]
        for client in (telemetry, operator):
            client.close()
        watcher.close()
        broker.terminate()
        broker.wait(10)
    assert codes == [0, 0]
