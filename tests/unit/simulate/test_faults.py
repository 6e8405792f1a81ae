"""FaultyTransport against a tiny in-test fake transport with a fake clock."""

from __future__ import annotations

import numpy as np
import pytest

from agent.protocol.messages import Control
from agent.protocol.topics import Topics
from agent.transport.base import Message, Will
from simulate.faults import FaultyTransport

TOPICS = Topics("job")


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t


class FakeInner:
    """Records publishes; ``receive`` hands out what the test queued and advances the clock."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.published: list[Message] = []
        self.inbox: list[Message] = []
        self.connected_with: tuple[list[str], Will | None] | None = None

    def connect(self, subscriptions: list[str], will: Will | None = None,
                birth: Message | None = None) -> None:
        self.connected_with = (subscriptions, will)
        self.birth: Message | None = birth

    def publish(self, topic: str, payload: bytes, retain: bool = False, reliable: bool = False) -> None:
        self.published.append(Message(topic, payload, retain))

    def receive(self, timeout: float) -> list[Message]:
        if self.inbox:
            out, self.inbox = self.inbox, []
            return out
        self.clock.t += timeout
        return []

    def dropped(self) -> int:
        return 7

    def close(self) -> None:
        pass


def make(seed: int = 0) -> tuple[FaultyTransport, FakeInner, FakeClock]:
    clock = FakeClock()
    inner = FakeInner(clock)
    return FaultyTransport(inner, 1, TOPICS, np.random.default_rng(seed), clock), inner, clock


def link_msg(src: int, dst: int, payload: bytes = b"x") -> Message:
    return Message(TOPICS.link(src, dst), payload)


def test_cut_out_drops_only_frames_to_that_peer_and_heal_restores() -> None:
    ft, inner, _ = make()
    ft.cut(2, "out")
    ft.publish(TOPICS.link(1, 2), b"a")
    ft.publish(TOPICS.link(1, 3), b"b")
    ft.publish(TOPICS.status(1), b"s", retain=True)
    assert [m.topic for m in inner.published] == [TOPICS.link(1, 3), TOPICS.status(1)]
    assert inner.published[1].retained
    assert ft.fault_drops["cut_out"] == 1
    inner.inbox = [link_msg(2, 1)]
    assert ft.receive(0.0) == [link_msg(2, 1)]  # "out" does not cut incoming
    ft.heal(2)
    ft.publish(TOPICS.link(1, 2), b"c")
    assert inner.published[-1] == Message(TOPICS.link(1, 2), b"c")


def test_cut_both_drops_incoming_link_frames_but_not_status_or_view() -> None:
    ft, inner, _ = make()
    ft.cut(2)
    inner.inbox = [link_msg(2, 1), link_msg(3, 1), Message(TOPICS.status(2), b"on"),
                   Message(TOPICS.view, b"v")]
    got = ft.receive(0.0)
    assert [m.topic for m in got] == [TOPICS.link(3, 1), TOPICS.status(2), TOPICS.view]
    assert ft.fault_drops["cut_in"] == 1
    ft.publish(TOPICS.link(1, 2), b"a")
    assert inner.published == []


def test_loss_drops_about_p_of_link_frames_and_never_other_topics() -> None:
    ft, inner, _ = make(seed=42)
    ft.set_loss(0.3, "out")
    for _ in range(2000):
        ft.publish(TOPICS.link(1, 0), b"x")
        ft.publish(TOPICS.telemetry(1), b"t")
    sent_links = sum(1 for m in inner.published if m.topic == TOPICS.link(1, 0))
    sent_telemetry = sum(1 for m in inner.published if m.topic == TOPICS.telemetry(1))
    assert sent_telemetry == 2000
    assert 1250 < sent_links < 1550  # 0.7 * 2000 = 1400, > 5 sigma margin
    assert ft.fault_drops["loss_out"] == 2000 - sent_links
    inner.inbox = [link_msg(0, 1) for _ in range(100)]
    assert len(ft.receive(0.0)) == 100  # "out" only: receiving is untouched


def test_loss_is_reproducible_with_the_same_seed() -> None:
    def run(seed: int) -> list[bytes]:
        ft, inner, _ = make(seed)
        ft.set_loss(0.5, "in")
        inner.inbox = [link_msg(0, 1, bytes([i])) for i in range(64)]
        return [m.payload for m in ft.receive(0.0)]

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_latency_holds_link_frames_until_due_while_status_passes() -> None:
    ft, inner, clock = make()
    ft.set_latency(0.5)
    inner.inbox = [link_msg(0, 1), Message(TOPICS.status(0), b"on")]
    assert ft.receive(0.0) == [Message(TOPICS.status(0), b"on")]
    assert ft.receive(0.1) == []
    assert ft.receive(10.0) == [link_msg(0, 1)]  # released at its due time, not after 10 s
    assert clock.t == pytest.approx(0.5)


def test_apply_control_maps_commands_for_this_node_only() -> None:
    ft, inner, _ = make()
    assert not ft.apply_control(Control(action="cut", node=2, peer=1))
    assert ft.apply_control(Control(action="cut", node=1, peer=0, one_way=True))
    ft.publish(TOPICS.link(1, 0), b"a")
    inner.inbox = [link_msg(0, 1)]
    assert ft.receive(0.0) == [link_msg(0, 1)]
    assert inner.published == []
    assert ft.apply_control(Control(action="heal", node=1, peer=0))
    assert not ft.apply_control(Control(action="crash", node=1))
    ft.publish(TOPICS.link(1, 0), b"b")
    assert len(inner.published) == 1


def test_bad_arguments_are_rejected_with_a_message() -> None:
    ft, _, _ = make()
    with pytest.raises(ValueError, match="loss probability"):
        ft.set_loss(1.5)
    with pytest.raises(ValueError, match="direction"):
        ft.cut(2, "sideways")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="latency"):
        ft.set_latency(-1)


def test_connect_dropped_and_close_delegate() -> None:
    ft, inner, _ = make()
    will = Will(TOPICS.status(1), b"off")
    ft.connect(["a"], will)
    assert inner.connected_with == (["a"], will)
    birth = Message(TOPICS.status(1), b"on", True)
    ft.connect(["b"], will, birth=birth)
    assert inner.birth == birth
    assert ft.dropped() == 7
