"""The operator commands' shared preamble: errors as one line and exit code 2."""

from __future__ import annotations

import argparse

import paho.mqtt.client as mqtt
import pytest

from agent.cli import COMMANDS, dispatch
from agent.operator.connection import OperatorError, marker_topic, one_line_errors
from simulate.brokers import free_port
from tests.unit.jobs.test_acl import REPO, make_credentials


def test_an_operator_error_is_one_line_on_stderr_and_exit_code_2(capsys: pytest.CaptureFixture[str]) -> None:
    @one_line_errors("edgegrove job nothing")
    def run(args: argparse.Namespace) -> int:
        raise OperatorError("no job x on this broker")

    assert run(argparse.Namespace()) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", "edgegrove job nothing: no job x on this broker\n")


def test_a_command_that_goes_on_keeps_its_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    @one_line_errors("edgegrove job nothing")
    def run(args: argparse.Namespace) -> int:
        print("done")
        return 1

    assert run(argparse.Namespace()) == 1
    assert capsys.readouterr() == ("done\n", "")


@pytest.mark.parametrize("argv", [["devices"], ["job", "list"], ["job", "status", "j1"], ["job", "logs", "j1"]])
def test_each_operator_command_says_an_unreachable_broker_in_one_line(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    closed = f"mqtt://127.0.0.1:{free_port()}"  # nobody listens there
    code = dispatch("edgegrove", "test", COMMANDS, [*argv, "--broker", closed])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith(f"edgegrove {' '.join(a for a in argv if a != 'j1')}: ")
    assert err.count("\n") == 1


def test_the_operators_acl_lets_it_write_and_read_its_sync_marker() -> None:
    """Else every snapshot (each operator command, `simulate`'s submit and fetch) waits out
    3 s of quiet instead of the marker's round trip."""
    users = make_credentials().parse_acl_template((REPO / "broker-config" / "acl.template").read_text(),
                                                  "edgegrove/x", [], [])
    marker = marker_topic("edgegrove-operator-0123456789")
    assert any(access == "readwrite" and mqtt.topic_matches_sub(topic, marker)
               for access, topic in users["operator"]), users["operator"]
