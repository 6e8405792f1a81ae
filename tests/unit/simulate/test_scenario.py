"""Scenario files: every shipped one is valid; bad ones fail with a message that says what to fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulate.scenario import (
    CrashFault,
    LinkFault,
    ScenarioError,
    builtin_names,
    load_scenario,
    parse_scenario,
)

SHIPPED = {"default", "thesis-1-fault", "thesis-2-parallel", "thesis-2-serial",
           "thesis-faults-5-10", "loss-sweep", "crash-rejoin", "flaky-wifi", "slow-links"}


def test_every_shipped_scenario_is_there_and_valid() -> None:
    assert set(builtin_names()) >= SHIPPED
    for name in builtin_names():
        scenario = load_scenario(name)
        assert scenario.name == name
        assert scenario.faults, f"{name} injects no fault"


def test_thesis_serial_faults_are_at_consecutive_heights() -> None:
    from agent.protocol.topology import Tree

    scenario = load_scenario("thesis-2-serial")
    tree = Tree.of(range(scenario.fleet.nodes))
    links = [f for f in scenario.faults if isinstance(f, LinkFault)]
    assert len(links) == 2
    depths = sorted(max(tree.depth(a), tree.depth(b)) for a, b in (f.nodes for f in links))
    assert depths == [1, 2]
    assert all(f.at_round == 5 and f.heal_round == 10 for f in links)


def test_default_scenario_is_the_one_loaded_without_a_name() -> None:
    assert load_scenario(None).name == "default"


def test_file_path_loads(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text('[fleet]\nnodes = 3\nrounds = 4\n[[faults]]\nkind = "crash"\nnode = 2\nat_round = 1\nrestart_round = 3\n')
    scenario = load_scenario(path)
    assert scenario.name == "mine"
    assert isinstance(scenario.faults[0], CrashFault)
    assert scenario.faults[0].end_round == 3


@pytest.mark.parametrize(("text", "needle"), [
    ('[[faults]]\nkind = "meteor"\nnode = 1\nat_round = 1\n', "unknown fault kind 'meteor'"),
    ('[[faults]]\nnode = 1\nat_round = 1\n', "a fault needs `kind = ...`"),
    ('[[faults]]\nkind = "crash"\nnode = 9\nat_round = 1\n', "node id 9 is out of range"),
    ('[[faults]]\nkind = "link"\nnodes = [0, 7]\nat_round = 1\n', "node id 7 is out of range"),
    ('[[faults]]\nkind = "crash"\nnode = 1\nat_round = 99\n', "past the end of the run"),
    ('[[faults]]\nkind = "hang"\nnode = 1\nat_round = 5\nresume_round = 5\n', "must come after at_round"),
    ('[[faults]]\nkind = "link"\nnodes = [2, 2]\nat_round = 1\n', "two different nodes"),
    ('[[faults]]\nkind = "loss"\nnode = 1\np = 1.5\nat_round = 1\n', "p"),
    ('[[faults]]\nkind = "crash"\nnode = 1\nat_round = 1\nwhen = 3\n', "unknown key"),
    ('[fleet]\nnodes = 7\nround = 3\n', "unknown key"),
    ('name = \n', "not valid TOML"),
    ('[agent]\nalgorithm = "gossip"\n', "[agent] is not valid"),
    ('[agent]\nid = 2\n', "may not set id"),
])
def test_bad_scenarios_are_rejected_with_a_clear_message(text: str, needle: str) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(text, "bad.toml")
    assert needle in str(info.value)
    assert "bad.toml" in str(info.value)


def test_missing_file_and_unknown_name_say_what_exists(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="does not exist"):
        load_scenario(tmp_path / "nope.toml")
    with pytest.raises(ScenarioError, match="thesis-2-serial"):
        load_scenario("no-such-scenario")


def test_command_line_fleet_size_is_checked_against_the_faults() -> None:
    scenario = load_scenario("thesis-2-serial")
    assert scenario.with_fleet(15, 20).fleet.nodes == 15
    with pytest.raises(ScenarioError, match="out of range"):
        scenario.with_fleet(3, None)
    with pytest.raises(ScenarioError, match="past the end"):
        scenario.with_fleet(None, 5)
