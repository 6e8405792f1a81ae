"""`edgegrove simulate`'s arguments, checked before anything starts (no directory, no broker,
no agent): each problem is one ``UsageError`` line, and the command exits 2."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from agent.validate import (
    UsageError,
    broker_url,
    in_range,
    input_file,
    output_dir,
    port,
    positive_seconds,
)
from simulate.scenario import FleetSection

BROKER_KINDS = ("auto", "mosquitto", "embedded")


def check_args(args: argparse.Namespace) -> None:
    """Every value of the command line that the scenario does not check itself."""
    _fleet(args.nodes, args.rounds)
    _broker(args.broker, args.credentials)
    _flag("--out", output_dir, args.out or Path("runs"))  # the default: runs/<time> here
    if not args.no_dashboard:
        _flag("--dashboard-port", port, str(args.dashboard_port))
    _flag("--ready-timeout", positive_seconds, str(args.ready_timeout))
    _flag("--stall-timeout", positive_seconds, str(args.stall_timeout))


def _flag(flag: str, check: Any, value: Any) -> Any:
    try:
        return check(value)
    except UsageError as exc:
        raise UsageError(f"{flag} {value}: {exc}") from None


def _bounds(name: str) -> tuple[int, int | None]:
    """The bounds FleetSection (the scenario's [fleet]) puts on one of its fields."""
    lo, hi = 1, None
    for rule in FleetSection.model_fields[name].metadata:
        lo = getattr(rule, "ge", lo)
        hi = getattr(rule, "le", hi)
    return lo, hi


def _fleet(nodes: int | None, rounds: int | None) -> None:
    if nodes is not None:
        lo, hi = _bounds("nodes")
        _flag("--nodes", lambda n: in_range(n, lo, hi, "a number of agents"), nodes)
    if rounds is not None and rounds <= 0:
        raise UsageError(f"--rounds {rounds}: a simulation runs a fixed number of rounds, then "
                         "writes its report: give --rounds 1 or more (for a fleet that trains "
                         "until stopped, run `edgegrove agent --rounds 0`)")


def _broker(choice: str, credentials: Path | None) -> None:
    if choice not in BROKER_KINDS:
        try:
            broker_url(choice)
        except UsageError as exc:
            raise UsageError(f"--broker: {exc}, or one of {', '.join(BROKER_KINDS)}") from None
    elif choice == "mosquitto":
        from simulate.brokers import mosquitto_available

        if not mosquitto_available():
            raise UsageError("--broker mosquitto: mosquitto is not installed: install it "
                             "(apt-get install mosquitto) or use --broker embedded")
    if credentials is not None and choice in BROKER_KINDS:
        raise UsageError(f"--credentials is for --broker mqtt://HOST:PORT (a broker you run); "
                         f"with --broker {choice} the simulator makes its own: drop it")
    if credentials is not None:
        _flag("--credentials", input_file, credentials)


def check_credentials(path: Path | None, nodes: int) -> None:
    """credentials.json as broker-config/make-credentials writes it, with admin and agents
    0..nodes-1 (None: nothing to check)."""
    if path is None:
        return
    _flag("--credentials", input_file, path)
    try:
        table = json.loads(path.read_text())
        admin = table["admin"]
        if not (isinstance(admin["username"], str) and isinstance(admin["password"], str)):
            raise TypeError
        agents = table["agents"]
        missing = [n for n in range(nodes) if str(n) not in agents]
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--credentials {path} cannot be read: {exc}") from None
    except (ValueError, KeyError, TypeError):
        raise UsageError(f"--credentials {path} is not a credentials.json with admin and agents "
                         "entries: generate one with broker-config/make-credentials") from None
    if missing:
        raise UsageError(f"--credentials {path} has no entry for agent {missing[0]}: generate it "
                         f"with broker-config/make-credentials --nodes {nodes}")
