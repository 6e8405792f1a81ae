"""`simulate --via-devices`: what a job cannot carry exits 2 with one line before anything starts;
without the flag such a run goes through agents, and says so."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from simulate import cli


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize(("argv", "said"), [
    (["--backend", "mixed"], "one backend"),
    (["--agent-option", "client_id=x"], "a job cannot set client_id"),
    (["--sites", "2"], "--sites runs as agents"),
    (["--broker", "mqtt://127.0.0.1:1", "--credentials", "{creds}"], "--credentials runs as agents"),
])
def test_what_a_job_cannot_carry_exits_2(argv: list[str], said: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    creds = tmp_path / "credentials.json"
    creds.write_text('{"job": "j", "agents": {"0": {}, "1": {}, "2": {}, "3": {}, "4": {}, "5": {}, '
                     '"6": {}}, "admin": {"username": "a", "password": "p"}}')
    out = tmp_path / "run"
    argv = [a.replace("{creds}", str(creds)) for a in argv]
    code = cli.run(_args("--via-devices", *argv, "--out", str(out)))
    err = capsys.readouterr().err
    assert code == 2, err
    assert not out.exists()
    lines = [line for line in err.splitlines() if line.startswith("edgegrove simulate:")]
    assert len(lines) == 1 and said in lines[0], err


def test_without_the_flag_a_run_a_job_cannot_carry_goes_through_agents(capsys: pytest.CaptureFixture[str]) -> None:
    args = _args("--backend", "mixed")
    scenario = cli.load_scenario(None)
    assert cli._device_plan(args, scenario, cli.model_choice.choose(args, scenario.agent)) is None
    assert "runs as agents, not devices: a job runs one backend" in capsys.readouterr().err
    plain = _args()
    plan = cli._device_plan(plain, scenario, cli.model_choice.choose(plain, scenario.agent))
    assert plan is not None and plan.names[0] == "node-0" and plan.source.name == "mnist"
    assert cli._device_plan(_args("--via-agents"), scenario, cli.model_choice.choose(plain, scenario.agent)) is None


def test_via_devices_and_via_agents_exclude_each_other() -> None:
    with pytest.raises(SystemExit) as exited:
        _args("--via-devices", "--via-agents")
    assert exited.value.code == 2
