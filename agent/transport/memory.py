"""A deterministic in-memory MQTT-like bus on a fake clock, with faults on command.

``MemoryBus`` is a discrete-event simulator: ``call_at`` schedules callbacks, ``publish``
schedules deliveries, ``run_until`` executes them in (time, sequence) order and moves the
``FakeClock``. A message leaves its sender through the sender's egress queue (bandwidth),
passes the broker (a shared queue with its own throughput, like one mosquitto process),
arrives after the link's latency and, with ``ingress_bandwidth``, waits for the receiver's
own downlink (a FIFO queue per client, like the simulator's per-agent proxy). Per-topic order is kept (FIFO queues, fixed latencies).

Faults: cut a link (``link/<src>/<dst>`` topics, one way or both), loss with probability p
(seeded generator; applies to link topics, like QoS 0 frames, and to each delivery of a
``fanout/<node>`` frame, with the bus-wide probability), crash (the broker
publishes the client's Last Will at once), hang (messages queue up, the Will is published
after ``will_delay`` seconds as a keepalive expiry would) and resume.

``MemoryTransport`` implements the Transport protocol on a bus; the virtual fleet uses the
bus directly (with encoded messages, as over MQTT).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agent.transport.base import Message, TransportError, Will


class FakeClock:
    """A Clock (agent/clock.py) that only moves when the bus says so."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def set(self, t: float) -> None:
        if t < self._now:
            raise ValueError(f"time cannot go back from {self._now} to {t}")
        self._now = t


def topic_matches(pattern: str, topic: str) -> bool:
    """MQTT filter matching with ``+`` and a trailing ``#``."""
    pp, tp = pattern.split("/"), topic.split("/")
    for i, part in enumerate(pp):
        if part == "#":
            return True
        if i >= len(tp) or (part != "+" and part != tp[i]):
            return False
    return len(pp) == len(tp)


Handler = Callable[[str, Any, int], None]  # (topic, payload, size)


@dataclass
class Client:
    name: str
    handler: Handler
    subscriptions: list[str] = field(default_factory=list)
    will: tuple[str, Any, bool] | None = None
    crashed: bool = False
    hung: bool = False
    isolated: bool = False  # cut off the network: nothing in or out, lost (not held)
    held: list[tuple[str, Any, int]] = field(default_factory=list)
    generation: int = 0  # bumps on crash/restart so stale deliveries are dropped


@dataclass
class BusStats:
    published: int = 0
    delivered: int = 0
    bytes: int = 0
    lost: int = 0
    cut: int = 0
    to_dead: int = 0


class MemoryBus:
    def __init__(
        self, clock: FakeClock | None = None, rng: np.random.Generator | None = None, *,
        latency: float = 0.0002, bandwidth: float | None = None,
        broker_bandwidth: float | None = None, will_delay: float = 3.0,
        ingress_bandwidth: float | None = None,
    ) -> None:
        self.clock = clock or FakeClock()
        self.rng = rng or np.random.default_rng(0)
        self.latency = latency
        self.bandwidth = bandwidth  # bytes/s out of each client (its NIC)
        self.broker_bandwidth = broker_bandwidth  # bytes/s through the broker, shared
        self.ingress_bandwidth = ingress_bandwidth  # bytes/s into each client (its downlink)
        self._ingress_free: dict[str, float] = {}
        self.will_delay = will_delay
        self.clients: dict[str, Client] = {}
        self.retained: dict[str, tuple[Any, int]] = {}
        self.stats = BusStats()
        self.cuts: set[tuple[int, int]] = set()
        self.isolated_names: set[str] = set()  # cut off the network (see isolate)
        self.loss = 0.0
        self.link_loss: dict[tuple[int, int], float] = {}
        self.link_latency: dict[tuple[int, int], float] = {}
        self.link_bandwidth: dict[tuple[int, int], float] = {}
        self._egress_free: dict[str, float] = {}
        self._link_free: dict[tuple[int, int], float] = {}
        self._broker_free = 0.0
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        self._match_cache: dict[str, list[Client]] = {}

    # ----------------------------------------------------------------- events

    def now(self) -> float:
        return self.clock.now()

    def call_at(self, t: float, fn: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (max(t, self.clock.now()), self._seq, fn))

    def next_event(self) -> float | None:
        return self._queue[0][0] if self._queue else None

    def step(self) -> bool:
        if not self._queue:
            return False
        t, _, fn = heapq.heappop(self._queue)
        self.clock.set(max(t, self.clock.now()))
        fn()
        return True

    def run_until(self, t: float, stop: Callable[[], bool] | None = None) -> None:
        """Run events up to time ``t`` (or until ``stop()`` is true); the clock ends at ``t``
        unless stopped early."""
        while self._queue and self._queue[0][0] <= t:
            self.step()
            if stop is not None and stop():
                return
        self.clock.set(max(t, self.clock.now()))

    # ----------------------------------------------------------------- clients

    def connect(self, name: str, handler: Handler, subscriptions: list[str],
                will: tuple[str, Any, bool] | None = None) -> None:
        old = self.clients.get(name)
        client = Client(name, handler, list(subscriptions), will)
        if old is not None:
            client.generation = old.generation + 1
        self.clients[name] = client
        self._match_cache.clear()
        for topic, (payload, size) in sorted(self.retained.items()):
            if any(topic_matches(s, topic) for s in client.subscriptions):
                self._schedule_delivery(client, topic, payload, size, self.clock.now() + self.latency)

    def close(self) -> None:
        """Forget the clients and the pending events: the queued deliveries hold the bus and
        the clients' handlers (their agents) in cycles, freed otherwise only at a full
        collection, which the payloads' bytes never trigger."""
        self.clients.clear()
        self._queue.clear()
        self._match_cache.clear()

    def disconnect(self, name: str) -> None:
        """A clean disconnect: the Will is NOT published."""
        client = self.clients.pop(name, None)
        if client is not None:
            client.crashed = True
            self._match_cache.clear()

    def crash(self, name: str) -> None:
        client = self.clients.get(name)
        if client is None or client.crashed:
            return
        self._drop(client)

    def hang(self, name: str) -> None:
        client = self.clients.get(name)
        if client is None or client.crashed or client.hung:
            return
        client.hung = True
        generation = client.generation

        def expire() -> None:
            if client.hung and client.generation == generation:
                self._publish_will(client)

        self.call_at(self.clock.now() + self.will_delay, expire)

    def resume(self, name: str) -> list[tuple[str, Any, int]]:
        """Un-hang; returns (and forgets) the messages that queued up meanwhile."""
        client = self.clients.get(name)
        if client is None or not client.hung:
            return []
        client.hung = False
        held, client.held = client.held, []
        return held

    def is_up(self, name: str) -> bool:
        client = self.clients.get(name)
        return client is not None and not client.crashed and not client.hung and not client.isolated

    def isolate(self, name: str, on_expiry: Callable[[], None] | None = None) -> None:
        """Cut ``name`` off the network (its packets dropped both ways): what it publishes
        and what is sent to it is lost. After ``will_delay`` the broker's keepalive expires:
        it publishes the Will and drops the connection, and ``on_expiry`` runs (the agent's
        own keepalive gives up as well)."""
        self.isolated_names.add(name)
        client = self.clients.get(name)
        if client is None or client.crashed or client.isolated:
            return
        client.isolated = True
        generation = client.generation

        def expire() -> None:
            if client.isolated and client.generation == generation and not client.crashed:
                self._drop(client)
                if on_expiry is not None:
                    on_expiry()

        self.call_at(self.clock.now() + self.will_delay, expire)

    def reachable(self, name: str) -> bool:
        """Whether ``name`` could reach the broker now (not cut off the network)."""
        return name not in self.isolated_names

    def heal_node(self, name: str) -> None:
        """The network of ``name`` is back: a connection that outlived the cut carries on."""
        self.isolated_names.discard(name)
        client = self.clients.get(name)
        if client is not None:
            client.isolated = False

    def _drop(self, client: Client) -> None:
        """The broker drops the connection (a crash, a keepalive that expired): its Will goes out."""
        client.crashed = True
        client.generation += 1
        client.held.clear()
        self._publish_will(client)

    def _publish_will(self, client: Client) -> None:
        if client.will is not None:
            topic, payload, retain = client.will
            self.publish(client.name, topic, payload, retain=retain, force=True)

    # ----------------------------------------------------------------- faults

    def cut(self, a: int, b: int, both: bool = True) -> None:
        self.cuts.add((a, b))
        if both:
            self.cuts.add((b, a))

    def heal(self, a: int, b: int, both: bool = True) -> None:
        self.cuts.discard((a, b))
        if both:
            self.cuts.discard((b, a))

    def set_loss(self, p: float, link: tuple[int, int] | None = None) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"loss probability must be in [0, 1], got {p}")
        if link is None:
            self.loss = p
        else:
            self.link_loss[link] = p

    def set_link(self, src: int, dst: int, latency: float | None = None,
                 bandwidth: float | None = None) -> None:
        if latency is not None:
            self.link_latency[(src, dst)] = latency
        if bandwidth is not None:
            self.link_bandwidth[(src, dst)] = bandwidth

    # ----------------------------------------------------------------- publish

    def publish(self, sender: str, topic: str, payload: Any, *, retain: bool = False,
                size: int | None = None, force: bool = False) -> None:
        """``force`` is for the broker's own messages (a Will of a dead client)."""
        client = self.clients.get(sender)
        if not force and (client is None or client.crashed or client.hung or client.isolated):
            self.stats.to_dead += 1
            return
        nbytes = size if size is not None else len(payload)
        self.stats.published += 1
        self.stats.bytes += nbytes
        link = self._link_of(topic)
        if link is not None:
            if link in self.cuts:
                self.stats.cut += 1
                return
            p = self.link_loss.get(link, self.loss)
            if p > 0 and self.rng.random() < p:
                self.stats.lost += 1
                return
        if retain:
            if nbytes == 0:
                self.retained.pop(topic, None)
            else:
                self.retained[topic] = (payload, nbytes)
        fanout = self.loss > 0 and "/fanout/" in topic  # one publish, a QoS 0 copy per reader
        targets = [t for t in self._subscribers(topic) if not (fanout and self._lost_copy())]
        latency = self.link_latency.get(link, self.latency) if link is not None else self.latency

        def through_broker() -> None:
            # The broker's queue takes messages as they reach it, not as they were sent: a
            # message on a slow link does not hold up the ones that came in meanwhile.
            t = self.clock.now()
            if self.broker_bandwidth:
                t = self._broker_free = max(t, self._broker_free) + nbytes / self.broker_bandwidth
            for target in targets:
                self._schedule_delivery(target, topic, payload, nbytes, t + latency)

        self.call_at(self._sent(sender, link, nbytes), through_broker)

    def _lost_copy(self) -> bool:
        if self.rng.random() < self.loss:
            self.stats.lost += 1
            return True
        return False

    def _sent(self, sender: str, link: tuple[int, int] | None, nbytes: int) -> float:
        """When the message has left its sender's egress queue and its link (FIFO each)."""
        t = self.clock.now()
        if self.bandwidth:
            t = max(t, self._egress_free.get(sender, 0.0)) + nbytes / self.bandwidth
            self._egress_free[sender] = t
        if link is not None and link in self.link_bandwidth:
            t = max(t, self._link_free.get(link, 0.0)) + nbytes / self.link_bandwidth[link]
            self._link_free[link] = t
        return t

    def _schedule_delivery(self, client: Client, topic: str, payload: Any, size: int, t: float) -> None:
        generation = client.generation
        if self.ingress_bandwidth:
            self.call_at(t, lambda: self._ingress(client, topic, payload, size, generation))
            return
        self.call_at(t, self._deliverer(client, topic, payload, size, generation))

    def _ingress(self, client: Client, topic: str, payload: Any, size: int, generation: int) -> None:
        """The receiver's downlink takes messages in the order they reach it."""
        assert self.ingress_bandwidth
        name = client.name
        done = self._ingress_free[name] = max(self.clock.now(), self._ingress_free.get(name, 0.0)) + size / self.ingress_bandwidth
        self.call_at(done, self._deliverer(client, topic, payload, size, generation))

    def _deliverer(self, client: Client, topic: str, payload: Any, size: int, generation: int) -> Callable[[], None]:
        def deliver() -> None:
            if client.crashed or client.generation != generation or self.clients.get(client.name) is not client:
                return
            if client.isolated:
                self.stats.lost += 1
                return
            if client.hung:
                client.held.append((topic, payload, size))
                return
            self.stats.delivered += 1
            client.handler(topic, payload, size)

        return deliver

    def _subscribers(self, topic: str) -> list[Client]:
        found = self._match_cache.get(topic)
        if found is None:
            found = [c for c in self.clients.values()
                     if any(topic_matches(s, topic) for s in c.subscriptions)]
            self._match_cache[topic] = found
        return [c for c in found if not c.crashed]

    @staticmethod
    def _link_of(topic: str) -> tuple[int, int] | None:
        """(src, dst) of a ``.../link/<src>/<dst>`` topic, else None."""
        if topic.startswith("link/"):
            tail = topic[5:]
        else:
            _, sep, tail = topic.rpartition("/link/")
            if not sep:
                return None
        src, _, dst = tail.partition("/")
        if not (src.isdigit() and dst.isdigit()):
            return None
        return int(src), int(dst)


class MemoryTransport:
    """The Transport protocol on a ``MemoryBus`` (one client per transport)."""

    def __init__(self, bus: MemoryBus, name: str, max_queue: int = 10000) -> None:
        self.bus, self.name, self.max_queue = bus, name, max_queue
        self._inbox: list[Message] = []
        self._dropped = 0
        self._closed = False

    def connect(self, subscriptions: list[str], will: Will | None = None) -> None:
        self._closed = False
        bus_will = (will.topic, will.payload, will.retain) if will is not None else None
        self.bus.connect(self.name, self._on_message, subscriptions, bus_will)

    def _on_message(self, topic: str, payload: Any, size: int) -> None:
        if len(self._inbox) >= self.max_queue:
            self._dropped += 1
            return
        retained = topic in self.bus.retained and self.bus.retained[topic][0] is payload
        self._inbox.append(Message(topic, bytes(payload), retained))

    def publish(self, topic: str, payload: bytes, retain: bool = False, reliable: bool = False) -> None:
        # The bus never disconnects a live client, so every message is already "reliable".
        if self._closed:
            raise TransportError(f"transport {self.name} is closed")
        self.bus.publish(self.name, topic, payload, retain=retain, size=len(payload))

    def receive(self, timeout: float) -> list[Message]:
        """Return queued messages; if there are none, run the bus up to ``timeout`` seconds
        of fake time (no sleeping) until one arrives."""
        if not self._inbox and timeout > 0:
            end = self.bus.now() + timeout
            self.bus.run_until(end, stop=lambda: bool(self._inbox))
            self.bus.run_until(self.bus.now())  # and whatever else arrives at that instant
        out, self._inbox = self._inbox, []
        return out

    def dropped(self) -> int:
        return self._dropped

    def close(self) -> None:
        self._closed = True
        self.bus.disconnect(self.name)
