"""Which job `edgegrove simulate` runs: the credentials' own, else --job, else a new name; a
--job that contradicts the credentials is one line and exit 2 before anything starts."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from agent.validate import UsageError
from simulate import cli
from simulate.validate import choose_job


def _credentials(tmp_path: Path, **doc: object) -> Path:
    path = tmp_path / "credentials.json"
    agents = {str(i): {"username": f"agent-{i}", "password": "pw"} for i in range(7)}
    path.write_text(json.dumps({"agents": agents, "admin": {"username": "admin", "password": "a"},
                                "dashboard": {"username": "dashboard", "password": "d"}, **doc}))
    return path


def test_the_credentials_job_wins_and_says_so(tmp_path: Path) -> None:
    creds = _credentials(tmp_path, job="ext", prefix="edgegrove/ext")
    choice = choose_job(None, creds, "sim-new")
    assert choice.job == "ext"
    assert choice.line() == f"simulate: job ext (from --credentials {creds})"
    assert choose_job("ext", creds, "sim-new").job == "ext"


def test_job_flag_or_a_new_name(tmp_path: Path) -> None:
    assert choose_job("mine", None, "sim-new").line() == "simulate: job mine (from --job)"
    fresh = choose_job(None, None, "sim-new")
    assert fresh.job == "sim-new" and "a new name" in fresh.line()
    old_file = _credentials(tmp_path)  # made before credentials named their job
    assert choose_job("mine", old_file, "sim-new").job == "mine"


@pytest.mark.parametrize(("job", "doc", "message"), [
    ("other", {"job": "ext"}, "does not match the job of --credentials"),
    ("bad/name", {}, "--job bad/name"),
    (None, {"job": "ext", "prefix": "fleet/ext"}, "topic prefix"),
    (None, {"job": "no spaces"}, "job name"),
])
def test_unusable_job_is_a_usage_error(tmp_path: Path, job: str | None, doc: dict[str, str],
                                       message: str) -> None:
    with pytest.raises(UsageError, match=message):
        choose_job(job, _credentials(tmp_path, **doc), "sim-new")


def test_a_mismatch_exits_2_with_one_line_before_anything_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    creds = _credentials(tmp_path, job="ext", prefix="edgegrove/ext")
    out = tmp_path / "run"
    args = parser.parse_args(["--broker", "mqtt://127.0.0.1:1", "--credentials", str(creds),
                              "--job", "other", "--out", str(out)])
    assert cli.run(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("edgegrove simulate: --job other does not match")
    assert "ext" in err and not out.exists()


def test_no_persistence_is_for_the_simulators_own_mosquitto(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--broker", "embedded", "--no-persistence", "--out", str(tmp_path / "r")])
    assert cli.run(args) == 2
    assert "--no-persistence" in capsys.readouterr().err
