"""simulate.device_run: the operator commands run in the simulator's process as their CLI does."""

from __future__ import annotations

import argparse
from pathlib import Path

from agent.commands import job_fetch
from simulate.device_run import Login, _login_flags, _operator_command


def test_a_password_that_starts_with_a_dash_is_a_value_not_an_option(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    job_fetch.add_arguments(parser)
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    login = Login("mqtt://127.0.0.1:1883", "operator", "-Xy_z-9", str(ca))
    args = parser.parse_args(["job-1", "-o", str(tmp_path / "x"), *_login_flags(login)])
    assert (args.username, args.password, str(args.tls_ca)) == ("operator", "-Xy_z-9", str(ca))


def test_a_usage_error_of_the_command_is_a_runtime_error_not_the_simulators_exit() -> None:
    try:
        _operator_command(job_fetch, ["job-1", "--no-such-flag"], "job fetch")
    except RuntimeError as exc:
        assert "the following arguments are required: -o/--out" in str(exc)
    else:
        raise AssertionError("no RuntimeError")
