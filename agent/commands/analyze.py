"""`edgegrove analyze` on a device: the analytic studies of the FT-tree that need only the agent."""

from __future__ import annotations

from agent.cli import Command

SUBCOMMANDS: dict[str, Command] = {
    "isolation": Command(
        "agent.commands.isolation_cmd",
        "links failed at random until a node is isolated, vs tree height (thesis Figure 11)",
    ),
}
