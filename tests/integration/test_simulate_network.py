"""The simulator's network tools on real sockets: the TCP proxy, netns isolation and kernel shaping."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator

import pytest

from simulate.injector import (
    NETNS_MTU,
    NetNamespace,
    kernel_shaping_supported,
    netns_supported,
)
from simulate.proxy import MOST_HELD_BYTES, TcpProxy
from tests.integration.conftest import created_namespace, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def echo_server() -> Iterator[int]:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=_echo, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield port
    stop.set()
    thread.join(2)
    server.close()


def _echo(conn: socket.socket) -> None:
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data)


def _roundtrip(port: int, payload: bytes, host: str = "127.0.0.1") -> bytes:
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(payload)
        got = b""
        while len(got) < len(payload):
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
        return got


def test_proxy_forwards_bytes_intact_both_ways(echo_server: int) -> None:
    proxy = TcpProxy("127.0.0.1", echo_server)
    port = proxy.start()
    try:
        payload = os.urandom(1_000_000)
        assert _roundtrip(port, payload) == payload
        assert proxy.bytes_up[0] == len(payload) and proxy.bytes_down[0] == len(payload)
        assert proxy.connections == 1
    finally:
        proxy.stop()


def test_proxy_latency_and_bandwidth_hold_data_back(echo_server: int) -> None:
    proxy = TcpProxy("127.0.0.1", echo_server)
    port = proxy.start()
    try:
        proxy.set_latency(0.2)
        started = time.monotonic()
        assert _roundtrip(port, b"ping") == b"ping"
        with_latency = time.monotonic() - started
        proxy.set_latency(0.0)
        proxy.set_bandwidth(1_000_000)
        payload = os.urandom(300_000)
        started = time.monotonic()
        assert _roundtrip(port, payload) == payload
        with_limit = time.monotonic() - started
        proxy.clear()
        # Lower bounds only (a busy machine can only add time): the proxy delays each
        # direction by 0.2 s, and 300 kB at 1 MB/s take 0.3 s (the two directions overlap).
        print(f"proxy: 0.2 s latency -> echo {with_latency:.3f} s; 1 MB/s -> 300 kB echo {with_limit:.3f} s")
        assert with_latency >= 0.4
        assert with_limit >= 0.3
    finally:
        proxy.stop()


def test_a_slow_proxy_pushes_back_into_the_senders_socket() -> None:
    # A real bottleneck holds little and lets TCP flow control back up into the sender: what
    # the link cannot take yet stays in the sender's own send queue (SIOCOUTQ), where the
    # sender can see it drain at the link's rate.
    sink = socket.create_server(("127.0.0.1", 0))
    got = [0]

    def drain() -> None:
        conn, _ = sink.accept()
        with conn:
            while data := conn.recv(65536):
                got[0] += len(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    proxy = TcpProxy("127.0.0.1", sink.getsockname()[1])
    port = proxy.start()
    try:
        proxy.set_bandwidth(1_000_000)
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
            sock.setblocking(False)
            payload, sent = os.urandom(2_000_000), 0
            with contextlib.suppress(BlockingIOError):
                while sent < len(payload):
                    sent += sock.send(payload[sent:])
            wait_until(lambda: got[0] > 100_000, what="the first bytes through")
            queued = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
            # Out of our queue and not yet handed on: at most what the proxy's parts can hold.
            # (Counted by the proxy, not by our reader: on a loaded host the reader lags, and
            # what waits in its own socket is no part of the proxy's hold.) A proxy that did not
            # push back would hold all but the first bytes.
            assert sent - proxy.bytes_up[0] - queued <= MOST_HELD_BYTES
            assert queued > 1_000_000
    finally:
        proxy.stop()
        sink.close()


def test_proxy_rejects_nonsense_limits() -> None:
    proxy = TcpProxy("127.0.0.1", 1)
    with pytest.raises(ValueError):
        proxy.set_latency(-1)
    with pytest.raises(ValueError):
        proxy.set_bandwidth(0)


_CLIENT = """
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
try:
    with socket.create_connection((host, port), timeout=1.5) as s:
        s.sendall(b"hello")
        print(s.recv(16).decode())
except OSError as exc:
    print("blocked", type(exc).__name__)
"""


@pytest.mark.skipif(bool(netns_supported()), reason="needs root, ip and iptables")
def test_netns_isolation_cuts_the_agent_off_and_heals(echo_server: int) -> None:
    ns = NetNamespace(f"egt{os.getpid() % 10000}", slot=240)
    proxy: TcpProxy | None = None
    try:
        ns.create()
        proxy = TcpProxy("127.0.0.1", echo_server, listen_host=ns.host_ip)
        port = proxy.start()

        def client() -> str:
            done = subprocess.run([*ns.prefix(), sys.executable, "-c", _CLIENT, ns.host_ip, str(port)],
                                  capture_output=True, text=True, timeout=30, check=True)
            return done.stdout.strip()

        assert client() == "hello"
        ns.isolate()
        assert client().startswith("blocked")
        ns.heal()
        assert client() == "hello"
    finally:
        if proxy is not None:
            proxy.stop()
        ns.remove()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert ns.name not in listed
    assert shutil.which("ip")


# Echo SIZE random bytes through host:port (sending while receiving); print the seconds it took
# and whether every byte came back.
_ECHO_CLIENT = """
import os, socket, sys, threading, time
host, port, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
payload = os.urandom(size)
with socket.create_connection((host, port), timeout=20) as s:
    started = time.monotonic()
    sender = threading.Thread(target=s.sendall, args=(payload,))
    sender.start()
    got = bytearray()
    while len(got) < size and (chunk := s.recv(65536)):
        got += chunk
    sender.join()
    print(f"{time.monotonic() - started:.4f} {bytes(got) == payload}")
"""


@pytest.mark.skipif(bool(kernel_shaping_supported()), reason="needs root, ip, tc and iptables")
def test_kernel_shaping_limits_both_directions_with_no_process_in_the_path(echo_server: int) -> None:
    fwd_port = 18_000 + os.getpid() % 20_000  # on the veth's host end only: the DNAT matches there
    ns = created_namespace(f"egk{os.getpid() % 10000}", 230)
    try:
        ns.forward(fwd_port, echo_server)
        # Both veth ends take the large MTU (not Ethernet's 1,500: see NETNS_MTU).
        for prefix, dev in (((), ns.host_if), (ns.prefix(), ns.ns_if)):
            shown = subprocess.run([*prefix, "ip", "-o", "link", "show", "dev", dev], capture_output=True,
                                   text=True, check=True).stdout
            assert f" mtu {NETNS_MTU} " in shown, shown

        def echo(size: int) -> float:
            done = subprocess.run([*ns.prefix(), sys.executable, "-c", _ECHO_CLIENT, ns.host_ip, str(fwd_port),
                                   str(size)], capture_output=True, text=True, timeout=60, check=True)
            seconds, intact = done.stdout.split()
            assert intact == "True", done.stdout
            return float(seconds)

        size = 600_000
        free = echo(size)
        ns.limit(500_000)
        limited = echo(size)
        ns.unlimit()
        free_again = echo(size)
        print(f"kernel shaping: {size} B echo {free:.3f} s free, {limited:.3f} s at 0.5 MB/s each way, "
              f"{free_again:.3f} s free again")
        # Lower bound only where a busy host can only add time: 600 kB each way at 0.5 MB/s
        # take 1.2 s (the directions overlap). Free, the echo is the veth's and loopback's.
        assert limited >= 1.0
        assert free_again < limited / 2
    finally:
        ns.remove()
    rules = subprocess.run(["iptables", "-t", "nat", "-S", "PREROUTING"], capture_output=True, text=True).stdout
    assert ns.host_if not in rules  # the DNAT went with the namespace
    assert ns.name not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
