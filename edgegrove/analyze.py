"""`edgegrove analyze`: the device's analytic studies plus the simulator's fault cost."""

from __future__ import annotations

from agent.cli import Command
from agent.commands.analyze import SUBCOMMANDS as DEVICE_SUBCOMMANDS

SUBCOMMANDS: dict[str, Command] = {
    **DEVICE_SUBCOMMANDS,
    "fault-cost": Command(
        "simulate.fault_cost",
        "round time with 1 / 2 parallel / 2 serial link faults at a fixed timeout (thesis Table 1)",
    ),
    "partition": Command(
        "simulate.partition_cost",
        "what isolating nodes cost in simulate runs: the cut round's time, rounds from the heal to all back",
    ),
}
