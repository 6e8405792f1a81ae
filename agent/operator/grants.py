"""A job's training topics for its devices, granted at submit time through dynamic security.

Each assigned device gets a role ``job-<job>-node-<n>``: the agent rules of
broker-config/acl.template for node n under ``edgegrove/<job>`` (tests check the two agree),
added to the device's MQTT client. A device so may write only its own node's topics in the job
it was assigned. Pure: the command (job_submit) sends the commands and reads the answers.
"""

from __future__ import annotations

from typing import Any

from agent.jobs import topics
from agent.jobs.acl import device_user, dynsec_acls
from agent.protocol.topics import Topics

DYNSEC_TOPIC = "$CONTROL/dynamic-security/v1"
DYNSEC_RESPONSE = f"{DYNSEC_TOPIC}/response"

# (access, topic under the job's prefix), @ID@ = the node: acl.template's "BEGIN agent" block.
AGENT_RULES: tuple[tuple[str, str], ...] = (
    ("write", "link/@ID@/+"), ("write", "fanout/@ID@"), ("write", "status/@ID@"),
    ("write", "telemetry/@ID@"), ("write", "state/@ID@"), ("write", "suspect/@ID@"),
    ("write", "view/@ID@"), ("read", "view/+"), ("read", "link/+/@ID@"), ("read", "fanout/+"),
    ("read", "status/+"), ("read", "suspect/+"), ("read", "state/+"), ("read", "control"),
    ("read", "bridge/+"),
)


def role_name(job: str, node: int) -> str:
    return f"job-{job}-node-{node}"


def node_rules(job: str, node: int) -> list[tuple[str, str]]:
    """The node's training topics (acl.template's agent block) and the job's result, which
    whichever node coordinates at the end publishes with its device's credentials."""
    prefix = Topics(job).prefix
    training = [(access, f"{prefix}/{topic.replace('@ID@', str(node))}") for access, topic in AGENT_RULES]
    return [*training, ("write", topics.job_result(job)), ("write", topics.job_result_chunks(job))]


def role_acls(job: str, node: int) -> list[dict[str, Any]]:
    return dynsec_acls(node_rules(job, node))


def grant_commands(job: str, assignments: dict[str, int], user_format: str | None = None) -> list[dict[str, Any]]:
    """deleteRole (a job submitted again), createRole and addClientRole for every device.
    A device's user is ``device-<name>`` (agent.jobs.acl) unless ``user_format`` says
    otherwise ({device} standing for its name)."""
    commands: list[dict[str, Any]] = []
    for device, node in sorted(assignments.items(), key=lambda item: item[1]):
        role = role_name(job, node)
        commands.append({"command": "deleteRole", "rolename": role})
        commands.append({"command": "createRole", "rolename": role, "acls": role_acls(job, node)})
        commands.append({"command": "addClientRole", "username": _user(device, user_format),
                         "rolename": role, "priority": 10})
    return commands


def _user(device: str, user_format: str | None) -> str:
    return device_user(device) if user_format is None else user_format.format(device=device)


def revoke_commands(job: str, assignments: dict[str, int]) -> list[dict[str, Any]]:
    """deleteRole for each node's role (removes it from its client too): after the job."""
    return [{"command": "deleteRole", "rolename": role_name(job, node)}
            for node in sorted(assignments.values())]


def refused(command: dict[str, Any], response: dict[str, Any]) -> str:
    """'' when ``response`` accepts ``command``; else why (a missing role to delete is fine)."""
    error = str(response.get("error") or "")
    if not error or (command["command"] == "deleteRole" and "not found" in error.lower()):
        return ""
    return f"{command['command']} {command.get('rolename', '')}: {error}"
