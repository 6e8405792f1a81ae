"""agent.transport.tcp_link: a dead path told from the kernel's TCP_INFO, and a close that
the peer sees as a FIN, not a reset (loopback sockets, no broker)."""

from __future__ import annotations

import socket
import struct
import threading

import pytest

from agent.transport.tcp_link import close_gently, unacked_for


class _InfoSocket:
    def __init__(self, raw: bytes | Exception, real: socket.socket | None = None) -> None:
        self.raw, self.real = raw, real

    def fileno(self) -> int:
        if self.real is None:
            raise OSError("no descriptor")
        return self.real.fileno()

    def getsockopt(self, level: int, option: int, size: int) -> bytes:
        if isinstance(self.raw, Exception):
            raise self.raw
        return self.raw


def tcp_info(unacked: int, last_ack_recv_ms: int) -> bytes:
    raw = bytearray(104)
    struct.pack_into("I", raw, 24, unacked)
    struct.pack_into("I", raw, 56, last_ack_recv_ms)
    return bytes(raw)


def test_unacked_for_says_how_long_our_bytes_wait_for_an_ack() -> None:
    assert unacked_for(_InfoSocket(tcp_info(3, 4200))) == pytest.approx(4.2)
    assert unacked_for(_InfoSocket(tcp_info(0, 60_000))) is None  # nothing waits: idle, not dead
    assert unacked_for(_InfoSocket(b"\0" * 20)) is None
    assert unacked_for(_InfoSocket(OSError("not a TCP socket"))) is None


def test_bytes_never_sent_count_as_waiting_too() -> None:
    """A packet filter dropping our output (the simulator's cut) keeps what we write unsent:
    nothing is "unacked", but the send queue holds it, and no ACK comes."""
    client, peer = loopback_pair()
    with client, peer:
        client.setblocking(False)
        try:
            while True:
                client.send(b"x" * 65536)  # the peer reads nothing: the send queue fills
        except BlockingIOError:
            pass
        assert unacked_for(_InfoSocket(tcp_info(0, 5000), real=client)) == pytest.approx(5.0)
        assert unacked_for(_InfoSocket(tcp_info(0, 5000), real=peer)) is None  # its queue is empty


def loopback_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
    return client, peer


def test_a_healthy_loopback_connection_has_nothing_waiting_for_an_ack() -> None:
    client, peer = loopback_pair()
    with client, peer:
        client.sendall(b"x" * 1000)
        assert peer.recv(1000)
        waited = unacked_for(client)
        assert waited is None or waited < 1.0


def read_to_the_end(sock: socket.socket, seen: list[object]) -> None:
    """Read ``sock`` until it ends; append its bytes and how it ended ("eof" or "reset")."""
    data = b""
    try:
        while chunk := sock.recv(1 << 16):
            data += chunk
        seen += [data, "eof"]
    except ConnectionResetError:
        seen += [data, "reset"]
    finally:
        sock.close()


@pytest.mark.parametrize("gently", [True, False])
def test_closing_with_unread_bytes_resets_unless_closed_gently(gently: bool) -> None:
    """The broker sends us frames up to the end; our last packet (the DISCONNECT) goes out,
    then the socket closes with those frames unread: a reset, unless closed gently."""
    client, peer = loopback_pair()
    peer.sendall(b"f" * 256 * 1024)  # unread by the client
    seen: list[object] = []
    reader = threading.Thread(target=read_to_the_end, args=(peer, seen))
    client.sendall(b"bye")
    reader.start()
    if gently:
        close_gently(client, 5.0)
    client.close()
    reader.join(10.0)
    assert seen[-1] == ("eof" if gently else "reset"), seen[-1]
    if gently:
        assert seen[0] == b"bye"
