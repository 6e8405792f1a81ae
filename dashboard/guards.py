"""What the API refuses before it acts: commands the fleet cannot carry out, foreign pages."""

from __future__ import annotations

from urllib.parse import urlsplit

from agent.protocol.messages import Control
from dashboard.state import FleetState

LATENCY_LIMIT_S = 60.0
BROKER_OUTAGE_LIMIT_S = 60.0
BROKER_ACTIONS = frozenset({"broker_restart"})  # they target the broker, not a node


def fleet_ids(state: FleetState) -> list[int]:
    """The node ids a command may name: the simulator's fleet, else every node seen."""
    if state.run.fleet_size is not None:
        return list(range(state.run.fleet_size))
    seen = set(state.nodes) | set(state.view.members if state.view is not None else ())
    return sorted(seen)


def check_control(message: Control, state: FleetState) -> None:
    """Refuse a command the fleet could not carry out; ValueError says why."""
    if message.action in BROKER_ACTIONS:
        _check_outage(message.value)
        return
    ids = fleet_ids(state)
    for role, node in (("node", message.node), ("peer", message.peer)):
        if node is not None and ids and node not in ids:
            raise ValueError(f"{role} {node} is not in this fleet (nodes {_id_ranges(ids)})")
    if message.peer is not None and message.peer == message.node:
        raise ValueError(f"a link needs two different nodes, not {message.node}->{message.peer}")
    value = message.value
    if message.action == "loss" and value is not None and not 0.0 <= value <= 1.0:
        raise ValueError(f"loss is a probability between 0 and 1, not {value}")
    if message.action == "latency" and value is not None and not 0.0 <= value <= LATENCY_LIMIT_S:
        raise ValueError(f"latency is seconds between 0 and {LATENCY_LIMIT_S:.0f}, not {value}")


def _check_outage(value: float | None) -> None:
    if value is None or not 0.0 < value <= BROKER_OUTAGE_LIMIT_S:
        raise ValueError(f"a broker restart needs its outage, seconds above 0 and up to "
                         f"{BROKER_OUTAGE_LIMIT_S:.0f}, not {value}")


def _id_ranges(ids: list[int]) -> str:
    if ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}-{ids[-1]}"
    return ", ".join(str(i) for i in ids)


def origin_allowed(origin: str | None, host: str, allowed: tuple[str, ...]) -> bool:
    """A browser's page may open /ws only if it came from this dashboard (or an allowed origin).

    Clients that send no Origin are not browsers (curl, scripts): a foreign web page cannot
    make the operator's browser leave the header out.
    """
    if origin is None:
        return True
    if origin.rstrip("/") in {a.rstrip("/") for a in allowed}:
        return True
    return urlsplit(origin).netloc.lower() == host.lower() != ""
