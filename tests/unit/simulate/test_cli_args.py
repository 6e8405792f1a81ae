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
    ["--tls", "--broker", "embedded"],
    ["--tls", "--broker", "mqtt://10.0.0.2:1883"],
    ["--tls", "--broker", "mosquitto", "--scenario", "partition-minority"],
    ["--uplink-trace"],  # no --sites: no uplinks to trace
])
def test_bad_input_exits_2_and_starts_nothing(argv: list[str], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    code = cli.run(_args(*argv, "--out", str(out)))
    assert code == 2
    assert not out.exists()
    assert "edgegrove simulate:" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "said"), [
    (["--sync-every", "0"], "1 or more"),
    (["--sync-every", "-2"], "1 or more"),
    (["--sync-every", "2.5"], "whole number"),
    (["--sync-every", "sometimes"], "or auto"),
    (["--sync-every", "auto", "--comm-share", "0"], "comm-share"),
    (["--sync-every", "auto", "--comm-share", "1.5"], "comm-share"),
    (["--sync-every", "auto", "--comm-share", "a fifth"], "comm-share"),
    (["--sync-every", "8", "--comm-share", "0.3"], "--sync-every auto"),
    (["--straggler-deadline", "0"], "straggler-deadline"),
    (["--straggler-deadline", "-1"], "straggler-deadline"),
    (["--straggler-deadline", "soon"], "straggler-deadline"),
    (["--sync-every", "4", "--outer-lr", "0"], "outer-lr"),
    (["--sync-every", "4", "--outer-lr", "-0.5"], "outer-lr"),
    (["--sync-every", "4", "--outer-optimizer", "adam"], "outer-optimizer"),
])
def test_bad_periodic_averaging_flags_exit_2_with_one_line(argv: list[str], said: str, tmp_path: Path) -> None:
    import subprocess
    import sys

    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "edgegrove.cli", "simulate", *argv, "--out", str(out)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not out.exists()


def test_outer_flags_without_sync_every_exit_2_and_start_nothing(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert cli.run(_args("--outer-lr", "0.5", "--out", str(out))) == 2
    assert "--sync-every" in capsys.readouterr().err and not out.exists()


def test_periodic_averaging_flags_become_agent_options() -> None:
    from simulate import periodic_args

    args = _args("--sync-every", "8", "--outer-optimizer", "nesterov", "--outer-lr", "0.6")
    assert periodic_args.agent_options(args) == {"sync_every": 8, "outer_optimizer": "nesterov", "outer_lr": 0.6}
    assert periodic_args.agent_options(_args()) == {}
    auto = _args("--sync-every", "auto", "--comm-share", "0.3")
    assert periodic_args.agent_options(auto) == {"sync_every": "auto", "comm_share": 0.3}
    assert periodic_args.agent_options(_args("--straggler-deadline", "1.5")) == {"straggler_deadline": 1.5}
    assert options_to_flags({"sync_every": "auto", "comm_share": 0.3}) == ["--sync-every", "auto", "--comm-share", "0.3"]
    assert options_to_flags({"sync_every": 8}) == ["--sync-every", "8"]
