"""Fault injection inside an agent: a Transport decorator that cuts, loses or delays link frames.

The simulator's agents (``simulate.faulty_agent``) run with their MQTT transport wrapped in
``FaultyTransport``; it obeys the cut/heal/loss/latency ``Control`` commands addressed to its node.

Only frames on ``link/<src>/<dst>`` topics are touched; status, view, telemetry and control
pass unchanged, so a cut link looks to the protocol exactly like a silent network failure
while the dashboard still sees the node. Randomness comes from the injected generator, time
from the injected clock, so unit tests are deterministic.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from typing import Literal

import numpy as np

from agent.clock import Clock, MonotonicClock
from agent.config import AgentConfig
from agent.protocol.messages import Control
from agent.protocol.topics import Topics
from agent.transport.base import Message, Transport, Will

Direction = Literal["both", "out", "in"]
_DIRECTIONS = ("both", "out", "in")


def _check_direction(direction: str) -> None:
    if direction not in _DIRECTIONS:
        raise ValueError(f"direction {direction!r} is not one of {', '.join(_DIRECTIONS)}")


class FaultyTransport:
    """Wraps ``inner``; the node ``node_id`` of job ``topics`` suffers the injected faults."""

    def __init__(self, inner: Transport, node_id: int, topics: Topics,
                 rng: np.random.Generator, clock: Clock | None = None) -> None:
        self.inner = inner
        self.node_id = node_id
        self.topics = topics
        self._rng = rng
        self._clock = clock or MonotonicClock()
        self._cut_out: set[int] = set()
        self._cut_in: set[int] = set()
        self._loss_out = 0.0
        self._loss_in = 0.0
        self._latency = 0.0
        self._held: list[tuple[float, int, Message]] = []  # (due, seq, message) heap
        self._seq = itertools.count()
        self.fault_drops: Counter[str] = Counter()

    # -- fault controls ---------------------------------------------------------------------

    def cut(self, peer: int, direction: Direction = "both") -> None:
        """Drop link frames to (``out``), from (``in``) or to and from (``both``) ``peer``."""
        _check_direction(direction)
        if direction in ("both", "out"):
            self._cut_out.add(peer)
        if direction in ("both", "in"):
            self._cut_in.add(peer)

    def heal(self, peer: int) -> None:
        self._cut_out.discard(peer)
        self._cut_in.discard(peer)

    def heal_all(self) -> None:
        self._cut_out.clear()
        self._cut_in.clear()
        self._loss_out = self._loss_in = 0.0
        self._latency = 0.0

    def set_loss(self, p: float, direction: Direction = "both") -> None:
        """Drop each link frame sent (``out``) and/or received (``in``) with probability p."""
        _check_direction(direction)
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"loss probability must be in [0, 1], got {p}")
        if direction in ("both", "out"):
            self._loss_out = p
        if direction in ("both", "in"):
            self._loss_in = p

    def set_latency(self, seconds: float) -> None:
        """Hold every received link frame for ``seconds`` before ``receive`` hands it out."""
        if seconds < 0:
            raise ValueError(f"latency must be >= 0 s, got {seconds}")
        self._latency = seconds

    def apply_control(self, control: Control) -> bool:
        """Apply a ``control`` command addressed to this node; False if it is not ours to do.

        A cut/heal of link node->peer is done by ``node`` alone: it drops its frames to peer
        and (unless ``one_way``) those from peer. Crash, hang, restart... are process-level
        and left to the caller.
        """
        if control.node != self.node_id:
            return False
        if control.action == "cut" and control.peer is not None:
            self.cut(control.peer, "out" if control.one_way else "both")
        elif control.action == "heal" and control.peer is not None:
            self.heal(control.peer)
        elif control.action == "loss" and control.value is not None:
            self.set_loss(float(control.value))
        elif control.action == "latency" and control.value is not None:
            self.set_latency(float(control.value))
        else:
            return False
        return True

    # -- Transport --------------------------------------------------------------------------

    def connect(self, subscriptions: list[str], will: Will | None = None,
                birth: Message | None = None) -> None:
        """Delegates; ``birth`` is passed on to transports that take one (MqttTransport)."""
        if birth is None:
            self.inner.connect(subscriptions, will)
        else:
            self.inner.connect(subscriptions, will, birth=birth)

    def publish(self, topic: str, payload: bytes, retain: bool = False, reliable: bool = False) -> None:
        link = self.topics.parse_link(topic)
        if link is not None:
            dst = link[1]
            if dst in self._cut_out:
                self.fault_drops["cut_out"] += 1
                return
            if self._loss_out > 0 and self._rng.random() < self._loss_out:
                self.fault_drops["loss_out"] += 1
                return
        self.inner.publish(topic, payload, retain, reliable)

    def receive(self, timeout: float) -> list[Message]:
        """Messages that passed the faults; delayed link frames come out when due."""
        deadline = self._clock.now() + timeout
        while True:
            before = self._clock.now()
            self._admit(self.inner.receive(self._wait_budget(deadline)))
            ready = self._release_due()
            after = self._clock.now()
            # A clock that did not move (a fake one) means nobody will become due by waiting.
            if ready or after >= deadline or after == before:
                return ready

    def dropped(self) -> int:
        return self.inner.dropped()

    def close(self) -> None:
        self.inner.close()

    # -- internals --------------------------------------------------------------------------

    def _wait_budget(self, deadline: float) -> float:
        """Wait until the deadline, or less when a held frame becomes due earlier."""
        now = self._clock.now()
        wait = deadline - now
        if self._held:
            wait = min(wait, self._held[0][0] - now)
        return max(0.0, wait)

    def _admit(self, messages: list[Message]) -> None:
        now = self._clock.now()
        for msg in messages:
            link = self.topics.parse_link(msg.topic)
            if link is not None and not self._link_frame_survives(link[0]):
                continue
            due = now + self._latency if link is not None else now
            heapq.heappush(self._held, (due, next(self._seq), msg))

    def _link_frame_survives(self, src: int) -> bool:
        if src in self._cut_in:
            self.fault_drops["cut_in"] += 1
            return False
        if self._loss_in > 0 and self._rng.random() < self._loss_in:
            self.fault_drops["loss_in"] += 1
            return False
        return True

    def _release_due(self) -> list[Message]:
        now = self._clock.now()
        ready: list[Message] = []
        while self._held and self._held[0][0] <= now:
            ready.append(heapq.heappop(self._held)[2])
        return ready


def wrap_agent_transport(transport: Transport, config: AgentConfig) -> FaultyTransport:
    """The fault injector of agent ``config.id``, around the transport its runtime would use."""
    return FaultyTransport(transport, config.id, Topics(config.job),
                           np.random.default_rng([config.seed, config.id, 7]))
