"""A compromised device poisoning the fleet's mean with gradients of plausible size (issue 38),
against a real 4-agent fleet on mosquitto with dynamic security.

Node 3 runs modified code (tests/integration/hostile_data_agent.py) with its own credentials
and connection: every unit it sends its parent is a constant 1800, or its honest gradient
times -10. Before the influence bound both passed (accuracy after 150 rounds 0.117 and 0.1035
against 0.9245 clean). Now its parent, node 1, bounds each unit where it first merges it:
the fleet learns as the clean one does, every member ends with one model, and the parent
counts what it bounded.

``EDGEGROVE_HOSTILE_ROUNDS=150`` runs the issue's measurement instead of the short test;
``EDGEGROVE_HOSTILE_ATTACKS`` (comma-separated, e.g. ``scale:-3``) other attacks."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from agent.protocol.wire import RejectReason
from simulate.brokers import MosquittoBroker, start_mosquitto
from simulate.fleet import AGENT_MODULE, AgentSpec, Fleet
from tests.integration.fleet_harness import FAST_AGENT, FleetListener, agent_logs, broker_job

pytestmark = [pytest.mark.integration, pytest.mark.slow]
JOB = "hostile-data"
NODES = 4
ATTACKER = 3  # a leaf: its parent is node 1
ROUNDS = int(os.environ.get("EDGEGROVE_HOSTILE_ROUNDS", "30"))
EVAL_EVERY = 10
# Attacked against clean accuracy (issue 38 allows 3 pp for clipped attacks).
ACCURACY_PP = 3.0
HOSTILE_MODULE = "tests.integration.hostile_data_agent"


@dataclass(frozen=True)
class HostileSpec(AgentSpec):
    """Agent ``node`` with its outgoing contributions rewritten by ``attack``."""

    attack: str = ""

    def command(self) -> list[str]:
        command = super().command()
        at = command.index(AGENT_MODULE)
        return [*command[:at], HOSTILE_MODULE, self.attack, *command[at + 1:]]


@dataclass(frozen=True)
class Run:
    accuracy: float
    hashes: dict[int, str]
    rejected: dict[int, dict[str, int]]
    members: list[int]
    degraded: int


def run_fleet(tmp: Path, attack: str | None) -> Run:
    with start_mosquitto(tmp / "broker", job=JOB, nodes=NODES) as broker:
        creds = broker.dashboard_credentials
        listener = FleetListener(broker.url, JOB, creds.username, creds.password)
        fleet = Fleet(_specs(broker, tmp, attack))
        fleet.start_all()
        try:
            # Fleet progress, not wall-clock: generous for a loaded host.
            listener.wait_for(lambda: listener.reached(list(range(NODES)), ROUNDS - 1), 60 + 3 * ROUNDS,
                              "the last round")
            last = ROUNDS - 1
            accs = [t.accuracy for n in range(NODES) for t in listener.telemetry[n]
                    if t.round == last and t.accuracy is not None]
            assert len(accs) == NODES, f"no accuracy after round {last}\n{agent_logs(tmp)}"
            return Run(accuracy=float(np.mean(accs)), hashes=listener.hashes_at(last),
                       rejected={n: dict(listener.last(n).rejected) for n in range(NODES)},
                       members=[t.members for t in listener.telemetry[0]],
                       degraded=sum(t.degraded for t in listener.telemetry[0]))
        finally:
            forced = fleet.stop_all(grace=10)
            listener.close()
            assert forced == [], agent_logs(tmp)


def _specs(broker: MosquittoBroker, tmp: Path, attack: str | None) -> list[AgentSpec]:
    specs: list[AgentSpec] = []
    for node in range(NODES):
        opts = {"job": broker_job(broker), "fleet_size": NODES, **FAST_AGENT, "rounds": ROUNDS,
                "eval_every": EVAL_EVERY, "credentials": str(broker.credentials_path)}
        common = {"node": node, "broker_url": broker.url, "options": opts,
                  "checkpoint_dir": tmp / f"ckpt-{node}", "log_path": tmp / f"agent-{node}.log"}
        specs.append(HostileSpec(**common, attack=attack) if attack and node == ATTACKER else AgentSpec(**common))
    return specs


def bounded(run: Run, node: int) -> int:
    """Units ``node`` clipped, counted with zero values, or refused as implausible."""
    reasons = (RejectReason.NORM_CLIPPED, RejectReason.NORM_REFUSED, "implausible_values",
               RejectReason.OWN_PART_CLIPPED, RejectReason.OWN_PART_REFUSED)
    return sum(run.rejected[node].get(reason, 0) for reason in reasons)


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run_fleet(tmp_path_factory.mktemp("clean"), None)


def test_an_honest_fleet_bounds_almost_nothing(clean: Run) -> None:
    units = (NODES - 1) * ROUNDS * 2  # a unit per child and chunk per round (2 chunks)
    total = sum(bounded(clean, n) for n in range(NODES))
    print(f"clean: accuracy {clean.accuracy:.4f} after {ROUNDS} rounds; units bounded {total} of ~{units}; "
          f"rejected {clean.rejected}")
    assert total <= 0.02 * units, clean.rejected
    assert len(set(clean.hashes.values())) == 1, clean.hashes


@pytest.mark.parametrize("attack", os.environ.get("EDGEGROVE_HOSTILE_ATTACKS", "constant:1800,scale:-10").split(","))
def test_a_device_sending_poisoned_gradients_is_bounded_and_counted(
    attack: str, clean: Run, tmp_path: Path
) -> None:
    attacked = run_fleet(tmp_path, attack)
    print(f"{attack}: accuracy {attacked.accuracy:.4f} against {clean.accuracy:.4f} clean after {ROUNDS} "
          f"rounds; node 1 bounded {bounded(attacked, 1)} units ({attacked.rejected[1]}); "
          f"degraded rounds {attacked.degraded}")
    # No split, no halt: every member in every view, one model at the end.
    assert len(attacked.hashes) == NODES and len(set(attacked.hashes.values())) == 1, attacked.hashes
    assert all(m == NODES for m in attacked.members), attacked.members
    # Its parent bounded its units in (nearly) every round, or found it lying and left it out
    # of its mean from then on (agent/protocol/plausibility.py), and counted either.
    left_out = attacked.rejected[1].get(RejectReason.LIAR_LEFT_OUT, 0)
    assert bounded(attacked, 1) >= ROUNDS or left_out >= 1, attacked.rejected
    assert attacked.degraded <= ROUNDS // 10, "rounds waited out the attacker's subtree"
    assert abs(attacked.accuracy - clean.accuracy) * 100 <= ACCURACY_PP, (attacked.accuracy, clean.accuracy)
