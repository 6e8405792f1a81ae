"""What the agent's process costs its device, read cheaply from the OS at each report.

IO-layer code for the runtime (the core never sees it): CPU time from the process's own
counters (``time.process_time``: user + system, every thread) and the resident set from
``/proc/self/statm`` (Linux; elsewhere ``getrusage``'s peak, the best the OS offers cheaply).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

STATM = "/proc/self/statm"


@dataclass(frozen=True)
class Usage:
    cpu_percent: float | None  # of one core, since the previous sample (None: first sample)
    rss_bytes: int  # resident set now (0: the OS did not say)


class ProcessUsage:
    """Samples CPU and memory; each sample's CPU share covers the time since the last one."""

    def __init__(self, cpu: Callable[[], float] = time.process_time,
                 wall: Callable[[], float] = time.monotonic,
                 rss: Callable[[], int] | None = None) -> None:
        self._cpu, self._wall = cpu, wall
        self._rss = rss if rss is not None else resident_bytes
        self._last = (cpu(), wall())

    def sample(self) -> Usage:
        cpu, wall = self._cpu(), self._wall()
        last_cpu, last_wall = self._last
        self._last = (cpu, wall)
        elapsed = wall - last_wall
        percent = round(100.0 * max(0.0, cpu - last_cpu) / elapsed, 2) if elapsed > 1e-6 else None
        return Usage(cpu_percent=percent, rss_bytes=self._rss())


def resident_bytes(statm: str = STATM) -> int:
    """The process's resident set in bytes: statm's second field (pages); 0 if unknown."""
    try:
        with open(statm, encoding="ascii") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource  # not on Windows
    except ImportError:
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return int(peak if os.uname().sysname == "Darwin" else peak * 1024)
