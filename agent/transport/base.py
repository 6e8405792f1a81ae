"""The one Transport interface; MQTT (mqtt.py) and the in-memory bus (memory.py) implement it.

The runtime is the only caller. It publishes bytes on topics and drains received messages
from a bounded queue; a transport never calls protocol code itself.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol


class TransportError(Exception):
    """Anything that went wrong below the transport boundary (socket, paho, broker refusal)."""


class Notice(enum.Enum):
    """What a transport tells its reader about the connection, in order with the messages."""

    # The connection is back (the broker may have restarted and lost every retained message).
    RECONNECTED = "reconnected"
    DISCONNECTED = "disconnected"  # the connection is lost
    # A large message is still arriving, piece by piece (a slow downlink); ``Message.about``
    # names its topic. The message itself follows when whole.
    ARRIVING = "arriving"
    SENDING = "sending"  # what we published has been waiting to leave for a while (a slow uplink)


@dataclass(frozen=True)
class Message:
    topic: str
    payload: bytes
    retained: bool = False
    # Seconds from a large PUBLISH's first byte to its last (at least
    # chunking.DOWNLINK_SAMPLE_BYTES): a sample of the downlink's rate. 0: not timed.
    arrival: float = 0.0
    # Not a message but a notice from the transport itself (no topic, nothing published).
    notice: Notice | None = None
    about: str = ""  # ARRIVING: the topic of the message still arriving

    @classmethod
    def of_notice(cls, notice: Notice, about: str = "") -> Message:
        return cls("", b"", notice=notice, about=about)


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
