"""simulate.proxy.TcpProxy on loopback sockets (no broker): a client's clean close reaches the
server as its last bytes and a FIN, even while the server is still sending."""

from __future__ import annotations

import socket
import threading

from agent.transport.tcp_link import close_gently
from simulate.proxy import HOLD_BYTES, Shaping, TcpProxy, hold_limit
from tests.unit.transport.test_tcp_link import read_to_the_end


def _serve_one(server: socket.socket, seen: list[object]) -> None:
    """Accept, send more than the client reads, then read to the end: its last bytes, and
    whether the connection ended with a FIN or a reset."""
    conn, _ = server.accept()
    with conn:
        conn.settimeout(10.0)
        conn.setblocking(False)
        sent = 0
        while sent < 4 << 20:  # the frames the broker sends up to the end, unread
            try:
                sent += conn.send(b"f" * 65536)
            except BlockingIOError:
                break
        conn.setblocking(True)
        read_to_the_end(conn, seen)


def test_a_clean_close_through_the_proxy_reaches_the_server_as_a_fin_not_a_reset() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        seen: list[object] = []
        serving = threading.Thread(target=_serve_one, args=(server, seen))
        serving.start()
        proxy = TcpProxy("127.0.0.1", server.getsockname()[1])
        port = proxy.start()
        try:
            client = socket.create_connection(("127.0.0.1", port))
            client.sendall(b"DISCONNECT")
            close_gently(client, 5.0)
            client.close()
            serving.join(15.0)
        finally:
            proxy.stop()
    assert seen == [b"DISCONNECT", "eof"], seen[-1:]


def test_a_link_with_latency_and_a_rate_holds_its_bytes_in_flight_before_it_pushes_back() -> None:
    # 10 MB/s with 20 ms each way: 200 kB on the wire. Held to HOLD_BYTES alone, the link
    # carried HOLD_BYTES per 20 ms whatever its rate.
    assert hold_limit(Shaping(latency=0.02, bytes_per_second=10e6)) == HOLD_BYTES + 200_000
    assert hold_limit(Shaping(latency=0.02)) == HOLD_BYTES  # no rate: nothing to fill
    assert hold_limit(Shaping(bytes_per_second=10e6)) == HOLD_BYTES  # no latency: nothing in flight
    # The kernel limits the rate (a site's veth), the proxy only delays: the bytes in flight
    # are the line's, or the delay alone would cap the link at HOLD_BYTES per 20 ms.
    assert hold_limit(Shaping(latency=0.02, line_rate=10e6)) == HOLD_BYTES + 200_000
