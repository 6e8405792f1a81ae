"""End to end: a fleet on slow links adapts. Every agent's link is limited (the simulator's
bandwidth fault: each agent's TCP proxy, or a tbf qdisc on its namespace's veth) from round 1: the coordinator times the large frames
arriving on its downlink and publishes a view with the same members, small chunks and the
root's fan-out broadcast; the fleet follows it from a later round, on real mosquitto, and every
agent ends every round with the same model."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from agent.protocol.chunking import SLOW_LINK_CHUNK_VALUES
from simulate.injector import kernel_shaping_supported
from tests.integration.simulate_helpers import FAST, read_events, run_simulate

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NODES, ROUNDS = 5, 12


def scenario(shaper: str) -> str:
    limits = "".join(f"""
[[faults]]
kind = "bandwidth"
node = {n}
bytes_per_second = 12000000
at_round = 1
via = "{shaper}"
""" for n in range(NODES))
    return f"""
name = "slow-fleet"
description = "every agent's link limited to 12 MB/s from round 1, int8 on the wire"

[fleet]
nodes = {NODES}
rounds = {ROUNDS}

[agent]
wire_dtype = "int8"
eval_every = 0
{limits}"""


@pytest.mark.parametrize("shaper", [
    "proxy",
    pytest.param("kernel", marks=pytest.mark.skipif(bool(kernel_shaping_supported()),
                                                    reason="needs root, ip, tc and iptables")),
])
def test_a_fleet_on_slow_links_takes_small_chunks_and_the_fan_out_and_stays_identical(
        shaper: str, tmp_path: Path) -> None:
    scenario_file, run_dir = tmp_path / "slow.toml", tmp_path / "run"
    scenario_file.write_text(scenario(shaper))
    done = run_simulate("--scenario", str(scenario_file), "--broker", "mosquitto", "--out", str(run_dir),
                        "--json", *FAST, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["halted"] is False and summary["error"] is None and summary["rounds"] == ROUNDS
    assert summary["models_identical_at_end"] is True
    events = read_events(run_dir)
    injected = [e for e in events if e["type"] == "fault" and e["action"] == "inject"]
    assert len(injected) == NODES and {e["mechanism"] for e in injected} == {
        "netns-tbf" if shaper == "kernel" else "proxy"}
    views = [e for e in events if e["type"] == "view"]
    adapted = [v for v in views if v.get("broadcast") == "fanout"]
    assert adapted, [(v["epoch"], v.get("chunk_values"), v.get("broadcast")) for v in views]
    first = min(adapted, key=lambda v: v["epoch"])
    assert first["chunk_values"] == SLOW_LINK_CHUNK_VALUES and first["members"] == list(range(NODES))
    assert first["from_round"] < ROUNDS - 2, first  # the fleet ran rounds in it
    with open(run_dir / "rounds.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == ROUNDS and all(int(r["reporters"]) == NODES for r in rows), rows
    assert all(int(r["distinct_hashes"]) == 1 for r in rows), [r["distinct_hashes"] for r in rows]
    fanned = [r for r in rows if int(r["round"]) >= first["from_round"]]
    assert not [r["round"] for r in fanned if int(r["degraded_nodes"])], fanned
    # Nobody refused the root's fan-out: every member took the rounds' results from it.
    last = [e for e in events if e["type"] == "telemetry" and e["round"] == ROUNDS - 1]
    assert len(last) == NODES and not [e["rejected"] for e in last if e["rejected"]], last
