"""N simulated agents running R allreduce rounds on the in-memory bus: discrete events, no sleep.

Each agent does what the real runtime does, minus the model: it computes a gradient (seeded
generator or a callback), runs the round machine of the current view, applies the result to
its state (params + momentum, SGD with momentum), keeps the previous round's machine alive for
one round, buffers frames of rounds it has not started, takes part in membership (retained
statuses, Last Wills, views from the coordinator), and (re)joins or resyncs after drift by a
state transfer from a live peer. Faults fire at a round and phase (``FaultSpec``).

``VirtualFleet(config).run()`` returns one ``RoundRecord`` per round: its duration (first
start to last result), whether any node was degraded, and every node's ``RoundResult``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Literal

import numpy as np

from agent.protocol.allreduce import (
    Action,
    AllreduceConfig,
    Note,
    RoundMachine,
    RoundResult,
    Send,
    frame_size,
    new_round,
)
from agent.protocol.membership import Membership, PublishView
from agent.protocol.messages import Status, View
from agent.protocol.state_transfer import StateTransfer, serve_model_pull, state_hash
from agent.protocol.topology import Tree
from agent.protocol.wire import Flag, Frame, Kind
from agent.transport.memory import FakeClock, MemoryBus

PULL_TRIES_PER_PEER = 2  # the runtime's PULL_ROUNDS_PER_PEER

FaultAction = Literal["cut", "heal", "loss", "crash", "hang", "resume", "restart"]
Phase = Literal["reduce", "broadcast"]
GradientFn = Callable[[int, int, np.ndarray], np.ndarray]  # (node, round, params) -> gradient


@dataclass(frozen=True)
class FaultSpec:
    """``action`` on ``node`` (and ``peer`` for links) when round ``round`` enters ``phase``
    (reduce: the round's first start; broadcast: the root's first result chunk), ``after``
    seconds later. ``value`` is the loss probability."""

    action: FaultAction
    round: int
    node: int = 0
    peer: int | None = None
    phase: Phase = "reduce"
    one_way: bool = False
    value: float = 0.0
    after: float = 0.0


@dataclass(frozen=True)
class FleetConfig:
    nodes: int = 7
    rounds: int = 5
    length: int = 1000
    arity: int = 2
    allreduce: AllreduceConfig = field(default_factory=AllreduceConfig)
    seed: int = 0
    latency: float = 0.0002
    bandwidth: float | None = None  # bytes/s out of each agent
    broker_bandwidth: float | None = None  # bytes/s through the broker (shared)
    compute_time: float = 0.0
    will_delay: float = 1.5  # a hung agent's Will fires after this (keepalive expiry)
    lr: float = 0.01
    momentum: float = 0.9
    faults: tuple[FaultSpec, ...] = ()
    gradient_fn: GradientFn | None = None
    keep_gradients: bool = False
    max_time: float = 1e6


@dataclass
class RoundRecord:
    round: int
    members: tuple[int, ...]
    start: float
    end: float
    results: dict[int, RoundResult] = field(default_factory=dict)
    gradients: dict[int, np.ndarray] = field(default_factory=dict)
    start_hashes: dict[int, int] = field(default_factory=dict)
    starts: dict[int, float] = field(default_factory=dict)  # when each node started the round
    notes: dict[int, list[Note]] = field(default_factory=dict)

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def degraded(self) -> bool:
        return any(r.degraded for r in self.results.values())


def default_gradient(seed: int, length: int) -> GradientFn:
    def gradient(node: int, round: int, params: np.ndarray) -> np.ndarray:
        rng = np.random.default_rng([seed, node, round])
        return rng.standard_normal(length, dtype=np.float32)

    return gradient


class SimAgent:
    def __init__(self, fleet: VirtualFleet, node: int, incarnation: int, state: np.ndarray) -> None:
        self.fleet, self.node, self.incarnation = fleet, node, incarnation
        cfg = fleet.config
        self.name = f"agent-{node}"
        self.state = state  # params then momentum
        self.links = cfg.allreduce.new_links()
        self.membership = Membership(node, cfg.arity, fleet.initial_view)
        self.round = -1
        self.machine: RoundMachine | None = None
        self.prev: RoundMachine | None = None
        self.prev_round = -1
        self.buffer: list[Frame] = []
        self.start_state = state.copy()
        self.deferred_pulls: list[Frame] = []
        self.transfer: StateTransfer | None = None
        self.transfer_for: int | None = None
        self.resync = False
        self.joining = False
        self.timer_gen = 0
        self.timer_at: float | None = None
        self.alive = True
        self.hung = False
        self.timer_missed = False

    # ------------------------------------------------------------------ plumbing

    @property
    def params(self) -> np.ndarray:
        return self.state[: self.fleet.config.length]

    def connect(self, joining: bool) -> None:
        will = (f"status/{self.node}", Status(self.node, "offline", incarnation=self.incarnation).encode(), True)
        self.fleet.bus.connect(self.name, self.on_message,
                               [f"link/+/{self.node}", "status/+", "view"], will)
        self.joining = joining
        self.publish_status("joining" if joining else "online")

    def publish_status(self, state: Literal["online", "joining", "offline"]) -> None:
        status = Status(self.node, state, round=max(self.round, 0), incarnation=self.incarnation)
        self.fleet.bus.publish(self.name, f"status/{self.node}", status.encode(), retain=True)

    def on_message(self, topic: str, payload: object, size: int) -> None:
        if not self.alive:
            return
        if topic.startswith("link/"):
            assert isinstance(payload, Frame)
            self.on_frame(payload)
        elif topic.startswith("status/"):
            assert isinstance(payload, bytes)
            status = Status.decode(payload)
            self.publish_views(self.membership.on_status(status, self.fleet.clock.now()))
            self.check_peer_down(status)
        elif topic == "view":
            assert isinstance(payload, bytes)
            if self.membership.on_view(View.decode(payload)):
                self.on_new_view()

    def publish_views(self, views: list[PublishView]) -> None:
        for pv in views:
            self.fleet.bus.publish(self.name, "view", pv.view.encode(), retain=True)

    def check_peer_down(self, status: Status) -> None:
        # A Will of an older life of a node that is back (ignored by membership) is no news.
        if (status.state != "offline" or status.node == self.node
                or self.membership.states.get(status.node) != "offline"):
            return
        now = self.fleet.clock.now()
        for machine in (self.machine, self.prev):
            if machine is not None:
                self.do(machine.peer_down(status.node, now))
        self.reschedule()

    def do(self, actions: Sequence[Action]) -> None:
        for action in actions:
            if isinstance(action, Send):
                self.fleet.send(self, action.dst, action.frame)
            else:
                self.fleet.note(self, action)

    # ------------------------------------------------------------------ rounds

    def start_round(self, r: int) -> None:
        if not self.alive or self.hung or r >= self.fleet.config.rounds or self.transfer is not None:
            return
        members = self.membership.members_for(r)
        if self.node not in members:
            self.round = r
            self.fleet.idle(self)
            return
        if self.resync or self.joining:
            self.begin_transfer(r, members)
            return
        self.fleet.fire_faults(r, "reduce")
        if not self.alive or self.hung:
            return
        self.prev, self.prev_round = self.machine, self.round
        self.round = r
        self.start_state = self.state.copy()
        self.publish_views(self.membership.round_started(r, self.fleet.clock.now()))
        view = self.membership.view_for(r)
        assert view is not None
        tree = Tree(tuple(view.members), view.arity)
        grad = self.fleet.gradient(self.node, r, self.params)
        now = self.fleet.clock.now()
        self.fleet.record_start(self, r, members, grad, state_hash(self.params))
        self.machine = new_round(self.fleet.config.allreduce, tree, self.node, r, grad,
                                 state_hash(self.params), self.links, now)
        self.do(self.machine.start(now))
        buffered, self.buffer = self.buffer, []
        for frame in buffered:
            self.on_frame(frame)
        self.serve_deferred()
        self.after_event()

    def on_frame(self, frame: Frame) -> None:
        now = self.fleet.clock.now()
        if frame.kind == Kind.MODEL_PULL:
            self.on_model_pull(frame)
        elif frame.kind == Kind.MODEL:
            if self.transfer is not None:
                self.do(self.transfer.on_frame(frame, now))
                self.after_transfer_event()
        elif self.machine is not None and frame.round == self.round:
            self.do(self.machine.on_frame(frame, now))
        elif self.prev is not None and frame.round == self.prev_round:
            self.do(self.prev.on_frame(frame, now))
        elif frame.round > self.round:
            self.buffer.append(frame)
        self.after_event()

    def after_event(self) -> None:
        machine = self.machine
        if machine is not None and machine.result is not None and self.fleet.record_result(self, machine.result):
            self.apply(machine.result)
            self.fleet.bus.call_at(self.fleet.clock.now() + self.fleet.config.compute_time,
                                   partial(self.start_round, self.round + 1))
        self.reschedule()

    def apply(self, result: RoundResult) -> None:
        cfg = self.fleet.config
        params, momentum = self.state[: cfg.length], self.state[cfg.length :]
        momentum *= np.float32(cfg.momentum)
        momentum += result.values
        params -= np.float32(cfg.lr) * momentum
        if any(isinstance(n, Note) and n.kind == "drift" for n in self.fleet.notes_of(self, result.round)):
            self.resync = True

    def reschedule(self) -> None:
        times = [t for m in (self.machine, self.prev) if m is not None and (t := m.next_timer()) is not None]
        if self.transfer is not None and (t := self.transfer.next_timer()) is not None:
            times.append(t)
        if not times or min(times) == self.timer_at:
            return  # nothing to wait for, or that wake-up is already booked
        self.timer_at = min(times)
        self.timer_gen += 1
        self.fleet.bus.call_at(self.timer_at, partial(self.on_timer, self.timer_gen))

    def on_timer(self, gen: int) -> None:
        if gen != self.timer_gen or not self.alive:
            return
        self.timer_at = None
        if self.hung:
            self.timer_missed = True
            return
        now = self.fleet.clock.now()
        for machine in (self.prev, self.machine):
            if machine is not None and (t := machine.next_timer()) is not None and t <= now:
                self.do(machine.on_timer(now))
        if self.transfer is not None and (t := self.transfer.next_timer()) is not None and t <= now:
            self.do(self.transfer.on_timer(now))
            self.after_transfer_event()
            self.give_up_transfer()
        self.after_event()

    # ------------------------------------------------------------------ state transfer

    def on_model_pull(self, frame: Frame) -> None:
        if self.joining or self.transfer is not None:
            return
        if frame.round > self.round:
            self.deferred_pulls.append(frame)
            return
        cfg = self.fleet.config
        self.do(serve_model_pull(frame, self.node, cfg.allreduce.job, self.start_state,
                                 max(self.round, 0), cfg.allreduce.chunk_size,
                                 state_hash(self.start_state[: cfg.length])))

    def serve_deferred(self) -> None:
        waiting, self.deferred_pulls = self.deferred_pulls, []
        for frame in waiting:
            self.on_model_pull(frame)

    def on_new_view(self) -> None:
        newest = self.membership.newest
        if self.joining and self.node in newest.members and self.transfer is None:
            self.begin_transfer(newest.from_round, tuple(newest.members))

    def begin_transfer(self, r: int, members: tuple[int, ...]) -> None:
        peers = self.membership.online_peers(members)
        if not peers:
            self.joining = self.resync = False
            self.start_round(r)
            return
        now = self.fleet.clock.now()
        cfg = self.fleet.config.allreduce
        timeout = cfg.fixed_timeout if cfg.timeout_mode == "fixed" else cfg.max_timeout
        self.transfer = StateTransfer(self.node, cfg.job, r, peers, timeout, now, size=len(self.state))
        self.transfer_for = r
        self.do(self.transfer.start(now))
        self.reschedule()

    def give_up_transfer(self) -> None:
        """As the runtime does: a resync whose peers never answer (cut links, loss) is given
        up after a few tries, and the node goes on with its own state; it never stalls."""
        transfer = self.transfer
        if transfer is None or self.joining or transfer.attempts < PULL_TRIES_PER_PEER * len(transfer.peers):
            return
        self.transfer, self.resync = None, False
        self.start_round(self.transfer_for if self.transfer_for is not None else self.round + 1)

    def after_transfer_event(self) -> None:
        if self.transfer is None or self.transfer.result is None:
            return
        r, state, _ = self.transfer.result
        self.transfer = None
        self.state = state
        self.resync = False
        if self.joining:
            self.joining = False
            self.publish_status("online")
        self.buffer = [f for f in self.buffer if f.round >= r]
        self.start_round(r)


class VirtualFleet:
    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self.clock = FakeClock()
        self.bus = MemoryBus(self.clock, np.random.default_rng([config.seed, 7]),
                             latency=config.latency, bandwidth=config.bandwidth,
                             broker_bandwidth=config.broker_bandwidth, will_delay=config.will_delay)
        self.gradient: GradientFn = config.gradient_fn or default_gradient(config.seed, config.length)
        self.initial_view = View(epoch=0, members=list(range(config.nodes)), arity=config.arity,
                                 coordinator=0, from_round=0)
        init = np.random.default_rng([config.seed, 1]).standard_normal(config.length, dtype=np.float32)
        self.initial_state = np.concatenate([init, np.zeros(config.length, dtype=np.float32)])
        self.agents: dict[int, SimAgent] = {}
        self.records: dict[int, RoundRecord] = {}
        self.fired: set[tuple[int, str]] = set()
        self.pending_faults = 0
        self.events: list[tuple[float, int, Note]] = []

    # ------------------------------------------------------------------ run

    def run(self) -> list[RoundRecord]:
        self.bus.publish("fleet", "view", self.initial_view.encode(), retain=True, force=True)
        for node in range(self.config.nodes):
            agent = SimAgent(self, node, 0, self.initial_state.copy())
            self.agents[node] = agent
            agent.connect(joining=False)
        for agent in self.agents.values():
            self.bus.call_at(0.0, partial(agent.start_round, 0))
        self.bus.run_until(self.config.max_time, stop=self.finished)
        return [self.records[r] for r in sorted(self.records)]

    def finished(self) -> bool:
        if self.pending_faults:
            return False
        last = self.config.rounds - 1
        rec = self.records.get(last)
        if rec is None:
            return False
        for node in rec.members:
            agent = self.agents.get(node)
            if agent is not None and agent.alive and not agent.hung and node not in rec.results:
                return False
        return True

    # ------------------------------------------------------------------ agents call these

    def send(self, agent: SimAgent, dst: int, frame: Frame) -> None:
        if frame.is_broadcast and frame.kind in (Kind.DATA, Kind.RELAY) and frame.flags & Flag.FINAL:
            self.fire_faults(frame.round, "broadcast")
        self.bus.publish(agent.name, f"link/{agent.node}/{dst}", frame, size=frame_size(frame))

    def note(self, agent: SimAgent, note: Note) -> None:
        self.events.append((self.clock.now(), agent.node, note))
        rec = self.records.get(agent.round)
        if rec is not None:
            rec.notes.setdefault(agent.node, []).append(note)

    def notes_of(self, agent: SimAgent, round: int) -> list[Note]:
        rec = self.records.get(round)
        return rec.notes.get(agent.node, []) if rec is not None else []

    def is_up(self, node: int) -> bool:
        agent = self.agents.get(node)
        return agent is not None and agent.alive and not agent.hung

    def idle(self, agent: SimAgent) -> None:
        """A node outside the view: nothing to do until a view names it."""

    def record_start(self, agent: SimAgent, r: int, members: tuple[int, ...], grad: np.ndarray,
                     params_hash: int) -> None:
        now = self.clock.now()
        rec = self.records.get(r)
        if rec is None:
            rec = self.records[r] = RoundRecord(r, members, now, now)
        rec.start_hashes[agent.node] = params_hash
        rec.starts[agent.node] = now
        if self.config.keep_gradients:
            rec.gradients[agent.node] = grad.copy()

    def record_result(self, agent: SimAgent, result: RoundResult) -> bool:
        """Store a node's result once; True the first time (the caller then applies it)."""
        rec = self.records[result.round]
        if agent.node in rec.results and rec.results[agent.node] is result:
            return False
        rec.results[agent.node] = result
        rec.end = max(rec.end, self.clock.now())
        return True

    # ------------------------------------------------------------------ faults

    def fire_faults(self, r: int, phase: str) -> None:
        if (r, phase) in self.fired:
            return
        self.fired.add((r, phase))
        now = self.clock.now()
        for spec in self.config.faults:
            if spec.round == r and spec.phase == phase:
                if spec.after > 0:
                    self.pending_faults += 1
                    self.bus.call_at(now + spec.after, partial(self._delayed, spec))
                else:
                    self.apply_fault(spec)

    def _delayed(self, spec: FaultSpec) -> None:
        self.pending_faults -= 1
        self.apply_fault(spec)

    def apply_fault(self, spec: FaultSpec) -> None:
        node, peer = spec.node, spec.peer
        if spec.action in ("cut", "heal"):
            if peer is None:
                raise ValueError(f"{spec.action} needs a peer")
            (self.bus.cut if spec.action == "cut" else self.bus.heal)(node, peer, not spec.one_way)
        elif spec.action == "loss":
            self.bus.set_loss(spec.value, None if peer is None else (node, peer))
        elif spec.action == "crash":
            self.crash(node)
        elif spec.action == "hang":
            self.hang(node)
        elif spec.action == "resume":
            self.resume(node)
        elif spec.action == "restart":
            self.restart(node)

    def crash(self, node: int) -> None:
        agent = self.agents.get(node)
        if agent is None or not agent.alive:
            return
        agent.alive = False
        self.bus.crash(agent.name)

    def hang(self, node: int) -> None:
        agent = self.agents.get(node)
        if agent is None or not agent.alive or agent.hung:
            return
        agent.hung = True
        self.bus.hang(agent.name)

    def resume(self, node: int) -> None:
        agent = self.agents.get(node)
        if agent is None or not agent.hung:
            return
        held = self.bus.resume(agent.name)
        agent.hung = False
        will_fired = self._status_of(node) == "offline"
        if will_fired:
            # The broker dropped us meanwhile (keepalive): reconnect, come back as a joiner.
            agent.alive = False
            self.restart(node, state=agent.state)
            return
        for topic, payload, size in held:
            agent.on_message(topic, payload, size)
        agent.on_timer(agent.timer_gen)

    def restart(self, node: int, state: np.ndarray | None = None) -> None:
        old = self.agents.get(node)
        if old is not None and old.alive:
            self.crash(node)
        incarnation = (old.incarnation + 1) if old is not None else 0
        fresh = self.initial_state.copy() if state is None else state
        agent = SimAgent(self, node, incarnation, fresh)
        agent.round = old.round if old is not None else -1
        self.agents[node] = agent
        agent.connect(joining=True)

    def _status_of(self, node: int) -> str | None:
        entry = self.bus.retained.get(f"status/{node}")
        if entry is None:
            return None
        return Status.decode(entry[0]).state


def run_fleet(nodes: int, rounds: int = 1, **options: object) -> list[RoundRecord]:
    """Shorthand: ``VirtualFleet(FleetConfig(nodes=..., rounds=..., **options)).run()``."""
    return VirtualFleet(FleetConfig(nodes=nodes, rounds=rounds, **options)).run()  # type: ignore[arg-type]


def count_problems(record: RoundRecord, chunk_size: int, atol: float = 2e-5) -> list[str]:
    """Check a round kept with ``keep_gradients``: for every node and chunk, the applied value
    is the mean over exactly the contributors its set names, and the set contains the node
    itself. Returns what is wrong (empty = nothing counted twice, nothing invented)."""
    problems: list[str] = []
    for node, result in record.results.items():
        for j, ids in enumerate(result.contributors):
            lo, hi = j * chunk_size, min((j + 1) * chunk_size, len(result.values))
            if node not in ids:
                problems.append(f"node {node} chunk {j}: own contribution missing from {sorted(ids)}")
            if not ids <= set(record.gradients):
                problems.append(f"node {node} chunk {j}: unknown contributors {sorted(ids)}")
                continue
            exact = np.mean([record.gradients[c][lo:hi].astype(np.float64) for c in sorted(ids)], axis=0)
            err = float(np.max(np.abs(result.values[lo:hi] - exact), initial=0.0))
            if err > atol:
                problems.append(f"node {node} chunk {j}: off the mean of {sorted(ids)} by {err:.3g}")
    return problems
