"""What an installed device may do on the broker: its user name and its access rules.

The same rules as broker-config/acl.template's device block (a test holds the two together),
for making a device's client on a running dynamic-security broker (`edgegrove enroll --create`).
A job node's training topics are not here: `job submit` grants them per job (agent/operator/grants.py).
"""

from __future__ import annotations

from typing import Any

from agent.jobs.topics import ROOT, validate_device

# (access, topic), @DEVICE@ = the device's name.
DEVICE_RULES: tuple[tuple[str, str], ...] = (
    ("write", f"{ROOT}/devices/@DEVICE@"), ("write", f"{ROOT}/devices/@DEVICE@/log"),
    ("write", f"{ROOT}/jobs/+/exec/@DEVICE@"), ("read", f"{ROOT}/jobs/+/spec"),
    ("read", f"{ROOT}/jobs/+/control"), ("read", f"{ROOT}/jobs/+/exec/+"),
    ("read", f"{ROOT}/blobs/+/+"),
)


def device_user(device: str) -> str:
    """The MQTT user name of an installed device."""
    return f"device-{validate_device(device)}"


def device_rules(device: str) -> list[tuple[str, str]]:
    validate_device(device)
    return [(access, topic.replace("@DEVICE@", device)) for access, topic in DEVICE_RULES]


def dynsec_acls(rules: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Rules as dynamic-security ACL entries (read: subscribe + receive, write: send)."""
    acls: list[dict[str, Any]] = []
    for access, topic in rules:
        if access in ("read", "readwrite"):
            acls.append({"acltype": "subscribePattern", "topic": topic, "allow": True})
            acls.append({"acltype": "publishClientReceive", "topic": topic, "allow": True})
        if access in ("write", "readwrite"):
            acls.append({"acltype": "publishClientSend", "topic": topic, "allow": True})
    return acls


def create_commands(device: str, password: str) -> list[dict[str, Any]]:
    """Dynamic-security commands making the device's client with its own role."""
    user = device_user(device)
    return [
        {"command": "createRole", "rolename": user, "acls": dynsec_acls(device_rules(device))},
        {"command": "createClient", "username": user, "password": password,
         "textname": f"edgegrove device {device}", "roles": [{"rolename": user}]},
    ]
