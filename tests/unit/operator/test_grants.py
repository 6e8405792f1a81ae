"""The dynamic-security roles of a job's nodes are acl.template's agent rules."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType

from agent.operator.grants import grant_commands, node_rules, refused, revoke_commands, role_acls

REPO = Path(__file__).resolve().parents[3]


def make_credentials() -> ModuleType:
    path = REPO / "broker-config" / "make-credentials"
    loader = importlib.machinery.SourceFileLoader("make_credentials_for_grants", str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_a_nodes_rules_are_the_templates_agent_block_for_that_node() -> None:
    module = make_credentials()
    users = module.parse_acl_template((REPO / "broker-config" / "acl.template").read_text(),
                                      "edgegrove/barn", [3])
    rules = node_rules("barn", 3)
    assert sorted(rules[:-2]) == sorted(users["agent-3"])
    assert rules[-2:] == [("write", "edgegrove/jobs/barn/result"), ("write", "edgegrove/jobs/barn/result/+")]


def test_each_device_gets_its_nodes_role_and_reads_as_subscribe_and_receive() -> None:
    commands = grant_commands("barn", {"pi-b": 1, "pi-a": 0})
    assert [c["command"] for c in commands] == ["deleteRole", "createRole", "addClientRole"] * 2
    assert commands[2] == {"command": "addClientRole", "username": "device-pi-a",
                           "rolename": "job-barn-node-0", "priority": 10}
    acls = role_acls("barn", 1)
    assert {"acltype": "publishClientSend", "topic": "edgegrove/barn/link/1/+", "allow": True} in acls
    assert {"acltype": "subscribePattern", "topic": "edgegrove/barn/link/+/1", "allow": True} in acls
    assert {"acltype": "publishClientReceive", "topic": "edgegrove/barn/link/+/1", "allow": True} in acls
    assert not any(a["topic"] == "edgegrove/barn/link/0/+" for a in acls)
    assert grant_commands("barn", {"pi-a": 0}, "{device}")[2]["username"] == "pi-a"
    assert {"acltype": "publishClientSend", "topic": "edgegrove/jobs/barn/result/+", "allow": True} in acls
    assert revoke_commands("barn", {"pi-a": 0}) == [{"command": "deleteRole", "rolename": "job-barn-node-0"}]


def test_only_a_missing_role_to_delete_is_not_a_refusal() -> None:
    delete = {"command": "deleteRole", "rolename": "r"}
    assert refused(delete, {"error": "Role not found"}) == ""
    assert refused({"command": "addClientRole", "rolename": "r"}, {"error": "Client not found"}) != ""
    assert refused({"command": "createRole", "rolename": "r"}, {}) == ""
