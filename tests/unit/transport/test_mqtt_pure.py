"""The pure parts of agent.transport.mqtt: URL parsing, the pacing token bucket, and how
``receive`` waits (no broker: nothing is connected)."""

from __future__ import annotations

import itertools

import pytest

from agent.transport.base import Message
from agent.transport.mqtt import MqttTransport, TokenBucket, parse_broker_url
from agent.transport.reconnect_pace import UNANSWERED_TIMEOUT_S


def test_parse_broker_url_accepts_mqtt_and_mqtts_with_default_ports() -> None:
    assert parse_broker_url("mqtt://127.0.0.1:1999").url == "mqtt://127.0.0.1:1999"
    plain = parse_broker_url("mqtt://broker.local")
    assert (plain.host, plain.port, plain.tls) == ("broker.local", 1883, False)
    tls = parse_broker_url("mqtts://broker.local")
    assert (tls.port, tls.tls) == (8883, True)


@pytest.mark.parametrize("url", ["http://h:1", "h:1883", "mqtt://", "mqtt://h:99999",
                                 "mqtt://u:p@h:1", "mqtt://h:1/x", "tcp://h:1883"])
def test_parse_broker_url_rejects_everything_else_saying_what_to_use(url: str) -> None:
    with pytest.raises(ValueError, match="mqtt://HOST:PORT"):
        parse_broker_url(url)


def test_token_bucket_lets_a_burst_through_then_paces_at_the_rate() -> None:
    bucket = TokenBucket(rate=1000.0, burst=500.0, now=0.0)
    assert bucket.reserve(500, now=0.0) == 0.0
    assert bucket.reserve(250, now=0.0) == pytest.approx(0.25)
    # after waiting those 0.25 s the debt is paid; the next 100 bytes cost 0.1 s
    assert bucket.reserve(100, now=0.25) == pytest.approx(0.1)
    # a long idle time refills only up to the burst
    assert bucket.reserve(500, now=100.0) == 0.0
    assert bucket.reserve(1000, now=100.0) == pytest.approx(1.0)


def test_token_bucket_rejects_non_positive_rates() -> None:
    with pytest.raises(ValueError):
        TokenBucket(rate=0.0, burst=1.0, now=0.0)


def test_inline_receive_waits_on_the_socket_only_never_again_on_the_empty_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Inline mode has no paho thread that could fill the queue: a second wait after the
    # socket's (select in ``_drive``) would be deaf to frames arriving meanwhile.
    transport = MqttTransport("edgegrove-test-1", "mqtt://127.0.0.1:1", threaded=False)
    transport._started = True  # as after connect(); nothing is opened by this test
    drives: list[float] = []
    monkeypatch.setattr(transport, "_drive", drives.append)

    def deaf_wait(*args: object, **kwargs: object) -> bool:
        raise AssertionError("inline receive waited on its own queue")

    monkeypatch.setattr(transport._arrived, "wait_for", deaf_wait)
    assert transport.receive(0.2) == []
    assert drives == [0.2]
    transport._queue.append(Message("t", b"x", False))
    assert transport.receive(0.2) == [Message("t", b"x", False)]


def test_threaded_receive_still_waits_for_paho_thread_to_deliver(monkeypatch: pytest.MonkeyPatch) -> None:
    transport = MqttTransport("edgegrove-test-2", "mqtt://127.0.0.1:1", threaded=True)
    transport._started = True
    waits: list[float] = []

    def wait_for(predicate: object, timeout: float) -> bool:
        waits.append(timeout)
        return False

    monkeypatch.setattr(transport._arrived, "wait_for", wait_for)
    assert transport.receive(0.2) == [] and waits == [0.2]


class _Clock:
    """The transport's ``time`` in these tests: ``sleep`` moves ``now`` on, nothing waits."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class _UnreachableBroker:
    """paho's client while the network is cut: every reconnect fails after ``blocks`` s (a
    dropped SYN waits for its timeout; 0: refused at once)."""

    def __init__(self, clock: _Clock, blocks: float) -> None:
        self.clock, self.blocks = clock, blocks
        self.connect_timeout = 5.0  # paho's default
        self.attempts: list[tuple[float, float]] = []  # (when, the timeout it waited with)

    def socket(self) -> None:
        return None

    def reconnect(self) -> None:
        self.attempts.append((self.clock.now, self.connect_timeout))
        self.clock.now += min(self.blocks, self.connect_timeout)
        if self.blocks:
            raise TimeoutError("timed out")  # as socket.create_connection says it
        raise ConnectionRefusedError("refused")


@pytest.mark.parametrize("blocks", [0.0, 30.0])
def test_a_cut_off_agent_tries_the_broker_again_at_least_every_two_seconds(
    blocks: float, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """However long the cut lasts, the next attempt (refused at once, or a SYN dropped until
    the attempt's timeout) starts within RECONNECT_TIMEOUT_S of the last one: the heal is
    noticed about a second later. The backoff grew to 5 s and an attempt waited paho's 5 s.
    Attempts nobody answers follow one another at once, most of them short (ReconnectPace):
    a SYN several times a second; refused ones keep the backoff and the full wait."""
    from agent.transport import mqtt as mqtt_module
    from agent.transport import reconnects

    clock = _Clock()
    monkeypatch.setattr(mqtt_module, "time", clock)
    monkeypatch.setattr(reconnects, "time", clock)
    transport = MqttTransport("edgegrove-test-3", "mqtt://127.0.0.1:1", threaded=False)
    broker = _UnreachableBroker(clock, blocks)
    transport._client = broker  # type: ignore[assignment]
    while clock.now < 60.0:
        transport._step(0.05)
    starts = [at for at, _ in broker.attempts]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert len(starts) > 20 and max(gaps) <= mqtt_module.RECONNECT_TIMEOUT_S + 0.05, gaps
    timeouts = [timeout for _, timeout in broker.attempts]
    if blocks == 0.0:
        assert max(gaps[10:]) <= mqtt_module.RECONNECT_MAX_S + 0.05, gaps
        assert set(timeouts) == {mqtt_module.RECONNECT_TIMEOUT_S}
    else:
        assert set(timeouts) == {mqtt_module.RECONNECT_TIMEOUT_S, UNANSWERED_TIMEOUT_S}
        assert len(starts) / clock.now > 2.0, "attempts a second while the network is cut"
        assert sorted(gaps)[len(gaps) // 2] <= UNANSWERED_TIMEOUT_S + 0.05, gaps


class _StalledSocket:
    def __init__(self, waited_ms: int, unacked: int = 5) -> None:
        raw = bytearray(104)
        raw[24:28] = unacked.to_bytes(4, "little")  # tcp_info.unacked
        raw[56:60] = waited_ms.to_bytes(4, "little")  # tcp_info.last_ack_recv
        self.raw = bytes(raw)
        self.shut: list[int] = []

    def getsockopt(self, level: int, option: int, size: int) -> bytes:
        return self.raw

    def shutdown(self, how: int) -> None:
        self.shut.append(how)


class _ConnectedClient:
    def __init__(self, sock: _StalledSocket) -> None:
        self.sock = sock
        self.probes: list[float] = []

    def socket(self) -> _StalledSocket:
        return self.sock

    def probe_if_quiet(self, quiet_for: float) -> None:
        self.probes.append(quiet_for)


@pytest.mark.parametrize(("waited_ms", "dropped"), [(2900, False), (3100, True)])
def test_a_connection_without_an_ack_for_three_seconds_is_dropped_to_reconnect(waited_ms: int, dropped: bool) -> None:
    """Cut off the network, the connection outlives the cut and resumed only at TCP's next
    backed-off retransmission, seconds after the heal: it is ended here and opened anew."""
    import socket

    transport = MqttTransport("edgegrove-test-4", "mqtt://127.0.0.1:1", threaded=False)
    sock = _StalledSocket(waited_ms)
    client = _ConnectedClient(sock)
    transport._client = client  # type: ignore[assignment]
    transport._connected.set()
    transport._drop_if_stalled()
    assert sock.shut == ([socket.SHUT_RDWR] if dropped else [])
    assert client.probes == []  # our bytes already wait for an ACK: no probe needed


def test_with_nothing_waiting_for_an_ack_a_quiet_connection_is_probed() -> None:
    """A node with nothing to send had no bytes waiting for an ACK, so a cut went unnoticed
    until TCP resumed after the heal (~4 s): a PINGREQ after a quiet second makes some."""
    from agent.transport import mqtt as mqtt_module

    transport = MqttTransport("edgegrove-test-5", "mqtt://127.0.0.1:1", threaded=False)
    client = _ConnectedClient(_StalledSocket(60_000, unacked=0))
    transport._client = client  # type: ignore[assignment]
    transport._connected.set()
    transport._drop_if_stalled()
    assert client.probes == [mqtt_module.PROBE_QUIET_S] and client.sock.shut == []
