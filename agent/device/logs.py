"""The device's warnings and errors on its own log topic, rate-limited (a token bucket)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

BURST = 5


class LogForwarder(logging.Handler):
    """Sends WARNING and above to ``topic``; beyond ``rate`` lines a second (after a burst of
    BURST) lines are dropped and the next one sent says how many. Keeps the last error line
    (what a failed execution reports)."""

    def __init__(self, device: str, topic: str, publish: Callable[[str, bytes], None],
                 rate: float, clock: Callable[[], float]) -> None:
        super().__init__(level=logging.WARNING)
        self.device, self.topic, self.publish, self.rate, self.clock = device, topic, publish, rate, clock
        self.tokens = float(BURST)
        self.refilled_at = clock()
        self.dropped = 0
        self.last_error = ""

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage().replace("\n", " ")[:500]
        if record.levelno >= logging.ERROR:
            self.last_error = line
        now = self.clock()
        self.tokens = min(float(BURST), self.tokens + (now - self.refilled_at) * self.rate)
        self.refilled_at = now
        if self.tokens < 1.0:
            self.dropped += 1
            return
        self.tokens -= 1.0
        payload = {"device": self.device, "level": record.levelname.lower(), "logger": record.name,
                   "line": line, "time": now, "dropped": self.dropped}
        try:
            self.publish(self.topic, json.dumps(payload, separators=(",", ":")).encode())
            self.dropped = 0
        except Exception:  # never let the log kill what it logs; the line stays on stderr
            self.dropped += 1
