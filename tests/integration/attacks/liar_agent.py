"""`python -m tests.integration.attacks.liar_agent ATTACK AGENT-OPTIONS...`: a device that lies
about its contribution, with its own credentials and connection (modified code on a stolen
device):

- ``unit:F``: every unit it sends up that names itself (its whole unit: at an inner node its
  children's share too), and the audit copy of it, times F (tests.integration.hostile_data_agent);
- ``own:F``: its own gradient times F before anything is merged (at a leaf the same as
  ``unit:F``; at an inner node the children's share stays honest).

Everything else (statuses, ACKs, the state it serves, the children's units) is the honest
agent's.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np

from agent.commands import agent
from agent.config import AgentConfig
from agent.model import backend
from agent.transport.base import Transport
from simulate.faults import FaultyTransport, wrap_agent_transport
from tests.integration.hostile_data_agent import HostileTransport

ATTACKS = ("unit", "own")


def parse(attack: str) -> tuple[str, float]:
    kind, _, factor = attack.partition(":")
    if kind not in ATTACKS:
        raise ValueError(f"unknown attack {attack!r}: use unit:F or own:F")
    return kind, float(factor)


def scale_own_gradients(factor: float) -> None:
    """Every backend's gradient times ``factor``, as the agent computes it."""
    for cls in (backend.NumpyBackend, backend.ModelBackend):
        honest: Callable[..., tuple[float, np.ndarray]] = cls.gradients

        def lying(self: object, x: np.ndarray, y: np.ndarray,
                  honest: Callable[..., tuple[float, np.ndarray]] = honest) -> tuple[float, np.ndarray]:
            loss, grad = honest(self, x, y)
            return loss, (grad * np.float32(factor)).astype(np.float32)

        cls.gradients = lying  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    kind, factor = parse(argv[0])
    if kind == "own":
        scale_own_gradients(factor)
        return agent.main(argv[1:])

    def wrap(transport: Transport, config: AgentConfig) -> FaultyTransport:
        return HostileTransport(wrap_agent_transport(transport, config), f"scale:{factor}")

    return agent.main(argv[1:], wrap_transport=wrap)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
