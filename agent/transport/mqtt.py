"""The Transport over MQTT (paho-mqtt 2.x, callback API version 2), QoS 0 only.

Threads: by default paho's network loop runs in its own thread (``loop_start``). Its callbacks
do nothing but bookkeeping: ``on_message`` puts a ``Message`` into a bounded queue (a full queue
drops and counts, it never blocks paho), ``on_connect`` (re)subscribes and republishes the birth
message, so that a reconnect after a broker restart restores everything by itself. The runtime
thread publishes (paced by a token bucket) and drains the queue with ``receive``.

``threaded=False`` (what agents use): no paho thread. ``receive`` drives paho's loop itself
(select on the socket, read every packet that is there, keepalive, reconnect with the same
backoff) and ``publish`` writes straight to the socket: no socketpair wake-up of another thread
and no GIL hand-over per message. The caller must then call ``receive`` regularly (the
runtime does, every 50 ms at most) and from one thread only.

Every paho, ssl or socket error is turned into ``TransportError`` right where it enters.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, cast
from urllib.parse import urlsplit

import numpy as np
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion

from agent.protocol.chunking import DOWNLINK_SAMPLE_BYTES
from agent.transport.base import Message, Notice, TransportError, Will
from agent.transport.reconnects import Reconnects
from agent.transport.tcp_link import close_gently, queued_in_socket, unacked_for

ProtocolName = Literal["3.1.1", "5"]
_PROTOCOLS: dict[str, MQTTProtocolVersion] = {
    "3.1.1": MQTTProtocolVersion.MQTTv311,
    "5": MQTTProtocolVersion.MQTTv5,
}
_DEFAULT_PORTS = {"mqtt": 1883, "mqtts": 8883}
# Failed reconnects double their delay up to RECONNECT_MAX_S only: a node cut off the network
# (a Wi-Fi access point that reboots) is back within about a second of the heal, where a 5 s
# cap kept a healed group away for ~4 s more. A broker that is down costs an attempt a second.
RECONNECT_MAX_S = 1.0
# A reconnect waits this long for TCP (and TLS) instead of paho's 5 s: on a cut network the SYN
# is dropped and the kernel resends it only after 1 s, then 3 s, so a heal during an attempt
# waited for the next resend or the attempt's end. 2 s: a LAN or Wi-Fi handshake takes far less.
RECONNECT_TIMEOUT_S = 2.0
# Inline mode: a connection whose bytes got no TCP ACK for this long is dropped and opened anew
# (agent/transport/tcp_link.py): a node cut off keeps it, and after the heal it resumed only at
# TCP's next backed-off retransmission (~4 s); fresh attempts reach the broker within ~1 s.
STALLED_AFTER_S = 3.0
PROBE_QUIET_S = 1.0  # ... and after this long with nothing from the broker, a PINGREQ makes bytes wait
CLOSE_DRAIN_S = 0.5  # our clean close waits this long at most for the broker to close its side
# Inline mode, on a slow uplink (issue 19): once a send backlog has lasted (``Notice.SENDING``), the
# kernel's send queue is kept small (SEND_BUFFER; Linux doubles it; on a fast link the kernel
# sizes it, and a 1 MB frame goes out in one write), so what the link cannot take yet waits in
# paho's queue, where a small
# message (an ACK, a PROGRESS, a refutation: at most URGENT_BYTES) overtakes queued bulk data
# instead of waiting seconds behind it. A publish waits at most PUBLISH_FLUSH_S for a full
# socket then (loopback takes a MB in about a ms): the rest goes out from ``receive``, which
# the runtime calls at least every 50 ms.
SEND_BUFFER = 64 * 1024
PUBLISH_FLUSH_S = 0.01
URGENT_BYTES = 1024


# paho builds a received packet by ``recv(remaining)`` calls appended to a bytearray (a 1 MB
# frame arrives in ~6 pieces: six 1 MB allocations and the appends' copies), then slices the
# topic and payload out with two more copies; every write slices what is left of the outgoing
# packet (another copy). These three methods do the same with one buffer per packet, filled
# by ``recv_into``, a payload copied once, and writes from a memoryview: the packets on the
# wire and what the callbacks get are paho's own. They touch paho internals that 2.1 and 2.2
# share (``_in_packet``, ``_packet_handle``, ``_handle_on_message``); anything they do not
# cover (MQTT 5, QoS > 0, a malformed header) goes through paho's own code.
_BIG_WRITE = 4096  # bytes: smaller outgoing packets are sent as paho queues them
# A PUBLISH still arriving this long after its first byte is reported (``Notice.ARRIVING``), then at
# most every ARRIVING_EVERY s until it is whole: the downlink is slow, and what else is sent
# to us queues behind it (issue 19). A 1 MB frame takes ~2 ms on loopback, 0.5 s at 2 MB/s.
ARRIVING_AFTER = 0.03
ARRIVING_EVERY = 0.05
# Likewise ``Notice.SENDING``: at least this many bytes published but not yet taken by the peer (the
# socket's send queue, SIOCOUTQ, and paho's) for ARRIVING_AFTER: our uplink is slow.
SENDING_BACKLOG = 64 * 1024
# Packets one select reads at most before what we publish is written and the caller runs its
# timers: read on until the socket was empty, a flood of frames on our link (each refused and
# counted) kept a root reading for seconds, its results and refutations unsent: silent to the
# fleet, evicted (issue 54).
READ_BATCH = 512


class _Client(paho.Client):
    """``paho.Client`` with a read path of one buffer per packet (see above), which also
    reports a large PUBLISH that keeps arriving piece by piece to ``on_arriving(topic)``."""

    on_arriving: Callable[[str], None] | None = None
    arrival = 0.0  # seconds the PUBLISH being handed over took to arrive (0: small)
    _arriving_since = 0.0  # monotonic: the current packet's first byte
    _arriving_told = 0.0  # monotonic: its last report (0: none yet)
    _repinged_at = 0.0  # paho.time_func(): our last PINGREQ sent while one was pending

    def _recv_byte(self) -> bytes | MQTTErrorCode:
        """One byte of the packet's header, or why there is none (paho's error codes)."""
        try:
            byte = self._sock_recv(1)
        except BlockingIOError:
            return MQTTErrorCode.MQTT_ERR_AGAIN
        except OSError:
            return MQTTErrorCode.MQTT_ERR_CONN_LOST
        return byte if byte else MQTTErrorCode.MQTT_ERR_CONN_LOST

    def _read_header(self) -> MQTTErrorCode | None:
        """The packet's command and remaining length, and its buffer; None once both are in."""
        packet = self._in_packet
        if packet["command"] == 0:
            command = self._recv_byte()
            if isinstance(command, MQTTErrorCode):
                return command
            packet["command"] = command[0]
        if packet["have_remaining"] == 0:
            while True:  # the remaining length: 1-4 bytes, 7 bits each, low first
                byte = self._recv_byte()
                if isinstance(byte, MQTTErrorCode):
                    return byte
                packet["remaining_count"].append(byte[0])
                if len(packet["remaining_count"]) > 4:
                    return MQTTErrorCode.MQTT_ERR_PROTOCOL
                packet["remaining_length"] += (byte[0] & 127) * packet["remaining_mult"]
                packet["remaining_mult"] *= 128
                if byte[0] & 128 == 0:
                    break
            packet["have_remaining"] = 1
            packet["to_process"] = packet["remaining_length"]
            self._arriving_since, self._arriving_told = time.monotonic(), 0.0
            if packet["command"] & 0xF0 == paho.PUBLISH and packet["remaining_length"] > _BIG_WRITE:
                # Not zero-filled (bytearray(n) is): recv_into writes every byte before use.
                packet["packet"] = np.empty(packet["remaining_length"], np.uint8)  # type: ignore[typeddict-item]
            else:
                packet["packet"] = bytearray(packet["remaining_length"])
        return None

    def _packet_read(self) -> MQTTErrorCode:
        packet = self._in_packet
        header = self._read_header()
        if header is not None:
            return header
        buffer = memoryview(packet["packet"])
        pieces = 100  # as paho: a huge packet does not keep the loop in here
        try:
            while packet["to_process"] > 0:
                try:
                    got = self._sock_recv_into(buffer[packet["remaining_length"] - packet["to_process"]:])
                except BlockingIOError:
                    return MQTTErrorCode.MQTT_ERR_AGAIN
                except OSError:
                    return MQTTErrorCode.MQTT_ERR_CONN_LOST
                if got == 0:
                    return MQTTErrorCode.MQTT_ERR_CONN_LOST
                packet["to_process"] -= got
                if packet["to_process"] > 0 and self.on_arriving is not None:
                    self._tell_arriving(packet["packet"], packet["remaining_length"] - packet["to_process"])
                with self._msgtime_mutex:
                    self._last_bytes_received = paho.time_func()
                pieces -= 1
                if pieces == 0:
                    return MQTTErrorCode.MQTT_ERR_AGAIN
        finally:
            buffer.release()
        packet["pos"] = 0
        big = packet["command"] & 0xF0 == paho.PUBLISH and packet["remaining_length"] >= DOWNLINK_SAMPLE_BYTES
        # For on_message, called from _packet_handle: at least a nanosecond, 0 means untimed.
        self.arrival = max(time.monotonic() - self._arriving_since, 1e-9) if big else 0.0
        try:
            rc = self._packet_handle()
        except paho.MalformedPacket:
            rc = MQTTErrorCode.MQTT_ERR_PROTOCOL
        self._in_packet = {"command": 0, "have_remaining": 0, "remaining_count": [], "remaining_mult": 1,
                           "remaining_length": 0, "packet": bytearray(), "to_process": 0, "pos": 0}
        with self._msgtime_mutex:
            self._last_bytes_received = paho.time_func()
        return rc

    def probe_if_quiet(self, quiet_for: float) -> None:
        """A PINGREQ when nothing arrived for ``quiet_for`` s and none is pending: then bytes
        of ours wait for an ACK, and a dead path shows (tcp_link.unacked_for) even when we had
        nothing else to send. paho's own ping comes only after the whole keepalive."""
        now = paho.time_func()
        with self._msgtime_mutex:
            quiet = now - self._last_bytes_received
        if quiet < quiet_for or not self.is_connected():
            return
        if not self._ping_t:
            self._send_pingreq()
        elif now - max(self._ping_t, self._repinged_at) >= quiet_for:
            # A PINGREQ the broker's TCP ACKed before a cut, whose PINGRESP the cut then took,
            # stays pending with nothing of ours unACKed: a node with nothing else to send
            # noticed the cut only when it had (8-12 s in, 2 s after the heal). Another one,
            # with paho's ping time kept: its keepalive still judges a broker that is hung.
            self._repinged_at = now
            self._send_simple_command(paho.PINGREQ)

    def _tell_arriving(self, data: Any, got: int) -> None:
        """Report the PUBLISH being read when it has been arriving long enough (see
        ARRIVING_AFTER), and its topic has arrived."""
        now = time.monotonic()
        if (self._in_packet["command"] & 0xF0 != paho.PUBLISH or now - self._arriving_since < ARRIVING_AFTER
                or now - self._arriving_told < ARRIVING_EVERY or got < 2 or self.on_arriving is None):
            return
        length = int(data[0]) << 8 | int(data[1])
        if 2 + length > got:
            return
        self._arriving_told = now
        with contextlib.suppress(UnicodeDecodeError):
            self.on_arriving(bytes(data[2 : 2 + length]).decode())

    def _sock_recv_into(self, buffer: memoryview) -> int:
        """``_sock_recv``, into ``buffer``: same errors."""
        if self._sock is None:
            raise ConnectionError("self._sock is None")
        try:
            return int(cast(Any, self._sock).recv_into(buffer))
        except ssl.SSLWantReadError as err:
            raise BlockingIOError() from err
        except ssl.SSLWantWriteError as err:
            self._call_socket_register_write()
            raise BlockingIOError() from err
        except AttributeError as err:
            raise ConnectionError() from err

    def _handle_publish(self) -> MQTTErrorCode:
        header, data = self._in_packet["command"], self._in_packet["packet"]
        view = memoryview(data)
        length = int.from_bytes(view[:2], "big") if len(view) >= 2 else 0
        if header & 0x06 or self._protocol == MQTTProtocolVersion.MQTTv5 or length == 0 \
                or 2 + length > len(view):
            view.release()
            self._in_packet["packet"] = bytearray(data)  # what paho's own code expects
            return super()._handle_publish()  # MQTT 5, QoS > 0, or malformed: paho says why
        message = paho.MQTTMessage(mid=0, topic=bytes(view[2 : 2 + length]))
        message.dup = bool(header & 0x08)
        message.qos = 0
        message.retain = bool(header & 0x01)
        message.payload = bytes(view[2 + length :])
        view.release()
        message.timestamp = paho.time_func()
        self._handle_on_message(message)
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    def publish_now(self, topic: str, payload: bytes) -> bool:
        """A QoS 0 PUBLISH (MQTT 3.1.1, not retained) written at once with one ``sendmsg`` of
        its header and ``payload``: no packet assembled (paho copies the payload into one),
        none of paho's per-publish bookkeeping, which QoS 0 does not need. What the socket
        does not take is queued for paho's writer, as paho does. False, with nothing sent,
        where this does not apply (TLS, MQTT 5, not connected, paho still has packets to
        write, which must go first): then publish through paho. Callers with paho's network
        thread running must not use it (two threads would write to one socket)."""
        sock = self._sock
        if (type(sock) is not socket.socket or self._protocol == MQTTProtocolVersion.MQTTv5
                or self._out_packet or not self.is_connected() or not topic or "+" in topic
                or "#" in topic):
            return False
        name = topic.encode()
        header = bytearray((paho.PUBLISH,))
        self._pack_remaining_length(header, 2 + len(name) + len(payload))
        header += len(name).to_bytes(2, "big")
        header += name
        try:
            sent = sock.sendmsg((header, payload))
        except BlockingIOError:
            sent = 0
        except OSError:
            return False  # paho's own publish meets the same error and handles the connection
        if sent < len(header) + len(payload):
            rest = (bytes(header[sent:]) + payload if sent < len(header)
                    else memoryview(payload)[sent - len(header):])
            # Command 0: paho's writer sends it and runs no PUBLISH or DISCONNECT bookkeeping.
            self._out_packet.append({"command": 0, "mid": 0, "qos": 0, "pos": 0,
                                     "to_process": len(rest), "packet": rest,  # type: ignore[typeddict-item]
                                     "info": None})
        with self._msgtime_mutex:
            self._last_msg_out = paho.time_func()
        return True

    def publish_urgent(self, topic: str, payload: bytes, retain: bool = False) -> bool:
        """A small QoS 0 PUBLISH (MQTT 3.1.1) queued ahead of every packet not yet begun but
        behind the urgent ones queued before it (their order kept). False, with nothing
        queued, when nothing waits to be overtaken, or for MQTT 5 or no connection: then
        publish as usual. Inline mode only (one thread writes the socket)."""
        out = self._out_packet
        if (not out or self._protocol == MQTTProtocolVersion.MQTTv5 or not self.is_connected()
                or not topic or "+" in topic or "#" in topic):
            return False
        name = topic.encode()
        packet = bytearray((paho.PUBLISH | (0x01 if retain else 0),))
        self._pack_remaining_length(packet, 2 + len(name) + len(payload))
        packet += len(name).to_bytes(2, "big") + name + payload
        # The packet being written goes on first: begun, or the rest of one that publish_now
        # began (command 0, not urgent). Over TLS a write the socket could not take whole
        # (WANT_WRITE) leaves ``pos`` at 0 with part of it already in TLS records, and must be
        # retried with the same bytes: the head counts as begun there.
        head = out[0]
        begun = head["pos"] > 0 or isinstance(self._sock, ssl.SSLSocket)
        i = 1 if begun or (head["command"] == 0 and not head.get("urgent")) else 0
        while i < len(out) and out[i].get("urgent"):
            i += 1
        out.insert(i, {"command": 0, "mid": 0, "qos": 0, "pos": 0, "to_process": len(packet),  # type: ignore[typeddict-unknown-key]
                       "packet": packet, "info": None, "urgent": True})
        return True

    def _packet_queue(self, command: int, packet: bytes | bytearray, mid: int, qos: int,
                      info: paho.MQTTMessageInfo | None = None) -> MQTTErrorCode:
        # paho sends ``packet[pos:]``: of a memoryview that is a view, not a copy.
        if len(packet) > _BIG_WRITE:
            packet = memoryview(packet)  # type: ignore[assignment]
        return super()._packet_queue(command, packet, mid, qos, info)


@dataclass(frozen=True)
class BrokerAddress:
    host: str
    port: int
    tls: bool

    @property
    def url(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"


def parse_broker_url(url: str) -> BrokerAddress:
    """``mqtt://host[:1883]`` or ``mqtts://host[:8883]`` -> BrokerAddress; ValueError otherwise."""
    hint = "use mqtt://HOST:PORT (plain) or mqtts://HOST:PORT (TLS), e.g. mqtt://127.0.0.1:1883"
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"broker URL {url!r} is not valid ({exc}): {hint}") from None
    if parts.scheme not in _DEFAULT_PORTS:
        raise ValueError(f"broker URL {url!r} has scheme {parts.scheme!r}: {hint}")
    if not parts.hostname:
        raise ValueError(f"broker URL {url!r} names no host: {hint}")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ValueError(
            f"broker URL {url!r} has a path, query or user part; credentials go in their own "
            f"options: {hint}"
        )
    return BrokerAddress(
        parts.hostname, port if port is not None else _DEFAULT_PORTS[parts.scheme],
        parts.scheme == "mqtts",
    )


class TokenBucket:
    """Byte-rate pacing. ``reserve`` returns how long the caller must wait before sending.

    The bucket may go into debt so that a message larger than ``burst`` still passes (after
    the wait its size costs at ``rate``). Pure: the caller passes ``now``.
    """

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError("token bucket rate and burst must be positive")
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._last = now

    def reserve(self, nbytes: int, now: float) -> float:
        self._tokens = min(self.burst, self._tokens + max(0.0, now - self._last) * self.rate)
        self._last = now
        self._tokens -= nbytes
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate


@dataclass(frozen=True)
class TransportStats:
    """Counters for telemetry (payload bytes, not MQTT framing)."""

    bytes_sent: int
    bytes_received: int
    messages_sent: int
    messages_received: int
    dropped: int
    unsent: int
    connects: int
    paced_seconds: float


def unsent_bytes(client: paho.Client) -> int:
    """Bytes published but not yet taken by the broker's side of the connection: the socket's
    send queue (SIOCOUTQ, where the kernel has it) and what paho still holds."""
    sock: Any = client.socket()
    if sock is None:
        return 0
    return sum(int(p["to_process"]) for p in list(client._out_packet)) + queued_in_socket(sock)


class MqttTransport:
    """``Transport`` over one MQTT connection. See the module docstring for the threading."""

    def __init__(
        self,
        client_id: str,
        url: str,
        *,
        username: str | None = None,
        password: str | None = None,
        tls_ca: str | None = None,
        tls_insecure: bool = False,
        protocol: ProtocolName = "3.1.1",
        queue_size: int = 10000,
        queue_bytes: int = 32 << 20,
        max_publish_bytes_per_s: float | None = None,
        publish_burst_bytes: int = 1 << 20,
        keepalive: int = 10,
        connect_timeout: float = 10.0,
        reconnect_min_s: float = 0.2,
        reconnect_max_s: float = RECONNECT_MAX_S,
        reconnect_timeout_s: float = RECONNECT_TIMEOUT_S,
        threaded: bool = True,
    ) -> None:
        if protocol not in _PROTOCOLS:
            raise ValueError(f"MQTT protocol {protocol!r} is not supported: use '3.1.1' or '5'")
        if queue_size < 1:
            raise ValueError("queue_size must be at least 1")
        self.address = parse_broker_url(url)
        self.client_id = client_id
        self._protocol = _PROTOCOLS[protocol]
        self._keepalive = keepalive
        self._connect_timeout = connect_timeout
        # One lock for the whole hand-over (queue.Queue takes three per message, and the
        # runtime drains hundreds of frames a round: ~2x less overhead in the profile).
        self._queue: deque[Message] = deque()
        self._queue_size = queue_size
        # Bytes bound too: 10,000 queued 64 KB frames would blow a Raspberry Pi's memory.
        self._queue_bytes_max = queue_bytes
        self._queued_bytes = 0
        self._arrived = threading.Condition(threading.Lock())
        self._subscriptions: list[str] = []
        self._birth: Message | None = None
        self._connected = threading.Event()
        self._first_connack = threading.Event()
        self._first_suback = threading.Event()
        self._subscribe_mid: int | None = None
        self._refusal: str | None = None
        # Apart from the CONNACK's: in threaded mode the SUBACK can arrive before the connect
        # check runs, which then reported a refused subscription as a refused client.
        self._sub_refusal: str | None = None
        self._init_sending(max_publish_bytes_per_s, publish_burst_bytes, threaded)
        self._reconnects = Reconnects(reconnect_min_s, reconnect_max_s, reconnect_timeout_s)
        self._client = self._make_client(username, password, tls_ca, tls_insecure,
                                         reconnect_min_s, reconnect_max_s)

    # -- set-up ---------------------------------------------------------------------------

    def _init_sending(self, max_publish_bytes_per_s: float | None, publish_burst_bytes: int,
                      threaded: bool) -> None:
        """Publishing, pacing and counters."""
        self._closed = False
        self._started = False
        self._publish_lock = threading.Lock()
        self._bucket = (
            TokenBucket(max_publish_bytes_per_s, publish_burst_bytes, time.monotonic())
            if max_publish_bytes_per_s else None
        )
        self._counts = {"bytes_sent": 0, "bytes_received": 0, "messages_sent": 0,
                        "messages_received": 0, "dropped": 0, "unsent": 0, "connects": 0}
        self._paced_seconds = 0.0
        self._threaded = threaded
        self._send_blocked = False  # inline mode: the socket took nothing in the last flush
        self._connected_at = 0.0
        self._backlog_since: float | None = None  # monotonic: SENDING_BACKLOG unsent since then
        self._small_send_buffer = False  # SEND_BUFFER set on the current socket
        self._backlog_told = 0.0

    def _make_client(
        self, username: str | None, password: str | None, tls_ca: str | None,
        tls_insecure: bool, reconnect_min_s: float, reconnect_max_s: float,
    ) -> _Client:
        client = _Client(
            callback_api_version=CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            protocol=self._protocol,
            clean_session=True if self._protocol != MQTTProtocolVersion.MQTTv5 else None,
        )
        if username is not None:
            client.username_pw_set(username, password)
        if self.address.tls:
            try:
                client.tls_set(ca_certs=tls_ca, cert_reqs=ssl.CERT_REQUIRED)
                client.tls_insecure_set(tls_insecure)
            except (OSError, ValueError, ssl.SSLError) as exc:
                raise TransportError(f"cannot set up TLS with CA file {tls_ca!r}: {exc}") from None
        elif tls_ca is not None:
            raise TransportError(f"a TLS CA file was given but {self.address.url} is not mqtts://")
        # paho takes ints here but computes with whatever it gets; floats give fast retries.
        client.reconnect_delay_set(reconnect_min_s, reconnect_max_s)  # type: ignore[arg-type]
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_subscribe = self._on_subscribe
        client.on_socket_open = self._on_socket_open
        client.on_socket_close = self._on_socket_close
        client.on_arriving = self._on_arriving
        return client

    def connect(
        self, subscriptions: list[str], will: Will | None = None, birth: Message | None = None
    ) -> None:
        """Connect, wait for CONNACK, subscribe to ``subscriptions`` (again on every reconnect).

        ``birth`` (typically the retained ``online`` status) is published after every
        successful (re)connect: a broker that lost its retained messages or published our
        Will during an outage learns again that we are alive.
        """
        if self._started:
            raise TransportError("connect() was already called on this transport")
        self._started = True
        self._subscriptions = list(subscriptions)
        self._birth = birth
        try:
            if will is not None:
                self._client.will_set(will.topic, will.payload, qos=0, retain=will.retain)
            self._client.connect(self.address.host, self.address.port, self._keepalive)
        except (OSError, ValueError) as exc:
            raise TransportError(f"cannot reach the MQTT broker at {self.address.url}: {exc}. "
                                 "Is it running, and are host, port and TLS setting right?"
                                 ) from None
        if self._threaded:
            self._client.loop_start()
        else:
            self._drive_until(self._first_connack, self._connect_timeout)
        if not self._first_connack.wait(self._connect_timeout if self._threaded else 0.0):
            self._shutdown()
            raise TransportError(f"no answer (CONNACK) from the MQTT broker at {self.address.url} "
                                 f"within {self._connect_timeout:.0f} s")
        if self._refusal is not None:
            self._shutdown()
            raise TransportError(f"the MQTT broker at {self.address.url} refused client "
                                 f"{self.client_id!r}: {self._refusal}. Check username/password "
                                 "(credentials.json of the broker) and the ACL.")
        self._await_first_suback()
        if not self._threaded:
            self._flush_inline(self._connect_timeout)  # the subscription and birth from on_connect

    def _await_first_suback(self) -> None:
        """Return once the broker confirmed our subscriptions, so nothing sent later is missed."""
        if not self._subscriptions:
            return
        if not self._threaded:
            self._drive_until(self._first_suback, self._connect_timeout)
        if not self._first_suback.wait(self._connect_timeout if self._threaded else 0.0):
            self._shutdown()
            raise TransportError(f"the MQTT broker at {self.address.url} did not confirm the "
                                 f"subscriptions within {self._connect_timeout:.0f} s")
        if self._sub_refusal is not None:
            self._shutdown()
            raise TransportError(f"the MQTT broker at {self.address.url} refused {self._sub_refusal}"
                                 f" for client {self.client_id!r}: the ACL does not allow it")

    # -- paho callbacks (paho's thread: bookkeeping only) ---------------------------------

    def _on_socket_open(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        # paho leaves Nagle on: a small frame (an ACK) would wait ~40 ms for delayed ACKs.
        with contextlib.suppress(OSError, AttributeError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._small_send_buffer = False  # a new socket: the kernel sizes its buffer

    def _on_socket_close(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        """Our clean exit: the DISCONNECT must reach the broker, or it publishes our Will over
        the status we just published (see tcp_link.close_gently)."""
        if self._closed:
            close_gently(sock, CLOSE_DRAIN_S)

    def _on_connect(self, client: paho.Client, userdata: Any, flags: Any, reason_code: Any,
                    properties: Any) -> None:
        if reason_code.is_failure:
            if not self._first_connack.is_set():
                self._refusal = str(reason_code)
                self._first_connack.set()
            return
        self._counts["connects"] += 1
        self._connected_at = time.monotonic()
        self._send_blocked = False
        self._reconnects.connected(client.socket())
        if self._counts["connects"] > 1:
            with self._arrived:  # tell the runtime: retained state on the broker may be gone
                self._queue.append(Message.of_notice(Notice.RECONNECTED))
                self._arrived.notify()
        if self._subscriptions:
            _, self._subscribe_mid = client.subscribe([(t, 0) for t in self._subscriptions])
        if self._birth is not None:
            client.publish(self._birth.topic, self._birth.payload, qos=0,
                           retain=self._birth.retained)
        self._connected.set()
        self._first_connack.set()

    def _on_subscribe(self, client: paho.Client, userdata: Any, mid: int, reason_codes: Any,
                      properties: Any) -> None:
        if self._first_suback.is_set() or mid != self._subscribe_mid:
            return
        refused = [t for t, rc in zip(self._subscriptions, reason_codes, strict=False)
                   if rc.is_failure]
        if refused:
            self._sub_refusal = f"the subscription to {', '.join(refused)}"
        self._first_suback.set()

    def _on_disconnect(self, client: paho.Client, userdata: Any, flags: Any, reason_code: Any,
                       properties: Any) -> None:
        if self._connected.is_set():
            with self._arrived:  # the runtime stops starting rounds it could not take part in
                self._queue.append(Message.of_notice(Notice.DISCONNECTED))
                self._arrived.notify()
            self._reconnects.back_off(client, time.monotonic() - self._connected_at)
        self._connected.clear()
        self._reconnects.bound(client)
        if not self._first_connack.is_set():
            # e.g. plain MQTT sent to a TLS port: fail now instead of after connect_timeout.
            self._refusal = (f"the connection was closed before CONNACK ({reason_code}); "
                             "is it the right port, TLS setting and protocol version?")
            self._first_connack.set()

    def _on_message(self, client: paho.Client, userdata: Any, msg: paho.MQTTMessage) -> None:
        payload = bytes(msg.payload)
        self._counts["messages_received"] += 1
        self._counts["bytes_received"] += len(payload)
        with self._arrived:
            if (self._queued_bytes + len(payload) > self._queue_bytes_max
                    or len(self._queue) >= self._queue_size):
                self._counts["dropped"] += 1
                return
            arrival = client.arrival if isinstance(client, _Client) else 0.0
            self._queue.append(Message(msg.topic, payload, bool(msg.retain), arrival))
            self._queued_bytes += len(payload)
            self._arrived.notify()

    def _on_arriving(self, topic: str) -> None:
        with self._arrived:
            if len(self._queue) < self._queue_size:
                self._queue.append(Message.of_notice(Notice.ARRIVING, topic))
                self._arrived.notify()

    # -- Transport ------------------------------------------------------------------------

    def publish(self, topic: str, payload: bytes, retain: bool = False, reliable: bool = False) -> None:
        """QoS 0: while reconnecting the message is lost and counted in ``stats().unsent``.
        ``reliable``: QoS 1, which paho keeps while the connection is down and sends after
        the reconnect (a dynsec ACL change, for one, disconnects clients for ~0.2 s)."""
        if self._closed or not self._started:
            raise TransportError(f"publish on {topic!r}: the transport is "
                                 f"{'closed' if self._closed else 'not connected yet'}")
        self._pace(len(payload))
        if (not self._threaded and not reliable and len(payload) <= URGENT_BYTES
                and self._client.publish_urgent(topic, payload, retain)):
            sent = True  # ahead of the bulk still queued (see URGENT_BYTES)
        elif not self._threaded and not reliable and not retain and self._client.publish_now(topic, payload):
            sent = True  # one sendmsg, no packet built (see _Client.publish_now)
        else:
            try:
                info = self._client.publish(topic, payload, qos=1 if reliable else 0, retain=retain)
            except (ValueError, TypeError, OSError) as exc:
                raise TransportError(f"cannot publish on {topic!r}: {exc}") from None
            sent = info.rc == MQTTErrorCode.MQTT_ERR_SUCCESS
        if not self._threaded:
            self._check_backlog()
        if not self._threaded and self._client.want_write() and not self._send_blocked:
            # The socket took only part of it: write what it takes readily, the rest from
            # ``receive`` (see SEND_BUFFER). Not while it takes nothing (a cut path: each of a
            # round's hundred small publishes waited, and the transport went unread for 9 s).
            self._write_for(PUBLISH_FLUSH_S)
        if sent or reliable:
            with self._publish_lock:
                self._counts["messages_sent"] += 1
                self._counts["bytes_sent"] += len(payload)
        else:
            with self._publish_lock:
                self._counts["unsent"] += 1

    def _pace(self, nbytes: int) -> None:
        if self._bucket is None:
            return
        with self._publish_lock:
            delay = self._bucket.reserve(nbytes, time.monotonic())
            self._paced_seconds += delay
        if delay > 0:
            time.sleep(delay)

    def receive(self, timeout: float) -> list[Message]:
        inline = not self._threaded and self._started and not self._closed
        if inline:
            # ``_drive`` has waited (select) up to ``timeout`` already. Nobody else fills the
            # queue in this mode: waiting on it again would be a deaf sleep of another
            # ``timeout`` (a frame arriving meanwhile would sit unread on the socket, a timer
            # would fire late).
            self._drive(timeout)
        with self._arrived:
            if not inline and not self._queue and timeout > 0:
                self._arrived.wait_for(lambda: bool(self._queue), timeout)
            out = list(self._queue)
            self._queue.clear()
            self._queued_bytes = 0
        return out

    def dropped(self) -> int:
        return self._counts["dropped"]

    def close(self) -> None:
        """Flush what was published, DISCONNECT cleanly (no Will), stop paho's thread."""
        if self._closed:
            return
        self._closed = True
        self._reconnects.close()
        if self._started:
            self._shutdown()

    def _shutdown(self) -> None:
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            self._client.disconnect()
        if self._threaded:
            with contextlib.suppress(RuntimeError):
                self._client.loop_stop()
        else:
            self._flush_inline(2.0)
        self._connected.clear()

    # -- inline mode: paho's loop driven by the caller's thread ---------------------------

    def _drive(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for the first message, then take every packet that is
        already there; keepalive and reconnects happen here too."""
        deadline = time.monotonic() + timeout
        while True:
            got = self._step(max(0.0, deadline - time.monotonic()))
            if got or self._queue or time.monotonic() >= deadline:
                return

    def _drive_until(self, event: threading.Event, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not event.is_set() and time.monotonic() < deadline:
            self._step(min(0.05, max(0.0, deadline - time.monotonic())))

    def _step(self, timeout: float) -> bool:
        """One select on the socket (at most ``timeout`` s); True when a message arrived."""
        client = self._client
        sock: Any = client.socket()
        if sock is None:
            self._reconnects.attempt(client, timeout)
            return False
        pending = getattr(sock, "pending", None)  # TLS: bytes already decrypted, not selectable
        if pending is not None and pending() > 0:
            timeout = 0.0
        try:
            readable, writable, _ = select.select([sock], [sock] if client.want_write() else [], [],
                                                  timeout)
        except (OSError, ValueError, TypeError):
            readable, writable = [], []
        before = self._counts["messages_received"]
        if readable or (pending is not None and pending() > 0):
            # paho reads ONE packet per loop_read: read on until a call brings nothing new, or
            # READ_BATCH came (then write and return: the rest waits for the next call).
            for _ in range(READ_BATCH):
                count = self._counts["messages_received"]
                if client.loop_read() != MQTTErrorCode.MQTT_ERR_SUCCESS or client.socket() is None:
                    break
                if self._counts["messages_received"] == count:
                    break
        if writable and client.socket() is not None:
            self._send_blocked = False
            client.loop_write()
        if client.socket() is not None:
            client.loop_misc()  # keepalive: PINGREQ, and a dead broker noticed
            self._check_backlog()
            self._drop_if_stalled()
        return self._counts["messages_received"] > before

    def _drop_if_stalled(self) -> None:
        """No ACK for STALLED_AFTER_S: end the connection here (paho then reads its end, as for
        any lost connection: DISCONNECTED, and reconnects at once)."""
        sock: Any = self._client.socket()
        if sock is None or not self._connected.is_set():
            return
        waited = unacked_for(sock)
        if waited is None:
            self._client.probe_if_quiet(PROBE_QUIET_S)
        elif waited >= STALLED_AFTER_S:
            with contextlib.suppress(OSError, ValueError):
                sock.shutdown(socket.SHUT_RDWR)
            self._reconnects.stalled()

    def backlog(self) -> int:
        return unsent_bytes(self._client)

    def _check_backlog(self) -> None:
        """Queue a ``Notice.SENDING`` when a backlog of SENDING_BACKLOG bytes has lasted
        ARRIVING_AFTER s (then at most every ARRIVING_EVERY s while it lasts)."""
        now = time.monotonic()
        if self.backlog() < SENDING_BACKLOG:
            self._backlog_since = None
            return
        if self._backlog_since is None:
            self._backlog_since = now
        if now - self._backlog_since >= ARRIVING_AFTER and now - self._backlog_told >= ARRIVING_EVERY:
            self._backlog_told = now
            sock: Any = self._client.socket()
            if not self._small_send_buffer and sock is not None:
                self._small_send_buffer = True  # a slow uplink: keep the rest in paho's queue
                with contextlib.suppress(OSError, AttributeError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
            with self._arrived:
                if len(self._queue) < self._queue_size:
                    self._queue.append(Message.of_notice(Notice.SENDING))

    def _write_for(self, seconds: float) -> None:
        """Write what paho holds for at most ``seconds`` (inline mode), reading nothing."""
        client = self._client
        deadline = time.monotonic() + seconds
        while client.want_write() and (sock := client.socket()) is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            try:
                _, writable, _ = select.select([], [sock], [], left)
            except (OSError, ValueError, TypeError):
                return
            self._send_blocked = not writable
            if writable and client.loop_write() != MQTTErrorCode.MQTT_ERR_SUCCESS:
                return

    def _flush_inline(self, timeout: float) -> None:
        """Write what is still queued in paho (a DISCONNECT, a last status) before returning."""
        deadline = time.monotonic() + timeout
        while self._client.want_write() and self._client.socket() is not None and time.monotonic() < deadline:
            self._step(0.05)

    # -- helpers for the runtime ----------------------------------------------------------

    @property
    def is_connected(self) -> bool:
        return self._connected.is_set()

    def wait_connected(self, timeout: float) -> bool:
        """True once connected (again); False after ``timeout`` seconds without."""
        return self._connected.wait(timeout)

    def stats(self) -> TransportStats:
        c = self._counts
        return TransportStats(
            bytes_sent=c["bytes_sent"], bytes_received=c["bytes_received"],
            messages_sent=c["messages_sent"], messages_received=c["messages_received"],
            dropped=c["dropped"], unsent=c["unsent"], connects=c["connects"],
            paced_seconds=self._paced_seconds,
        )

    def tcp_nodelay(self) -> bool:
        """Whether Nagle is off on the current socket (False when not connected)."""
        sock: Any = self._client.socket()
        if sock is None:
            return False
        try:
            return bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        except OSError:
            return False
