"""Issue 42's smoke test: `edgegrove bench flower` runs a real Flower deployment (SuperLink,
3 SuperNodes, our MLP under FedAvg) and a real Edgegrove fleet of 3, 2 rounds each, and
reports both. Flower is an optional extra: without it this test FAILS (never skips), saying how
to install it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from simulate.bench.flower_deploy import FlowerMissing, find_flower_bin

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NODES, ROUNDS = 3, 2
MODEL_MB = 407050 * 4 / 1e6


def test_flower_and_edgegrove_both_train_and_are_measured() -> None:
    try:
        find_flower_bin(None)
    except FlowerMissing as exc:
        pytest.fail(f"Flower is not installed for the bench: {exc}")
    command = [sys.executable, "-m", "edgegrove.cli", "bench", "flower", "--nodes", str(NODES),
               "--flower-rounds", str(ROUNDS), "--local-steps", "2", "--rounds", str(ROUNDS),
               "--eval-every", "1", "--faults", "--target", "0.999", "--budget", "240", "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=420, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout)
    (result,) = doc["results"]
    flower, edgegrove = result["flower"], result["edgegrove"]
    assert flower["finished"] and flower["rounds"] == ROUNDS, flower
    assert flower["replies"] == {"1": NODES, "2": NODES}, flower
    # every round, every client downloads the model and uploads its own: at least 2 x 1.6 MB each
    assert flower["bytes_mb"] >= ROUNDS * NODES * 2 * MODEL_MB, flower
    assert edgegrove["finished"] and edgegrove["rounds"] == ROUNDS, edgegrove
    for entry in (flower, edgegrove):
        assert entry["time_to_target"] is None  # 99.9 % is out of reach in 2 rounds
        assert 0.1 < entry["final_accuracy"] < 0.999, entry
        memory = entry["memory"]
        assert sorted(memory["per_client_mb"]) == [str(n) for n in range(NODES)], memory
        assert 30 < memory["median_mb"] <= memory["max_mb"], memory
    assert doc["tuning"] and doc["machine"]["cpu_count"]
