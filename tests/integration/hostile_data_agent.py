"""`python -m tests.integration.hostile_data_agent ATTACK AGENT-OPTIONS...`: a compromised device.

The real agent (``simulate.faulty_agent``) with its own credentials and its own connection,
but every contribution it sends up the tree (a DATA unit whose contributors include itself)
rewritten on the way out, as modified code on a stolen device would:

- ``constant:V``: every value V (issue 38: V = 1800 poisoned a 4-agent fleet);
- ``scale:F``: its honest values times F (issue 38: F = -10, a sign flip);

Everything else (statuses, ACKs, the state it serves) is the honest agent's.
"""

from __future__ import annotations

import sys

import numpy as np

from agent.commands import agent
from agent.config import AgentConfig
from agent.protocol.wire import Frame, Kind, decode, encode
from agent.transport.base import Transport
from simulate.faults import FaultyTransport, wrap_agent_transport


def forge(attack: str, values: np.ndarray) -> np.ndarray:
    kind, _, number = attack.partition(":")
    if kind == "constant":
        return np.full(len(values), float(number), np.float32)
    if kind == "scale":
        return (values * np.float32(float(number))).astype(np.float32)
    raise ValueError(f"unknown attack {attack!r}")


class HostileTransport(FaultyTransport):
    def __init__(self, inner: FaultyTransport, attack: str) -> None:
        self.__dict__.update(inner.__dict__)
        self.attack = attack
        self.forged = 0

    def publish(self, topic: str, payload: bytes, retain: bool = False, reliable: bool = False) -> None:
        if self.topics.parse_link(topic) is not None:
            frame = decode(payload)
            if (isinstance(frame, Frame) and frame.kind in (Kind.DATA, Kind.RELAY) and not frame.is_broadcast
                    and self.node_id in frame.contributors):
                payload = encode(frame.with_values(forge(self.attack, frame.values()), frame.dtype))
                self.forged += 1
        super().publish(topic, payload, retain, reliable)


def main(argv: list[str]) -> int:
    attack, rest = argv[0], argv[1:]

    def wrap(transport: Transport, config: AgentConfig) -> FaultyTransport:
        forge(attack, np.zeros(1, np.float32))  # a bad attack fails here, not in a round
        return HostileTransport(wrap_agent_transport(transport, config), attack)

    return agent.main(rest, wrap_transport=wrap)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
