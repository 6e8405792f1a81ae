"""End to end: `edgegrove simulate --sites 2` with 2 sites x 3 agents on bridged mosquittos,
site s1 cut off the core for 115 rounds (its bridge's uplink goes away). The fleet goes on
without it, s1 never forms a fleet of its own, and comes back with the fleet's model. The
checks follow the fleet's rounds (telemetry), not the wall clock; so does the cut, which a
quiet host outran when it lasted 10 s (the other site ran all 100 rounds in its first 4 s)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from simulate.brokers import mosquitto_available
from simulate.injector import kernel_shaping_supported
from tests.integration.simulate_helpers import FAST, read_events, run_simulate

pytestmark = [pytest.mark.integration, pytest.mark.slow,
              pytest.mark.skipif(not mosquitto_available(), reason="needs mosquitto (bridges)")]

BRIDGE_CUT = """
name = "bridge-cut-ci"
description = "2 sites x 3 agents: site s1 cut off the core from round 5 to round 120."

[fleet]
nodes = 6
rounds = 500

[[faults]]
kind = "bridge-cut"
site = "s1"
at_round = 5
heal_round = 120
"""
CUT_SITE = {3, 4, 5}


def _by_round(events: list[dict[str, Any]]) -> dict[int, dict[int, dict[str, Any]]]:
    rounds: dict[int, dict[int, dict[str, Any]]] = defaultdict(dict)
    for e in events:
        if e["type"] == "telemetry":
            rounds[e["round"]][e["node"]] = e
    return rounds


def _one_time(events: list[dict[str, Any]], type_: str, **match: Any) -> float:
    return min(e["t"] for e in events if e["type"] == type_ and all(e.get(k) == v for k, v in match.items()))


@pytest.mark.parametrize("where", [
    "one-network",
    # Each site's broker and agents in a namespace of their own, the uplinks' rate in the kernel.
    pytest.param("site-namespaces", marks=pytest.mark.skipif(
        bool(kernel_shaping_supported()), reason="needs root, ip, tc and iptables")),
])
def test_a_site_cut_off_the_core_waits_and_comes_back_with_the_fleets_model(tmp_path: Path, where: str) -> None:
    scenario = tmp_path / "bridge-cut.toml"
    scenario.write_text(BRIDGE_CUT)
    run_dir = tmp_path / "run"
    netns = ("--site-netns", "--uplink-rate", "50") if where == "site-namespaces" else ()
    done = run_simulate("--scenario", str(scenario), "--sites", "2", *netns, "--out", str(run_dir), "--json",
                        *FAST, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["halted"] is False and summary["faults_injected"] == 1
    events = read_events(run_dir)
    rounds = _by_round(events)
    views = [e for e in events if e["type"] == "view"]
    assert views[0]["sites"] == ["s0"] * 3 + ["s1"] * 3  # the site-aware tree
    assert not any(set(v["members"]) <= CUT_SITE for v in views), views  # never a second fleet
    cut = _one_time(events, "fault", action="inject")
    healed = _one_time(events, "fault", action="heal")  # a cut to a round heals in that round
    # The rest trained on during the cut: node 0 finished rounds in it.
    during = [r for r in rounds if 0 in rounds[r] and cut < rounds[r][0]["t"] < healed]
    assert len(during) >= 3, sorted(during)
    # The cut-off site formed no fleet of its own: a model its members report that the rest
    # never had comes from a round cut short (each member's own gradient: contributors <= 1)
    # or from a round of more contributors than the site has (seen once, on a loaded host:
    # node 3, round 428 of 500, 6 contributors, long after the heal; the run directory was
    # gone before it was read), never from the cut-off members averaging among themselves.
    fleet_models = {x["model_hash"] for by_node in rounds.values() for n, x in by_node.items()
                    if n not in CUT_SITE}
    for r, by_node in rounds.items():
        for n in CUT_SITE & set(by_node):
            if by_node[n]["model_hash"] not in fleet_models:
                assert not 1 < by_node[n]["contributors"] <= len(CUT_SITE), (r, n, by_node[n])
    after = [r for r in sorted(rounds) if min(x["t"] for x in rounds[r].values()) >= healed]
    whole = [r for r in after if set(rounds[r]) == set(range(6))
             and len({x["model_hash"] for x in rounds[r].values()}) == 1]
    assert whole, "the cut-off site never came back"
    back = min(x["t"] for x in rounds[whole[0]].values()) - healed
    print(f"cut for {healed - cut:.1f} s, node 0 ran {len(during)} rounds meanwhile; healed before "
          f"round {after[0]}, all 6 with one hash from round {whole[0]}, {back:.1f} s after the heal")
    # Rounds take 0.04-0.4 s with the host's load, so the bound is in seconds: the bridge redials (<= 5 s), the
    # view change waits out Membership's mass-down hold (half the view went at once), the
    # site rejoins with the fleet's state.
    assert back <= 25.0
    last = max(rounds)
    assert set(rounds[last]) == set(range(6)) and len({x["model_hash"] for x in rounds[last].values()}) == 1
