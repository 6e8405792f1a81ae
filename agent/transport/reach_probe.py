"""Is the broker reachable again? Non-blocking TCP handshakes, a new one every PROBE_EVERY_S.

A node cut off the network reconnects by attempts whose SYN the cut drops, and the kernel
resends a SYN only after 1 s: a heal during an attempt waited for that resend or the attempt's
end (``ReconnectPace``'s full attempts last 2 s). In a run of partition-minority the three
nodes were back 0.04, 0.70 and 0.94 s after the heal, while the fleet ran rounds of 30-60 ms.
While attempts go unanswered, the transport launches a probe every PROBE_EVERY_S instead and
keeps each open for as long as a slow network's handshake may take, so the first SYN after a
heal goes out within PROBE_EVERY_S; its answer (a handshake, or a refusal: the host is there)
says to reconnect now. The probes only ever open a TCP connection and close it unused."""

from __future__ import annotations

import errno
import select
import socket
import time

PROBE_EVERY_S = 0.05
# An answer to any of these says the broker's host is reachable (a refusal: it is up, its broker
# perhaps not: the normal attempt that follows finds out).
_ANSWERED = (0, errno.ECONNREFUSED)


class ReachProbe:
    """Probes of ``address`` (a connected socket's ``getpeername()``) of ``family``."""

    def __init__(self, family: int, address: tuple[str, int], lifetime: float,
                 every: float = PROBE_EVERY_S) -> None:
        self.family, self.address = family, address
        self.lifetime, self.every = lifetime, every
        self._open: dict[socket.socket, float] = {}  # probe -> when it was launched
        self._launched_at: float | None = None
        self.launched = 0

    def wait(self, timeout: float) -> bool:
        """Launch the probes that are due and wait up to ``timeout`` s for an answer to one.
        True: the host answered (every probe is closed then)."""
        deadline = time.monotonic() + timeout
        while True:
            now = time.monotonic()
            self._expire(now)
            if self._launched_at is None or now - self._launched_at >= self.every:
                self._launch(now)
            next_launch = (self._launched_at or now) + self.every
            wait = max(0.0, min(deadline, next_launch) - now)
            if self._answered(wait):
                self.close()
                return True
            if time.monotonic() >= deadline:
                return False

    def open_count(self) -> int:
        return len(self._open)

    def close(self) -> None:
        for probe in self._open:
            probe.close()
        self._open.clear()
        self._launched_at = None

    def _launch(self, now: float) -> None:
        self._launched_at = now
        probe = socket.socket(self.family, socket.SOCK_STREAM)
        probe.setblocking(False)
        code = probe.connect_ex(self.address)
        self.launched += 1
        if code == errno.EINPROGRESS or code in _ANSWERED:
            self._open[probe] = now
        else:  # no route (an interface that is down): nothing to wait for; the next one in a while
            probe.close()

    def _expire(self, now: float) -> None:
        for probe, launched in list(self._open.items()):
            if now - launched >= self.lifetime:
                probe.close()
                del self._open[probe]

    def _answered(self, wait: float) -> bool:
        if not self._open:
            time.sleep(wait)
            return False
        try:
            _, done, _ = select.select([], list(self._open), [], wait)
        except (OSError, ValueError):
            return False
        for probe in done:
            if probe.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) in _ANSWERED:
                return True
            probe.close()  # no route, unreachable: that probe is over
            del self._open[probe]
        return False
