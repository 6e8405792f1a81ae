"""The one Transport interface; MQTT (mqtt.py) and the in-memory bus (memory.py) implement it.

The runtime is the only caller. It publishes bytes on topics and drains received messages
from a bounded queue; a transport never calls protocol code itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class TransportError(Exception):
    """Anything that went wrong below the transport boundary (socket, paho, broker refusal)."""


# Not an MQTT topic: a transport queues a message on it after it reconnected (the broker may
# have restarted and lost every retained message). "$" topics are the broker's, and nobody
# subscribes to this one, so no client can send it to us.
RECONNECTED = "$edgegrove/reconnected"
DISCONNECTED = "$edgegrove/disconnected"  # the same, when the connection is lost
# The same kind of pseudo-topic: a large message is still arriving, piece by piece (a slow
# downlink). Its payload is the message's topic, UTF-8; the message itself follows when whole.
ARRIVING = "$edgegrove/arriving"
# And: what we published has been waiting to leave for a while (a slow uplink). No payload.
SENDING = "$edgegrove/sending"


@dataclass(frozen=True)
class Message:
    topic: str
    payload: bytes
    retained: bool = False
    # Seconds from a large PUBLISH's first byte to its last (at least
    # chunking.DOWNLINK_SAMPLE_BYTES): a sample of the downlink's rate. 0: not timed.
    arrival: float = 0.0


@dataclass(frozen=True)
class Will:
    topic: str
    payload: bytes
    retain: bool = True


class Transport(Protocol):
    def connect(
        self, subscriptions: list[str], will: Will | None = None, birth: Message | None = None
    ) -> None:
        """Connect and (re)subscribe to ``subscriptions`` on every (re)connect; publish
        ``birth`` (the retained online status) after each, so a broker that lost it learns
        again that we are alive."""
        ...

    def publish(
        self, topic: str, payload: bytes, retain: bool = False, reliable: bool = False
    ) -> None:
        """Send one message. QoS 0 (lost while the connection is down) unless ``reliable``:
        then it is kept and delivered after a reconnect (MQTT QoS 1). Frames are never
        reliable (late is useless to a round); status, view and telemetry are.
        Raises TransportError when the transport is closed."""
        ...

    def receive(self, timeout: float) -> list[Message]:
        """Return the messages queued so far, waiting at most ``timeout`` s for the first one."""
        ...

    def dropped(self) -> int:
        """Messages discarded because the bounded receive queue was full."""
        ...

    def close(self) -> None:
        """Publish nothing more, disconnect cleanly (the broker then does NOT send the Will)."""
        ...
