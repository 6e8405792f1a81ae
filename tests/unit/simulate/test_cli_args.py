"""The simulate command's argument handling: bad input exits 2 before anything starts."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from simulate import cli
from simulate.fleet import options_to_flags
from simulate.scenario import ScenarioError


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_agent_options_parse_to_typed_values() -> None:
    assert cli.parse_agent_options(["eval_samples=1000", "timeout=0.25", "non-iid=true",
                                    "timeout_mode=fixed"]) == {
        "eval_samples": 1000, "timeout": 0.25, "non_iid": True, "timeout_mode": "fixed"}
    with pytest.raises(ScenarioError, match="KEY=VALUE"):
        cli.parse_agent_options(["eval_samples"])
    with pytest.raises(ScenarioError, match="sets it itself"):
        cli.parse_agent_options(["rounds=3"])


def test_options_become_agent_flags() -> None:
    assert options_to_flags({"timeout_mode": "fixed", "non_iid": True, "telemetry": False, "lr": 0.01}) == [
        "--timeout-mode", "fixed", "--non-iid", "--no-telemetry", "--lr", "0.01"]


def test_broker_choice_is_checked() -> None:
    for ok in ("auto", "mosquitto", "embedded", "mqtt://10.0.0.2:1883"):
        assert cli.check_broker_choice(ok) == ok
    with pytest.raises(ScenarioError, match="mqtt://HOST:PORT"):
        cli.check_broker_choice("rabbit")


@pytest.mark.parametrize("argv", [
    ["--broker", "rabbit"],
    ["--scenario", "no-such-scenario"],
    ["--nodes", "2", "--scenario", "thesis-2-serial"],
    ["--agent-option", "algorithm=gossip"],
])
def test_bad_input_exits_2_and_starts_nothing(argv: list[str], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    code = cli.run(_args(*argv, "--out", str(out)))
    assert code == 2
    assert not out.exists()
    assert "edgegrove simulate:" in capsys.readouterr().err
