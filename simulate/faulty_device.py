"""`python -m simulate.faulty_device --config device.toml`: `edgegrove device` with the
simulator's fault injector.

The same device; the MQTT transport of each job it runs is wrapped in
``simulate.faults.FaultyTransport`` (as ``simulate.faulty_agent`` does for an agent), so link
cuts, loss and latency commanded by the simulator or the dashboard take effect inside the node.
`edgegrove simulate --via-devices` starts every device of a run this way.
"""

from __future__ import annotations

import sys

from agent.commands import device
from simulate.faults import wrap_agent_transport


def main(argv: list[str] | None = None) -> int:
    return device.main(argv, wrap_transport=wrap_agent_transport)


if __name__ == "__main__":
    sys.exit(main())
