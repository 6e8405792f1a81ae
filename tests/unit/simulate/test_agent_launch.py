"""Each node's command line: the flags a run gives its agents (simulate.agent_launch)."""

from __future__ import annotations

import argparse
from pathlib import Path

from simulate import cli
from simulate.agent_launch import AgentLaunch
from simulate.stage import Network


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_a_mixed_fleet_alternates_the_agents_backend_and_model(tmp_path: Path) -> None:
    from simulate.model_choice import choose
    from simulate.scenario import load_scenario

    tflite, factory = tmp_path / "cnn.tflite", tmp_path / "cnn.py"
    tflite.write_bytes(b"x")
    factory.write_text("def factory(): ...\n")
    args = _args("--backend", "mixed", "--model", str(tflite), "--numpy-model", f"{factory}:factory",
                 "--partition", "dirichlet:0.5")
    scenario = load_scenario("default")  # 7 nodes
    launch = AgentLaunch(scenario, "j", choose(args, scenario.agent), tmp_path / "run")
    specs = launch.specs("mqtt://127.0.0.1:1883", None, Network())
    flags = [spec.command() for spec in specs]
    for node, command in enumerate(flags):
        model = command[command.index("--model") + 1]
        assert model == (f"{factory.resolve()}:factory" if node % 2 == 0 else str(tflite.resolve()))
        assert ("--backend" in command) == (node % 2 == 1)
        assert command[command.index("--partition") + 1] == "dirichlet:0.5"
        assert command[command.index("--fleet-size") + 1] == "7"


def test_the_default_run_gives_the_agents_the_flags_of_before(tmp_path: Path) -> None:
    from simulate.model_choice import choose
    from simulate.scenario import load_scenario

    scenario = load_scenario("default")
    launch = AgentLaunch(scenario, "j", choose(_args(), scenario.agent), tmp_path / "run")
    command = launch.specs("mqtt://127.0.0.1:1883", None, Network())[0].command()
    for flag in ("--model", "--backend", "--dataset", "--data", "--partition"):
        assert flag not in command
