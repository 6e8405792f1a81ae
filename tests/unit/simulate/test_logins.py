"""Each process of a simulation gets its own credentials only (issue 54)."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest

from agent.config import ConfigError, load_config
from simulate.brokers import _load_make_credentials
from simulate.logins import credentials_options, dashboard_login, own_entry, write_agent_credentials

NODES = 3


def _table(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    doc = _load_make_credentials().make_credentials(tmp_path / "broker", range(NODES), job="j",
                                                     devices=["pi-1"])
    return tmp_path / "broker" / "credentials.json", doc


def _secrets(doc: dict[str, Any]) -> dict[str, str]:
    """Every password (and private key) of the table, by whose it is."""
    found = {f"agent-{n}": e["password"] for n, e in doc["agents"].items()}
    found |= {f"agent-{n}-key": e["device_key"] for n, e in doc["agents"].items() if "device_key" in e}
    found |= {f"device-{d}": e["password"] for d, e in doc["devices"].items()}
    for role in ("admin", "dashboard", "dashboard_control", "operator"):
        found[role] = doc[role]["password"]
    return found


def test_each_agent_file_holds_its_own_entry_and_no_other_secret(tmp_path: Path) -> None:
    table, doc = _table(tmp_path)
    out = tmp_path / "run" / "agents" / "credentials"
    paths = write_agent_credentials(table, range(NODES), out)
    assert sorted(paths) == list(range(NODES))
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    secrets = _secrets(doc)
    for node, path in paths.items():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        text = path.read_text()
        own = {f"agent-{node}", f"agent-{node}-key"}
        leaked = [who for who, secret in secrets.items() if who not in own and secret in text]
        assert leaked == [], f"agent {node}'s file holds the secrets of {leaked}"
        assert json.loads(text)["agents"] == {str(node): doc["agents"][str(node)]}


def test_the_agent_logs_in_with_its_own_file(tmp_path: Path) -> None:
    table, doc = _table(tmp_path)
    paths = write_agent_credentials(table, range(NODES), tmp_path / "own")
    config = load_config({"id": 2, "job": "j", "credentials": paths[2]}, environ={})
    assert (config.username, config.password) == ("agent-2", doc["agents"]["2"]["password"])
    assert config.client_id == doc["agents"]["2"]["client_id"]
    with pytest.raises(ConfigError, match=r"agents\.1"):  # another agent's id: nothing to take
        load_config({"id": 1, "job": "j", "credentials": paths[2]}, environ={})


def test_own_entry_keeps_only_public_parts_of_the_table() -> None:
    table = {"job": "j", "prefix": "edgegrove/j", "member_keys": {"0": "pub0", "1": "pub1"},
             "agents": {"0": {"username": "agent-0", "password": "p0"},
                        "1": {"username": "agent-1", "password": "p1"}},
             "admin": {"username": "admin", "password": "adm"}}
    assert own_entry(table, 1) == {"job": "j", "prefix": "edgegrove/j",
                                   "member_keys": {"0": "pub0", "1": "pub1"},
                                   "agents": {"1": {"username": "agent-1", "password": "p1"}}}


def test_the_dashboard_never_logs_in_as_the_admin(tmp_path: Path) -> None:
    table, doc = _table(tmp_path)
    login = dashboard_login(table)
    assert (login.username, login.password) == ("dashboard-control", doc["dashboard_control"]["password"])
    assert login.token is not None and login.token in login.says()
    old = tmp_path / "old.json"  # a table made before dashboard_control: it watches only
    old.write_text(json.dumps({k: v for k, v in doc.items() if k != "dashboard_control"}))
    assert dashboard_login(old) == type(login)("dashboard", doc["dashboard"]["password"], None)
    unauthenticated = dashboard_login(None)  # a broker without logins
    assert unauthenticated.username is None and unauthenticated.token is not None


def test_credentials_options_name_each_agents_own_file(tmp_path: Path) -> None:
    table, _ = _table(tmp_path)
    options = credentials_options(table, NODES, tmp_path / "own")
    assert options == {n: {"credentials": str(tmp_path / "own" / f"agent-{n}.json")} for n in range(NODES)}
    assert credentials_options(None, NODES, tmp_path / "none") == {}
