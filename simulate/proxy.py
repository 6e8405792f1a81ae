"""A user-space TCP proxy between one agent and the broker, to add latency and limit bandwidth.

This kernel has no netem, so delay and rate limits are applied here: every chunk of bytes read
from one side is written to the other side no earlier than ``latency`` seconds later, and no
faster than ``bytes_per_second`` (a token bucket per direction, FIFO preserved). Limits can be
changed while connections are open. The proxy runs its own asyncio loop in a daemon thread;
``stop()`` closes the listener and every connection.

Like a real bottleneck, the proxy pushes back: each direction holds at most ``HOLD_BYTES`` read
but not yet handed on, and its sockets' receive buffers are as small, so the sender's own
socket fills up (TCP flow control) instead of the proxy buffering without bound. A sender can
then see its link is slow (its send queue drains at the link's rate), as on a Wi-Fi uplink.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

HOLD_BYTES = 64 * 1024  # per direction: read from one side, not yet written to the other
READ_SIZE = 64 * 1024
# asyncio's StreamReader stops reading its socket above twice this (its default). Not less:
# with 16 KiB, a 128 KB message through the proxy took 44 ms instead of 0.8 (the kernel's
# window update after a paused read waited for its delayed ACK).
READER_LIMIT = 64 * 1024
# The most one direction can hold out of the sender's send queue while the link is backed up:
# the pump's queue (it stops reading at HOLD_BYTES, after a read of up to READ_SIZE), the
# StreamReader's buffer (above 2 x READER_LIMIT it pauses, after one more read of at most what
# the kernel held) and the kernel's receive buffer (SO_RCVBUF = HOLD_BYTES, doubled by Linux).
# A link with both latency and a rate holds its bytes in flight on top (``hold_limit``).
MOST_HELD_BYTES = (HOLD_BYTES + READ_SIZE) + (2 * READER_LIMIT + 2 * HOLD_BYTES) + 2 * HOLD_BYTES


@dataclass
class Shaping:
    """Current limits; read by the pumps for every chunk, so changes apply at once."""

    latency: float = 0.0
    bytes_per_second: float | None = None
    # The rate of a link another shaper limits (the kernel's tbf on a site's veth): not applied
    # here, but what is in flight on it at ``latency`` must fit in what this side holds.
    line_rate: float | None = None


def hold_limit(shaping: Shaping) -> int:
    """Bytes one direction holds before it pushes back: HOLD_BYTES queued plus, on a link with
    latency and a rate, the bytes in flight on the wire (rate x latency). Without them a 10 MB/s
    link with 20 ms each way carried 64 KiB per 20 ms: 3.2 MB/s (a 3x3 sites fleet's round took
    1.4 s instead of 0.4)."""
    rate = shaping.bytes_per_second or shaping.line_rate
    return HOLD_BYTES + (int(rate * shaping.latency) if rate else 0)


class _Pump:
    """One direction of one connection: read, stamp a due time, write when due."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 shaping: Shaping, counter: list[int],
                 trace: Callable[[], list[tuple[float, int]] | None] = lambda: None) -> None:
        self.reader = reader
        self.writer = writer
        self.shaping = shaping
        self.counter = counter
        self.trace = trace  # where to note (wall-clock time, bytes) of each write: the proxy's, now
        self.queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        self.last_due = 0.0
        self.last_read = 0.0
        self.held = 0  # bytes in ``queue``
        self.room = asyncio.Event()  # set whenever held < hold_limit
        self.room.set()

    async def read_loop(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            pushed_back = False
            while data := await self.reader.read(READ_SIZE):
                now = loop.time()
                # Pushed back, these bytes waited in the sender since our last read: the link
                # was busy all along, and a late wake-up of the writer must not slow it down.
                ready = (self.last_read if pushed_back else now) + self.shaping.latency
                self.last_read = now
                due = max(ready, self.last_due)
                rate = self.shaping.bytes_per_second
                if rate:
                    # Serialisation delay: the chunk occupies the link for len/rate seconds.
                    due = max(due, self.last_due) + len(data) / rate
                self.last_due = due
                self.held += len(data)
                await self.queue.put((due, data))
                pushed_back = self.held >= hold_limit(self.shaping)
                if pushed_back:
                    self.room.clear()
                    await self.room.wait()  # push back: no more reads until some went on
        finally:
            await self.queue.put((0.0, b""))

    async def write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due, data = await self.queue.get()
            if not data:
                break
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            # Counted as handed on, before the write: a reader that got every byte must
            # never see the counter short.
            self.counter[0] += len(data)
            if (trace := self.trace()) is not None:
                trace.append((time.time(), len(data)))
            self.writer.write(data)
            await self.writer.drain()
            self.held -= len(data)
            if self.held < hold_limit(self.shaping):
                self.room.set()
        # Its sender closed: pass the FIN on, keep the other direction open until its sender
        # closes too. A full close here reset the broker's connection while the broker was
        # still sending (unread bytes): it dropped the agent's DISCONNECT and published its Will.
        with contextlib.suppress(OSError, RuntimeError):
            if self.writer.can_write_eof():
                self.writer.write_eof()
            else:
                self.writer.close()


def _small_receive_buffer(sock: socket.socket) -> None:
    """What the kernel accepts for the proxy before it reads: HOLD_BYTES (Linux doubles it)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, HOLD_BYTES)


class TcpProxy:
    """Listen on ``listen_host``:port (0 = any free port), forward to ``target``."""

    def __init__(self, target_host: str, target_port: int, listen_host: str = "127.0.0.1",
                 listen_port: int = 0, name: str = "proxy") -> None:
        self.target = (target_host, target_port)
        self.listen = (listen_host, listen_port)
        self.name = name
        self.shaping_up = Shaping()  # agent -> broker
        self.shaping_down = Shaping()  # broker -> agent
        self.bytes_up = [0]
        self.bytes_down = [0]
        # When traced (start_trace): (wall-clock time, bytes) of every write each way, so that a
        # run's rounds can be laid beside what the link carried when (`bench sites --real`).
        self.trace_up: list[tuple[float, int]] | None = None
        self.trace_down: list[tuple[float, int]] | None = None
        self.connections = 0
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    def start(self, timeout: float = 10.0) -> int:
        """Start listening; return the bound port once the socket is open."""
        ready = threading.Event()
        errors: list[BaseException] = []

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                listener = socket.create_server(self.listen)
                _small_receive_buffer(listener)  # accepted sockets inherit it
                self._server = loop.run_until_complete(asyncio.start_server(self._handle, sock=listener, limit=READER_LIMIT))
                self.port = self._server.sockets[0].getsockname()[1]
            except OSError as exc:
                errors.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=serve, name=self.name, daemon=True)
        self._thread.start()
        if not ready.wait(timeout) or errors:
            raise OSError(f"{self.name}: cannot listen on {self.listen}: {errors[0] if errors else 'timeout'}")
        return self.port

    def set_latency(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"latency must be >= 0, got {seconds}")
        self.shaping_up.latency = self.shaping_down.latency = seconds

    def set_bandwidth(self, bytes_per_second: float | None) -> None:
        if bytes_per_second is not None and bytes_per_second <= 0:
            raise ValueError(f"bandwidth must be > 0 bytes/s, got {bytes_per_second}")
        self.shaping_up.bytes_per_second = self.shaping_down.bytes_per_second = bytes_per_second

    def start_trace(self) -> None:
        self.trace_up, self.trace_down = [], []

    def clear(self) -> None:
        self.set_latency(0.0)
        self.set_bandwidth(None)

    def drop_connections(self) -> None:
        """Cut every connection through the proxy now, without a word to either side (like a
        Wi-Fi link that goes away): the broker sees the agent vanish, the agent reconnects."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        for task in list(self._tasks):
            loop.call_soon_threadsafe(task.cancel)

    def stop(self) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=5)
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _handle(self, client_reader: asyncio.StreamReader,
                      client_writer: asyncio.StreamWriter) -> None:
        try:
            loop = asyncio.get_running_loop()
            family, _, _, _, address = (await loop.getaddrinfo(*self.target, type=socket.SOCK_STREAM))[0]
            upstream = socket.socket(family, socket.SOCK_STREAM)
            _small_receive_buffer(upstream)
            upstream.setblocking(False)
            try:
                await loop.sock_connect(upstream, address)
            except OSError:
                upstream.close()
                raise
            broker_reader, broker_writer = await asyncio.open_connection(sock=upstream, limit=READER_LIMIT)
        except OSError:
            client_writer.close()
            return
        self.connections += 1
        up = _Pump(client_reader, broker_writer, self.shaping_up, self.bytes_up, lambda: self.trace_up)
        down = _Pump(broker_reader, client_writer, self.shaping_down, self.bytes_down, lambda: self.trace_down)
        tasks = [self._spawn(p.read_loop()) for p in (up, down)]
        tasks += [self._spawn(p.write_loop()) for p in (up, down)]
        try:
            await asyncio.gather(*tasks)
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            for task in tasks:
                task.cancel()
            for writer in (client_writer, broker_writer):
                with contextlib.suppress(OSError, RuntimeError):
                    writer.close()
