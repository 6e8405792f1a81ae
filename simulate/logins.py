"""Who each process of a simulation logs in as: its own credentials, nothing more.

The job's credentials.json (broker-config/make-credentials) holds every agent's password and
the admin's, the operator's and the dashboard's: an agent given it could act as any of them.
The simulator writes one file per agent instead, in the format the agent reads
(``agents.<id>``, with its client id and device key), plus the job's public key ring, 0600 in
a 0700 directory. The dashboard logs in as the read-only ``dashboard`` user, or with fault
controls as ``dashboard-control`` (that plus the job's control topic), never as the admin.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# What an agent's own file keeps of the job's table besides its agents.<id> entry: public.
SHARED_KEYS = ("job", "prefix", "member_keys")


def own_entry(table: Mapping[str, Any], node: int) -> dict[str, Any]:
    """The credentials document of agent ``node`` alone (KeyError: the table has none)."""
    entry = table["agents"][str(node)]
    own: dict[str, Any] = {key: table[key] for key in SHARED_KEYS if key in table}
    own["agents"] = {str(node): entry}
    return own


def write_agent_credentials(table_path: Path, nodes: Iterable[int], out_dir: Path) -> dict[int, Path]:
    """node -> the file holding that agent's own credentials (written from ``table_path``)."""
    table = json.loads(table_path.read_text())
    out_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(out_dir, 0o700)
    paths = {}
    for node in nodes:
        path = out_dir / f"agent-{node}.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(own_entry(table, node), f, indent=1)
        os.chmod(path, 0o600)  # an existing file keeps its mode through os.open
        paths[node] = path
    return paths


@dataclass(frozen=True)
class DashboardLogin:
    """The dashboard's user and password (None: a broker without logins) and the token of its
    fault controls (None: a table without a dashboard_control entry, so it watches only)."""

    username: str | None
    password: str | None
    token: str | None

    def says(self) -> str:
        if self.token is None:
            return "(no fault controls: the credentials have no dashboard_control entry)"
        return f"(fault-control token: {self.token})"


def dashboard_login(table_path: Path | None) -> DashboardLogin:
    """Read-only, or with fault controls the user that may also publish the job's control
    topic; never the admin."""
    token: str | None = secrets.token_urlsafe(12)
    if table_path is None:
        return DashboardLogin(None, None, token)
    table = json.loads(table_path.read_text())
    entry = table.get("dashboard_control")
    if not isinstance(entry, dict):
        entry, token = table["dashboard"], None
    return DashboardLogin(str(entry["username"]), str(entry["password"]), token)


def credentials_options(table_path: Path | None, nodes: int, out_dir: Path) -> dict[int, dict[str, str]]:
    """node -> the agent option naming its own credentials file ({} without a table)."""
    if table_path is None:
        return {}
    paths = write_agent_credentials(table_path, range(nodes), out_dir)
    return {node: {"credentials": str(path)} for node, path in paths.items()}
