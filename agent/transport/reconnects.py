"""When and how the MQTT transport reconnects: the backoff of connections that die young, the
inline loop's attempts, how long each waits for its handshake (``ReconnectPace``) and, while
attempts go unanswered, the probes that say the network is back (``ReachProbe``)."""

from __future__ import annotations

import contextlib
import ssl
import time
from typing import Any

import paho.mqtt.client as paho

from agent.transport.reach_probe import ReachProbe
from agent.transport.reconnect_pace import ReconnectPace

SHORT_LIVED_S = 1.0  # a connection the broker closes sooner counts towards reconnect backoff
SHORT_LIVED_BACKOFF_STEPS = 2  # at most 4x the minimum delay: a flapping link is back soon after


class Reconnects:
    def __init__(self, min_s: float, max_s: float, timeout_s: float) -> None:
        self.min_s, self.max_s = min_s, max_s
        self.pace = ReconnectPace(timeout_s)
        self.delay = min_s
        self.at = 0.0  # inline mode: the next attempt (monotonic)
        self.short_lived = 0  # connections in a row that the broker closed within SHORT_LIVED_S
        self.peer: tuple[int, tuple[str, int]] | None = None  # the broker's family, address
        self.probe: ReachProbe | None = None  # attempts unanswered: is the network back?

    def connected(self, sock: Any) -> None:
        self.delay = self.min_s
        with contextlib.suppress(OSError, AttributeError):
            self.peer = (sock.family, sock.getpeername())

    def stalled(self) -> None:
        """We ended a connection nobody ACKed: probe before the next attempt."""
        self.pace.timed_out()

    def back_off(self, client: paho.Client, lived: float) -> None:
        """paho retries at the minimum delay after every successful CONNACK: two clients with
        one client id (a duplicate agent) would take the session from each other forever, and
        a flapping link would be hammered. Connections that die young back off exponentially,
        which also gives a displaced agent the quiet moment to see who displaced it."""
        self.short_lived = min(self.short_lived + 1, SHORT_LIVED_BACKOFF_STEPS) if lived < SHORT_LIVED_S else 0
        delay = min(self.max_s, self.min_s * 2 ** self.short_lived)
        client.reconnect_delay_set(delay, self.max_s)  # type: ignore[arg-type]
        self.delay = delay  # the inline loop's backoff
        if self.short_lived:
            self.at = time.monotonic() + delay

    def attempt(self, client: paho.Client, timeout: float) -> None:
        """Inline mode, not connected: try again when the backoff allows (doubling, as paho's
        thread does), waiting at most ``timeout`` s for its turn or a probe's answer."""
        now = time.monotonic()
        if now < self.at:
            time.sleep(min(timeout, self.at - now))
            return
        if not self._reachable(timeout):
            return
        now = time.monotonic()
        self.at = now + self.delay
        self.delay = min(self.max_s, self.delay * 2)
        self.bound(client)
        try:
            client.reconnect()  # CONNACK then arrives through the loop -> on_connect
        except TimeoutError:  # nobody answered: a cut network, not a broker refusing
            self.pace.timed_out()
            self.at = time.monotonic()
        except (OSError, ValueError, ssl.SSLError, paho.WebsocketConnectionError):
            self.pace.refused()
        else:
            self.pace.answered(time.monotonic() - now)

    def _reachable(self, timeout: float) -> bool:
        """While attempts go unanswered (a cut network), an attempt waits for an answer to a
        probe: the first SYN after a heal goes out within PROBE_EVERY_S, not at the kernel's
        resend a second into an attempt. Probes wait at most ``timeout`` s here."""
        if not self.pace.unanswered or self.peer is None:
            return True
        if self.probe is None:
            self.probe = ReachProbe(*self.peer, lifetime=self.pace.full_timeout)
        if not self.probe.wait(timeout):
            return False
        self.probe = None
        return True

    def bound(self, client: paho.Client) -> None:
        """Reconnects wait for the handshake as ``ReconnectPace`` says (RECONNECT_TIMEOUT_S at
        most). paho refuses the change while its connection is open (then nothing to bound)."""
        with contextlib.suppress(RuntimeError, ValueError):
            client.connect_timeout = self.pace.timeout()

    def close(self) -> None:
        if self.probe is not None:
            self.probe.close()
            self.probe = None
