"""`python -m simulate.faulty_agent`: `edgegrove agent` with the simulator's fault injector.

The same options and the same agent; its MQTT transport is wrapped in
``simulate.faults.FaultyTransport``, so link cuts, loss and latency commanded by the simulator
(or the dashboard's fault controls) take effect inside the agent. The fleet launcher
(``simulate.fleet``) starts every agent of a run this way.
"""

from __future__ import annotations

import sys

from agent.commands import agent
from simulate.faults import wrap_agent_transport


def main(argv: list[str] | None = None) -> int:
    return agent.main(argv, wrap_transport=wrap_agent_transport)


if __name__ == "__main__":
    sys.exit(main())
