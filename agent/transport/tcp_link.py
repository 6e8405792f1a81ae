"""What the MQTT transport asks of its TCP connection beyond paho: is the path to the broker
dead, and how to close without losing the last packets.

A node cut off the network (a Wi-Fi access point or a switch that reboots) keeps its TCP
connection: nothing tells either end, and the broker's keepalive gives up only after 1.5x the
keepalive. After the heal the connection resumes at TCP's next retransmission, which backs off
exponentially: a 10 s cut was noticed ~4 s after the heal. ``unacked_for`` reads the kernel's
TCP_INFO: bytes of ours wait in the socket and no ACK came for that long. No ACK at all for seconds
is a dead path, not a slow one (a slow or full peer still ACKs, with a small window).

Closing a socket that still holds unread bytes sends a TCP reset instead of a FIN, and the peer
drops what it had not read yet: the broker lost our DISCONNECT (it was sending us the fleet's
frames up to the end) and published our Will over the clean exit's status. ``close_gently``
half-closes first and reads on until the broker closes its side.
"""

from __future__ import annotations

import contextlib
import fcntl
import select
import socket
import struct
import termios
import time
from typing import Any

# struct tcp_info (linux/tcp.h): eight one-byte fields, then u32s: rto, ato, snd_mss, rcv_mss,
# unacked (offset 24), sacked, lost, retrans, fackets, last_data_sent, last_ack_sent,
# last_data_recv, last_ack_recv (offset 56, ms). Stable since Linux 2.6.
_TCP_INFO_BYTES = 104
_UNACKED_AT = 24
_LAST_ACK_RECV_AT = 56


def unacked_for(sock: Any) -> float | None:
    """Seconds since the peer last ACKed anything while bytes of ours wait in the socket (sent
    and unacknowledged, or not sent yet: a packet filter that drops our output keeps them
    unsent); None when nothing waits, or the kernel does not say (not Linux, not TCP)."""
    option = getattr(socket, "TCP_INFO", None)
    if option is None:
        return None
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, option, _TCP_INFO_BYTES)
    except (OSError, AttributeError, ValueError, TypeError):
        return None
    if not isinstance(raw, bytes) or len(raw) < _LAST_ACK_RECV_AT + 4:
        return None
    (unacked,) = struct.unpack_from("I", raw, _UNACKED_AT)
    (last_ack_ms,) = struct.unpack_from("I", raw, _LAST_ACK_RECV_AT)
    return last_ack_ms / 1000.0 if unacked or queued_in_socket(sock) else None


def queued_in_socket(sock: Any) -> int:
    """Bytes in the socket's send queue (SIOCOUTQ), 0 when the kernel does not say."""
    try:
        raw = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    except (OSError, ValueError, AttributeError, TypeError):
        return 0
    return int(struct.unpack("i", raw)[0])


def close_gently(sock: Any, seconds: float) -> None:
    """Send what is written and a FIN, then read (and drop) what the peer still sends until it
    closes its side, at most ``seconds``; the caller closes the socket afterwards."""
    with contextlib.suppress(OSError, ValueError):
        sock.shutdown(socket.SHUT_WR)
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            readable, _, _ = select.select([sock], [], [], left)
            if not readable or not sock.recv(1 << 16):
                return
        except BlockingIOError:
            continue
        except (OSError, ValueError):
            return
