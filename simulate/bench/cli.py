"""`edgegrove bench`: the table of benchmarks (each row: a module with add_arguments/run)."""

from __future__ import annotations

from agent.cli import Command

SUBCOMMANDS: dict[str, Command] = {
    "model": Command("simulate.bench.model", "ms per training step and peak memory of both model backends"),
    "agent": Command("simulate.bench.agent", "peak resident memory and round time of agents in a small real fleet"),
}
