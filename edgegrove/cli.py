"""The one `edgegrove` entry point: the device's commands and those of the simulator and the
dashboard, in one table.

Every command is imported only when it runs (``agent.cli.dispatch``), so `edgegrove agent` on a
Raspberry Pi without the dashboard or the simulator's extras imports neither.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from agent.cli import COMMANDS as DEVICE_COMMANDS
from agent.cli import Command, dispatch

COMMANDS: dict[str, Command] = {
    **DEVICE_COMMANDS,
    "analyze": Command("edgegrove.analyze", "analytic studies of the FT-tree (isolation, fault cost)"),
    "broker": Command("simulate.broker_cli", "run a broker: mosquitto from broker-config/, or the embedded one"),
    "dashboard": Command("dashboard.cli", "serve the live fleet dashboard"),
    "accounts": Command("dashboard.accounts_cli", "the dashboard's named operator accounts (add, remove, list)"),
    "simulate": Command("simulate.cli", "run a whole fleet with faults, the dashboard and a report"),
    "bench": Command("simulate.bench.cli", "benchmarks that print figures (model, agent, allreduce, ...)"),
}


def main(argv: Sequence[str] | None = None) -> int:
    return dispatch(
        "edgegrove",
        "Edgegrove: train one model on a fleet of unreliable edge devices.",
        COMMANDS,
        sys.argv[1:] if argv is None else argv,
    )


if __name__ == "__main__":
    sys.exit(main())
