"""agent/transport/reach_probe.py against real sockets on 127.0.0.1: a listener whose accept
queue is full drops SYNs as a cut network does; room in it is the heal."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from agent.transport.reach_probe import PROBE_EVERY_S, ReachProbe


@pytest.fixture
def full_listener() -> Iterator[tuple[socket.socket, list[socket.socket]]]:
    """A listener with a backlog of 0, filled: the kernel drops further SYNs unanswered."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    fillers = []
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(server.getsockname())
        fillers.append(filler)
    yield server, fillers
    for s in [server, *fillers]:
        s.close()


def drain(server: socket.socket) -> None:
    """Make room in the accept queue (the heal)."""
    server.setblocking(False)
    while True:
        try:
            conn, _ = server.accept()
        except BlockingIOError:
            return
        conn.close()


def test_unanswered_probes_follow_one_another_and_the_first_after_the_heal_answers(
    full_listener: tuple[socket.socket, list[socket.socket]],
) -> None:
    server, _ = full_listener
    probe = ReachProbe(socket.AF_INET, server.getsockname(), lifetime=2.0)
    try:
        # Not one attempt waiting for the kernel's SYN resend: a new SYN every PROBE_EVERY_S,
        # none answered while the queue is full.
        for _ in range(100):
            assert probe.wait(PROBE_EVERY_S) is False
            if probe.launched >= 3:
                break
        assert probe.launched >= 3 and probe.open_count() == probe.launched
        drain(server)
        assert probe.wait(2.0) is True
    finally:
        probe.close()


def test_a_refusal_is_an_answer_the_host_is_there() -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    address = closed.getsockname()
    closed.close()  # nothing listens: the kernel answers with a reset
    probe = ReachProbe(socket.AF_INET, address, lifetime=2.0)
    assert probe.wait(2.0) is True
    assert probe.launched == 1


def test_old_probes_are_closed_after_their_lifetime(
    full_listener: tuple[socket.socket, list[socket.socket]],
) -> None:
    server, _ = full_listener
    probe = ReachProbe(socket.AF_INET, server.getsockname(), lifetime=2 * PROBE_EVERY_S)
    try:
        for _ in range(200):
            assert probe.wait(PROBE_EVERY_S) is False
            assert probe.open_count() <= 3  # at most lifetime / every + 1 open at once
            if probe.launched >= 6:
                break
        assert probe.launched >= 6
    finally:
        probe.close()
    assert probe.open_count() == 0
