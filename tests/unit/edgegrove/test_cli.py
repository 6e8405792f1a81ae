"""The `edgegrove` command line: the device's commands plus the simulator's and the dashboard's."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from agent.cli import COMMANDS as DEVICE_COMMANDS
from edgegrove.cli import COMMANDS, main


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_overview_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0
    for name in ("agent", "topology", "train-local", "analyze", "broker", "dashboard", "simulate",
                 "bench"):
        assert f"\n  {name} " in out, name
    code, out, _ = run_cli(capsys)
    assert code == 2 and all(name in out for name in COMMANDS)


def test_the_device_commands_are_the_devices_own_modules() -> None:
    """Only `analyze` differs: the top level adds the simulator's fault cost to it."""
    for name, command in DEVICE_COMMANDS.items():
        if name != "analyze":
            assert COMMANDS[name] == command, name
    assert COMMANDS["analyze"].module == "edgegrove.analyze"


def test_analyze_lists_isolation_and_fault_cost(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "analyze", "--help")
    assert code == 0
    assert "isolation" in out and "fault-cost" in out
    code, _, err = run_cli(capsys, "analyze", "nonsense")
    assert code == 2 and "unknown command" in err


def _every_command() -> list[list[str]]:
    """Every command line of the CLI: the commands and each table's subcommands."""
    lines: list[list[str]] = []
    for name, command in COMMANDS.items():
        subcommands = getattr(importlib.import_module(command.module), "SUBCOMMANDS", None)
        lines += [[name, sub] for sub in subcommands] if subcommands else [[name]]
    return lines


@pytest.mark.parametrize("argv", _every_command(), ids=" ".join)
def test_every_command_prints_its_help(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    """Every help text renders: argparse fails on an unescaped "%" in one (say "20 %")."""
    code: int | str | None
    try:
        code = main([*argv, "--help"])
    except SystemExit as done:  # argparse's --help
        code = done.code
    out = capsys.readouterr().out
    assert code == 0 and "usage:" in out and "--help" in out, out[-500:]


def test_the_agent_command_imports_neither_the_simulator_nor_the_dashboard() -> None:
    """A device without the dashboard's and the simulator's extras runs `edgegrove agent`."""
    script = (
        "import sys\n"
        "from edgegrove.cli import main\n"
        "try:\n"
        "    main(['agent', '--help'])\n"
        "except SystemExit as done:\n"
        "    assert done.code == 0, done.code\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('simulate', 'dashboard'))\n"
        "print('loaded:', *loaded)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "usage: edgegrove agent" in done.stdout
    assert done.stdout.splitlines()[-1] == "loaded:"


@pytest.mark.parametrize("module", ["edgegrove", "edgegrove.cli"])
def test_python_dash_m_runs_the_same_command_line(module: str) -> None:
    done = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: edgegrove <command>") and "simulate" in done.stdout
