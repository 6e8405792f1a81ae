"""How long each reconnect attempt waits for its handshake. Pure: outcomes in, timeouts out.

A node cut off the network (a Wi-Fi access point that reboots) tries to reconnect: its SYNs are
dropped, and an attempt waits its whole timeout (the kernel resends the SYN only after 1 s).
With 2 s attempts a SYN went out about once a second, and a group healed together reconnected
0.5-0.8 s after the heal on an idle host: 6 of the fleet's 0.1 s rounds before any of them was
back. Nobody answering is not a slow broker: after an attempt that timed out, the next ones
wait a few times the last handshake that worked (at least ``UNANSWERED_TIMEOUT_S``) and follow
one another at once, so a SYN goes out several times a second; every ``FULL_EVERY``-th waits
the full timeout still, for a network whose handshakes became slower than that (a refused
attempt, a broker that is down, keeps the caller's backoff: nothing here retries faster)."""

from __future__ import annotations

UNANSWERED_TIMEOUT_S = 0.25  # at least this long for a handshake after one nobody answered
HANDSHAKE_MARGIN = 4.0  # ... and this many times the last handshake that worked
FULL_EVERY = 8  # every this many unanswered attempts in a row, one waits the full timeout


class ReconnectPace:
    def __init__(self, full_timeout: float) -> None:
        self.full_timeout = full_timeout
        self.unanswered = 0  # attempts in a row that timed out
        self.handshake: float | None = None  # seconds the last attempt that worked took

    def timeout(self) -> float:
        """How long the next attempt waits for TCP (and TLS)."""
        if self.unanswered == 0 or self.unanswered % FULL_EVERY == 0:
            return self.full_timeout
        usual = UNANSWERED_TIMEOUT_S if self.handshake is None else HANDSHAKE_MARGIN * self.handshake
        return min(self.full_timeout, max(UNANSWERED_TIMEOUT_S, usual))

    def timed_out(self) -> None:
        """An attempt got no answer at all (the next one follows at once: it waited already)."""
        self.unanswered += 1

    def refused(self) -> None:
        """An attempt was answered, with a refusal or an error: the broker is there (or down)."""
        self.unanswered = 0

    def answered(self, seconds: float) -> None:
        """An attempt's handshake worked, in ``seconds``."""
        self.unanswered = 0
        self.handshake = seconds
