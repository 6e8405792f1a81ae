"""Issue 35's second dataset: scikit-learn's bundled digits, trained by a user's numpy model
(examples/digits/model.py, the Python path) on 7 real agents over a real mosquitto, reaches the
accuracy the same model reaches on one machine. And a model whose loss goes NaN on one agent is
stopped there, with one line and exit 2, and never averaged in: the others finish."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from agent.model.backend import make_backend
from agent.model.data import BatchStream
from agent.model.datasets import load_digits
from agent.model.loader import load_model
from simulate.brokers import MosquittoBroker, start_mosquitto
from simulate.fleet import AgentSpec, Fleet
from tests.integration.fleet_harness import (
    FAST_AGENT,
    FleetListener,
    agent_logs,
    start_fleet,
    wait_exited,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]
JOB = "digits"
NODES = 7
ROOT = Path(__file__).resolve().parents[2]
MODEL = f"{ROOT / 'examples' / 'digits' / 'model.py'}:factory"
KERNEL = f"{ROOT / 'examples' / 'digits' / 'kernel.py'}:factory"
BATCH = 16
# scikit-learn's example "Recognizing hand-written digits": SVC(gamma=0.001) on this split, 0.97.
PUBLISHED_SVC = 0.97


@dataclass(frozen=True)
class Example:
    spec: str
    rounds: int
    lr: float
    floor: float  # the accuracy the fleet must reach besides the single machine's minus 1 pp


EXAMPLES = {
    "mlp": Example(MODEL, 300, 3e-3, 0.93),
    # The kernel machine's family is the published SVC's: within 1 pp of its 0.97.
    "rbf-features": Example(KERNEL, 600, 3e-2, PUBLISHED_SVC - 0.01),
}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[MosquittoBroker]:
    with start_mosquitto(tmp_path / "broker", job=JOB, nodes=NODES) as b:
        yield b


def listener_for(broker: MosquittoBroker) -> FleetListener:
    creds = broker.dashboard_credentials
    return FleetListener(broker.url, JOB, creds.username, creds.password)


def single_machine_accuracy(example: Example, seed: int = 0) -> float:
    """The same model, optimizer and steps on one machine, each step on NODES x BATCH samples
    (what one fleet round averages)."""
    data = load_digits()
    backend = make_backend("numpy", np.random.default_rng(seed), "adam", example.lr,
                           model=load_model(example.spec), seed=seed)
    stream = BatchStream(data.x_train, data.y_train, NODES * BATCH, np.random.default_rng([seed, 1]))
    for _ in range(example.rounds):
        x, y = next(stream)
        backend.apply(backend.gradients(x, y)[1])
    return backend.evaluate(data.x_test, data.y_test)[1]


@pytest.mark.parametrize("name", EXAMPLES)
def test_seven_agents_reach_the_single_machine_accuracy_on_digits(
    broker: MosquittoBroker, tmp_path: Path, name: str
) -> None:
    example = EXAMPLES[name]
    rounds = example.rounds
    single = single_machine_accuracy(example)
    listener = listener_for(broker)
    fleet = start_fleet(broker, tmp_path, NODES, {
        "model": example.spec, "dataset": "digits", "partition": "iid", "rounds": rounds,
        "batch": BATCH, "lr": example.lr, "eval_every": 100, "eval_samples": 899})
    try:
        listener.wait_for(lambda: listener.reached(list(range(NODES)), rounds - 1), 900, f"{rounds} rounds")
        wait_exited(fleet, 60)
    finally:
        fleet.stop_all(grace=10)
        listener.close()
    hashes = listener.hashes_at(rounds - 1)
    assert len(set(hashes.values())) == 1, f"models differ after the last round: {hashes}"
    accuracies = {n: [t.accuracy for t in ts if t.accuracy is not None][-1] for n, ts in listener.telemetry.items()}
    fleet_accuracy = accuracies[0]
    print(f"digits {name}: single machine {single:.4f}, 7-agent fleet {fleet_accuracy:.4f} "
          f"({rounds} rounds of {NODES} x {BATCH}, adam lr {example.lr})")
    assert len(set(accuracies.values())) == 1, accuracies
    assert single >= example.floor and fleet_accuracy >= example.floor
    assert fleet_accuracy >= single - 0.01, f"fleet {fleet_accuracy:.4f} vs single machine {single:.4f}"
    codes = {n: a.popen.returncode for n, a in fleet.agents.items() if a.popen is not None}
    assert set(codes.values()) == {0}, f"exit codes {codes}\n{agent_logs(tmp_path)}"


def test_a_nan_loss_stops_that_agent_and_is_never_averaged_in(broker: MosquittoBroker, tmp_path: Path) -> None:
    data = load_digits()
    clean, poisoned = tmp_path / "clean.npz", tmp_path / "poisoned.npz"
    np.savez(clean, x=data.x_train[:300], y=data.y_train[:300], x_test=data.x_test, y_test=data.y_test)
    x_bad = data.x_train[300:600].copy()
    x_bad[::40] = 3e38  # overflows the first layer: the model's loss turns NaN on such a batch
    np.savez(poisoned, x=x_bad, y=data.y_train[300:600], x_test=data.x_test, y_test=data.y_test)
    rounds = 40
    specs = []
    for node in range(3):
        options = {"job": JOB, "fleet_size": 3, **FAST_AGENT, "model": MODEL, "partition": "all",
                   "data": str(poisoned if node == 1 else clean), "rounds": rounds, "batch": BATCH,
                   "credentials": str(broker.credentials_path)}
        specs.append(AgentSpec(node=node, broker_url=broker.url, options=options,
                               checkpoint_dir=tmp_path / f"ckpt-{node}", log_path=tmp_path / f"agent-{node}.log"))
    listener = listener_for(broker)
    fleet = Fleet(specs)
    fleet.start_all()
    try:
        listener.wait_for(lambda: listener.reached([0, 2], rounds - 1), 240, f"{rounds} rounds at 0 and 2")
        wait_exited(fleet, 60)
    finally:
        fleet.stop_all(grace=10)
        listener.close()
    codes = {n: a.popen.returncode for n, a in fleet.agents.items() if a.popen is not None}
    assert codes == {0: 0, 1: 2, 2: 0}, f"exit codes {codes}\n{agent_logs(tmp_path)}"
    errors = [line for line in (tmp_path / "agent-1.log").read_text().splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "produced loss nan on a batch: stopped before the fleet averages it" in errors[0]
    losses = [t.loss for n in (0, 2) for t in listener.telemetry[n]]
    assert losses and all(np.isfinite(losses)), losses
    assert len(set(listener.hashes_at(rounds - 1).values())) == 1
