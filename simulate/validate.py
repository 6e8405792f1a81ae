"""`edgegrove simulate`'s arguments, checked before anything starts (no directory, no broker,
no agent): each problem is one ``UsageError`` line, and the command exits 2."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.protocol.topics import validate_job
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
    if getattr(args, "no_persistence", False) and args.broker not in ("auto", "mosquitto"):
        raise UsageError(f"--no-persistence is for the simulator's own mosquitto, not --broker "
                         f"{args.broker}: drop it")
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


@dataclass(frozen=True)
class JobChoice:
    job: str
    why: str  # e.g. "from --credentials creds.json"

    def line(self) -> str:
        return f"simulate: job {self.job} ({self.why})"


def choose_job(job: str | None, credentials: Path | None, fresh: str) -> JobChoice:
    """The job to run: the credentials' own (their ACL allows no other), else ``--job``,
    else ``fresh`` (a new name). ``--job`` that contradicts the credentials is a UsageError."""
    if job is not None:
        _flag("--job", _job_name, job)
    own = _credentials_job(credentials) if credentials is not None else None
    if own is not None and job is not None and job != own:
        raise UsageError(f"--job {job} does not match the job of --credentials {credentials} "
                         f"({own}): its ACL allows only edgegrove/{own}/...: drop --job or "
                         f"give --job {own}")
    if own is not None:
        return JobChoice(own, f"from --credentials {credentials}")
    if job is not None:
        return JobChoice(job, "from --job")
    return JobChoice(fresh, "a new name for this run; --job or --credentials choose one")


def _job_name(text: str) -> str:
    try:
        return validate_job(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _credentials_job(path: Path) -> str | None:
    """The job a credentials.json was made for (None: an old file without one)."""
    try:
        table = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"--credentials {path} cannot be read: {exc}") from None
    job = table.get("job") if isinstance(table, dict) else None
    if job is None:
        return None
    _flag(f"--credentials {path}: job", _job_name, job if isinstance(job, str) else repr(job))
    prefix = table.get("prefix", f"edgegrove/{job}")
    if prefix != f"edgegrove/{job}":
        raise UsageError(f"--credentials {path} uses the topic prefix {prefix!r}; agents use "
                         f"edgegrove/<job>: make credentials without --prefix")
    return str(job)
