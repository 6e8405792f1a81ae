"""Issue 35, item 5: one model per fleet. Three real agents on a real mosquitto; node 2 runs
another model (a linear softmax classifier from a Python factory, not the thesis MLP). The
coordinator never admits it, node 2 says why in one line and exits with its own code, the
dashboard shows the incident, and the other two train together with one model hash."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from agent.runtime import REFUSED_EXIT
from dashboard.server import run_in_thread
from dashboard.settings import DashboardSettings
from simulate.brokers import start_mosquitto
from simulate.fleet import AgentSpec, Fleet
from tests.integration.fleet_harness import FAST_AGENT, FleetListener, agent_logs, wait_exited

pytestmark = [pytest.mark.integration, pytest.mark.slow]
JOB = "onemodel"
NODES = 3
ROUNDS = 8
FOREIGN = 2

LINEAR_MODEL = '''
import numpy as np
from agent.model.contract import TensorSpec


class Linear:
    name = "linear"
    input_shape = (784,)
    num_classes = 10
    tensors = (TensorSpec("w", (784, 10)), TensorSpec("b", (10,)))
    param_count = 7850

    def initial_params(self, seed):
        return (np.random.default_rng(seed).standard_normal(7850) * 0.01).astype(np.float32)

    def _scores(self, params, x):
        return x.reshape(len(x), 784) @ params[:7840].reshape(784, 10) + params[7840:]

    def loss_and_grad(self, params, x, y):
        s = self._scores(params, x)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        loss = float(-np.log(p[np.arange(len(y)), y] + 1e-12).mean())
        p[np.arange(len(y)), y] -= 1
        p /= len(y)
        g_w = x.reshape(len(x), 784).T @ p
        return loss, np.concatenate([g_w.ravel(), p.sum(axis=0)]).astype(np.float32)

    def predict(self, params, x):
        return self._scores(params, x).astype(np.float32)


def factory():
    return Linear()
'''


def test_an_agent_with_another_model_is_refused_and_the_fleet_trains_without_it(tmp_path: Path) -> None:
    model_file = tmp_path / "linear.py"
    model_file.write_text(LINEAR_MODEL)
    with start_mosquitto(tmp_path / "broker", job=JOB, nodes=NODES) as broker:
        creds = broker.dashboard_credentials
        listener = FleetListener(broker.url, JOB, creds.username, creds.password)
        dashboard = run_in_thread(DashboardSettings(broker_url=broker.url, job=JOB, username=creds.username,
                                                    password=creds.password, port=0,
                                                    event_log=tmp_path / "dashboard-events.jsonl"))
        specs = []
        for node in range(NODES):
            options = {"job": JOB, "fleet_size": NODES, **FAST_AGENT, "rounds": ROUNDS,
                       "credentials": str(broker.credentials_path)}
            if node == FOREIGN:
                options["model"] = f"{model_file}:factory"
            specs.append(AgentSpec(node=node, broker_url=broker.url, options=options,
                                   checkpoint_dir=tmp_path / f"ckpt-{node}", log_path=tmp_path / f"agent-{node}.log"))
        fleet = Fleet(specs)
        fleet.start_all()
        try:
            deadline = time.monotonic() + 120
            while fleet.agents[FOREIGN].running():
                assert time.monotonic() < deadline, f"node {FOREIGN} was never refused\n{agent_logs(tmp_path)}"
                listener.pump(0.2)
            popen = fleet.agents[FOREIGN].popen
            assert popen is not None and popen.returncode == REFUSED_EXIT, agent_logs(tmp_path)
            listener.wait_for(lambda: listener.reached([0, 1], ROUNDS - 1), 180, f"round {ROUNDS - 1}")
            wait_exited(fleet, 60)
            with urllib.request.urlopen(f"{dashboard.url.rstrip('/')}/api/incidents", timeout=10) as answer:
                incidents = json.loads(answer.read())
        finally:
            forced = fleet.stop_all(grace=10)
            listener.close()
            dashboard.stop()
        assert forced == [], agent_logs(tmp_path)

    log = (tmp_path / f"agent-{FOREIGN}.log").read_text()
    refusals = [line for line in log.splitlines() if "refused:" in line]
    assert len(refusals) == 1, log
    assert "every agent of a job must run the same model" in refusals[0]
    assert "(model linear, 7,850 params vs model mlp, 407,050 params" in refusals[0], refusals[0]
    assert "Traceback" not in log
    # The fleet's views name the thesis MLP and never take node 2 in.
    assert listener.views and all(v.members == [0, 1] for v in listener.views), listener.views
    fleet_fp = listener.views[-1].fingerprint
    assert len(fleet_fp) == 16 and listener.views[-1].model == "mlp" and listener.views[-1].params == 407050
    assert listener.status[0].fingerprint == fleet_fp
    assert FOREIGN not in listener.telemetry  # never ran a round
    for rnd in range(ROUNDS):
        hashes = listener.hashes_at(rnd)
        assert set(hashes) == {0, 1} and len(set(hashes.values())) == 1, (rnd, hashes)
    # Both trained: the loss went down from the first round to the last.
    for node in (0, 1):
        losses = [t.loss for t in listener.telemetry[node] if t.loss is not None]
        assert losses[-1] < losses[0], (node, losses)
    # The dashboard's incident, closed when the refused node went offline.
    mismatch = [i for i in incidents if i["kind"] == "model"]
    assert [i["title"] for i in mismatch] == [f"model mismatch: node {FOREIGN}"], incidents
    assert mismatch[0]["targets"] == [FOREIGN] and not mismatch[0]["active"]
    # Every agent announced its shard's labels: ten digits of MNIST.
    assert len(listener.status[1].labels) == 10 and sum(listener.status[1].labels) > 1000
