"""`simulate --via-devices`: what a job cannot carry exits 2 with one line before anything starts."""

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
    (["--sites", "2"], "drop --sites"),
    (["--broker", "mqtt://127.0.0.1:1", "--credentials", "{creds}"], "drop --credentials"),
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
