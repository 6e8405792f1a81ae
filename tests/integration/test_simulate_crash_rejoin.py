"""End to end: an agent SIGKILLed mid-run and restarted rejoins with the fleet's model."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from tests.integration.simulate_helpers import FAST, read_events, run_simulate

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_crashed_agent_rejoins_with_the_fleets_model(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = run_simulate("--scenario", "crash-rejoin", "--broker", "mosquitto", "--out", str(run_dir),
                        "--json", *FAST)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["halted"] is False
    crash = summary["faults"][0]
    assert crash["kind"] == "crash" and crash["detected"], crash  # the broker's Last Will
    events = read_events(run_dir)
    spawns = [e for e in events if e["type"] == "process" and e["event"] == "spawn" and e["node"] == 4]
    assert len(spawns) == 2, "node 4 was started, killed and started again"
    restarted_at = crash["end_round"]
    hashes: dict[int, dict[int, str]] = defaultdict(dict)
    for e in events:
        if e["type"] == "telemetry":
            hashes[e["round"]][e["node"]] = e["model_hash"]
    # Its return: the first round it takes part in again (the process needs a few seconds to
    # start, while the fleet goes on). Within a few rounds of that, node 4 reports the same
    # model hash as every other agent.
    returned = [r for r in sorted(hashes) if r >= restarted_at and 4 in hashes[r]]
    assert returned, "node 4 never reported again after its restart"
    agree = [r for r in returned if len(set(hashes[r].values())) == 1 and len(hashes[r]) == 7]
    assert agree, {r: hashes[r] for r in returned}
    assert agree[0] <= returned[0] + 3, f"back at round {returned[0]}, same model only at {agree[0]}"
    print(f"crash at round {crash['at_round']}, restart at {restarted_at}, back at {returned[0]}, "
          f"same hash from round {agree[0]}")
