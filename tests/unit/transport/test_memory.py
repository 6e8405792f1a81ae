"""The deterministic in-memory bus: timing, order, faults, retained + Last Will, Transport."""

from __future__ import annotations

import numpy as np
import pytest

from agent.transport.base import TransportError, Will
from agent.transport.memory import FakeClock, MemoryBus, MemoryTransport, topic_matches


def collecting(bus: MemoryBus, name: str, subs: list[str], will: tuple[str, object, bool] | None = None
               ) -> list[tuple[float, str, object]]:
    got: list[tuple[float, str, object]] = []
    bus.connect(name, lambda t, p, s: got.append((bus.now(), t, p)), subs, will)
    return got


def test_topic_matching() -> None:
    assert topic_matches("link/+/3", "link/7/3")
    assert not topic_matches("link/+/3", "link/7/4")
    assert topic_matches("a/#", "a/b/c")
    assert not topic_matches("a/b", "a/b/c")


def test_latency_bandwidth_and_fifo_order() -> None:
    bus = MemoryBus(FakeClock(), latency=0.001, bandwidth=1000.0, broker_bandwidth=2000.0)
    got = collecting(bus, "b", ["link/0/1"])
    bus.connect("a", lambda *_: None, [])
    for i in range(3):
        bus.publish("a", "link/0/1", bytes([i]) * 100)
    bus.run_until(10.0)
    assert [p for _, _, p in got] == [bytes([i]) * 100 for i in range(3)]
    # 100 B at 1000 B/s out of the sender, then 100 B at 2000 B/s through the broker, + latency
    assert got[0][0] == pytest.approx(0.1 + 0.05 + 0.001)
    assert got[2][0] == pytest.approx(0.3 + 0.05 + 0.001)
    assert bus.clock.now() == 10.0


def test_cut_one_way_and_heal() -> None:
    bus = MemoryBus()
    to_b = collecting(bus, "b", ["link/0/1"])
    to_a = collecting(bus, "a", ["link/1/0"])
    bus.cut(0, 1, both=False)
    bus.publish("a", "link/0/1", b"x")
    bus.publish("b", "link/1/0", b"y")
    bus.run_until(1.0)
    assert to_b == [] and len(to_a) == 1 and bus.stats.cut == 1
    bus.heal(0, 1)
    bus.publish("a", "link/0/1", b"x")
    bus.run_until(2.0)
    assert len(to_b) == 1


def test_loss_is_seeded_and_only_hits_link_topics() -> None:
    def run(seed: int) -> list[int]:
        bus = MemoryBus(rng=np.random.default_rng(seed))
        got = collecting(bus, "b", ["link/0/1", "status/+"])
        bus.connect("a", lambda *_: None, [])
        bus.set_loss(0.5)
        for i in range(200):
            bus.publish("a", "link/0/1", bytes([i % 256]))
        bus.publish("a", "status/0", b"online")
        bus.run_until(1.0)
        assert got[-1][1] == "status/0"  # never lost
        return [p[0] for _, t, p in got if t.startswith("link")]  # type: ignore[index]

    first = run(3)
    assert first == run(3) and 60 < len(first) < 140
    assert run(4) != first
    with pytest.raises(ValueError):
        MemoryBus().set_loss(1.5)


def test_crash_publishes_the_will_and_drops_what_was_in_flight() -> None:
    bus = MemoryBus(latency=0.01)
    watcher = collecting(bus, "w", ["status/+"])
    victim = collecting(bus, "v", ["link/+/5"], will=("status/5", b"offline", True))
    bus.connect("s", lambda *_: None, [])
    bus.publish("s", "link/1/5", b"late")
    bus.crash("v")
    bus.run_until(1.0)
    assert victim == []
    assert [(t, p) for _, t, p in watcher] == [("status/5", b"offline")]
    assert bus.retained["status/5"][0] == b"offline"
    bus.publish("v", "link/5/1", b"from the dead")
    assert bus.stats.to_dead == 1


def test_hang_holds_messages_fires_the_will_later_and_resume_returns_them() -> None:
    bus = MemoryBus(will_delay=2.0)
    watcher = collecting(bus, "w", ["status/+"])
    hung = collecting(bus, "h", ["link/+/2"], will=("status/2", b"offline", True))
    bus.connect("s", lambda *_: None, [])
    bus.hang("h")
    bus.publish("s", "link/1/2", b"queued")
    bus.run_until(1.0)
    assert hung == [] and watcher == [] and not bus.is_up("h")
    bus.run_until(3.0)
    assert [p for _, _, p in watcher] == [b"offline"]
    held = bus.resume("h")
    assert [p for _, p, _ in held] == [b"queued"] and bus.is_up("h")


def test_a_short_hang_publishes_no_will() -> None:
    bus = MemoryBus(will_delay=2.0)
    watcher = collecting(bus, "w", ["status/+"])
    collecting(bus, "h", [], will=("status/2", b"offline", True))
    bus.hang("h")
    bus.run_until(1.0)
    bus.resume("h")
    bus.run_until(5.0)
    assert watcher == []


def test_retained_messages_reach_late_subscribers() -> None:
    bus = MemoryBus()
    bus.connect("a", lambda *_: None, [])
    bus.publish("a", "view", b"v1", retain=True)
    bus.publish("a", "view", b"v2", retain=True)
    late = collecting(bus, "late", ["view"])
    bus.run_until(1.0)
    assert [p for _, _, p in late] == [b"v2"]


def test_memory_transport_implements_the_transport_protocol() -> None:
    bus = MemoryBus(latency=0.01)
    a, b = MemoryTransport(bus, "a"), MemoryTransport(bus, "b", max_queue=2)
    a.connect(["x/#"], Will("status/a", b"offline"))
    b.connect(["y/#"])
    a.publish("y/1", b"one")
    t0 = bus.now()
    msgs = b.receive(timeout=1.0)
    assert [m.payload for m in msgs] == [b"one"]
    assert bus.now() == pytest.approx(t0 + 0.01)  # fake time moved only as far as needed
    assert b.receive(timeout=0.5) == [] and bus.now() == pytest.approx(t0 + 0.51)
    for i in range(4):
        a.publish("y/2", bytes([i]))
    assert len(b.receive(timeout=1.0)) == 2 and b.dropped() == 2
    watcher = MemoryTransport(bus, "w")
    watcher.connect(["status/#"])
    a.close()  # clean: no Will
    assert watcher.receive(timeout=1.0) == []
    with pytest.raises(TransportError):
        a.publish("y/1", b"closed")


def test_ingress_bandwidth_queues_every_sender_behind_the_receivers_downlink() -> None:
    bus = MemoryBus(FakeClock(), latency=0.001, ingress_bandwidth=1000.0)
    got = collecting(bus, "c", ["link/+/2"])
    bus.connect("a", lambda *_: None, [])
    bus.connect("b", lambda *_: None, [])
    bus.publish("a", "link/0/2", b"x" * 100)
    bus.publish("b", "link/1/2", b"y" * 100)
    bus.run_until(10.0)
    # Both arrive after the latency; the receiver's downlink takes them one after the other.
    assert [round(t, 6) for t, _, _ in got] == [pytest.approx(0.101), pytest.approx(0.201)]


@pytest.mark.parametrize("shared", ["broker", "ingress"])
def test_a_message_on_a_slow_link_holds_up_no_later_one_that_arrives_first(shared: str) -> None:
    """The broker's queue and a receiver's downlink take messages as they reach them: one
    sent first on a 2 MB/s link does not delay a sibling's sent just after on a fast one (it
    did: both queues were reserved in the order of sending, as if the slow link were theirs)."""
    kwargs = {"broker_bandwidth": 1e9} if shared == "broker" else {"ingress_bandwidth": 1e9}
    bus = MemoryBus(FakeClock(), latency=0.001, **kwargs)  # type: ignore[arg-type]
    got = collecting(bus, "parent", ["link/+/1"])
    bus.connect("slow", lambda *_: None, [])
    bus.connect("fast", lambda *_: None, [])
    bus.set_link(3, 1, bandwidth=2e6)
    bus.publish("slow", "link/3/1", b"s" * 1_000_000)
    bus.publish("fast", "link/4/1", b"f" * 1_000_000)
    bus.run_until(10.0)
    assert [p[:1] for _, _, p in got] == [b"f", b"s"]  # type: ignore[index]
    assert got[0][0] == pytest.approx(0.001 + 0.001, abs=1e-4)  # 1 MB at 1 GB/s, + latency
    assert got[1][0] == pytest.approx(0.5 + 0.001 + 0.001, abs=1e-4)
