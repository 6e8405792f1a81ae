"""`edgegrove analyze`: analytic studies of the FT-tree that need no broker."""

from __future__ import annotations

from agent.cli import Command

SUBCOMMANDS: dict[str, Command] = {
    "isolation": Command(
        "agent.commands.isolation_cmd",
        "links failed at random until a node is isolated, vs tree height (thesis Figure 11)",
    ),
    "fault-cost": Command(
        "agent.commands.fault_cost",
        "round time with 1 / 2 parallel / 2 serial link faults at a fixed timeout (thesis Table 1)",
    ),
}
