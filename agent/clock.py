"""Time is injected: the runtime gets a Clock, tests get a fake one (agent.transport.memory)."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic scale."""
        ...


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()
