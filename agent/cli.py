"""The device's commands and the dispatcher every `edgegrove` command table goes through.

Subcommands are looked up in a table and imported lazily, so `edgegrove agent` on a
Raspberry Pi imports only the agent. Each command module exposes ``add_arguments(parser)``
and ``run(args) -> int``; a command with subcommands of its own (``bench``, ``analyze``)
exposes ``SUBCOMMANDS``, a table like ``COMMANDS`` below. ``COMMANDS`` lists what a device
runs; the whole command line (simulator and dashboard included) is ``edgegrove.cli``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from agent.validate import OneLineParser


@dataclass(frozen=True)
class Command:
    module: str
    summary: str


COMMANDS: dict[str, Command] = {
    "topology": Command("agent.commands.topology", "print the allreduce tree with its backup links"),
    "analyze": Command("agent.commands.analyze", "analytic studies of the FT-tree (isolation)"),
    "train-local": Command("agent.commands.train_local", "train the model on this machine alone (the baseline)"),
    "agent": Command("agent.commands.agent", "run one edge agent against an MQTT broker"),
    "device": Command("agent.commands.device", "run this device: it trains the jobs an operator submits"),
    "enroll": Command("agent.commands.enroll", "a device's credentials (once) and its device.toml"),
    "model": Command("agent.commands.model", "check your own model (and export a Keras one to .tflite)"),
    "job": Command("agent.commands.job", "submit a job to the enrolled devices, follow, stop and fetch it"),
    "devices": Command("agent.commands.devices", "the enrolled devices: labels, data sources, state, job"),
}


def dispatch(prog: str, description: str, table: dict[str, Command], argv: Sequence[str]) -> int:
    """Parse ``argv`` against a table of lazily imported subcommands and run the chosen one."""
    argv = list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_overview(prog, description, table))
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in table:
        print(f"{prog}: unknown command {name!r}\n\n{_overview(prog, description, table)}", file=sys.stderr)
        return 2
    command = table[name]
    try:
        module = importlib.import_module(command.module)
    except ModuleNotFoundError as exc:
        print(
            f"{prog} {name}: needs the Python module {exc.name!r}, which is not installed.\n"
            "Install the matching extra, e.g. `pip install 'edgegrove[dashboard,simulate,litert]'`.",
            file=sys.stderr,
        )
        return 2
    subcommands = getattr(module, "SUBCOMMANDS", None)
    if subcommands is not None:
        return dispatch(f"{prog} {name}", command.summary, subcommands, rest)
    parser = OneLineParser(
        prog=f"{prog} {name}",
        description=getattr(module, "DESCRIPTION", command.summary),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    module.add_arguments(parser)
    args = parser.parse_args(rest)
    try:
        return int(module.run(args) or 0)
    except BrokenPipeError:
        # `edgegrove ... | head`: the reader left; that is not an error of ours.
        sys.stderr.close()
        return 0


def _overview(prog: str, description: str, table: dict[str, Command]) -> str:
    width = max(len(n) for n in table)
    lines = [f"usage: {prog} <command> [options]", "", description, "", "commands:"]
    lines += [f"  {n.ljust(width)}  {c.summary}" for n, c in table.items()]
    lines += ["", f"`{prog} <command> --help` explains each command's options."]
    return "\n".join(lines)


if __name__ == "__main__":
    # The device's commands only; `python -m edgegrove.cli` has the simulator's and dashboard's too.
    sys.exit(dispatch("edgegrove", "Edgegrove's device commands.", COMMANDS, sys.argv[1:]))
