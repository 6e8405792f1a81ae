"""N agent cores on the in-memory bus in fake time: discrete events, no sleep, no protocol.

Every node is the agent core users run (agent/core/), configured by the agent's builder
(agent/core/config.py, with the fleet's overrides in ``fleet_overrides``); this harness only
executes its actions the way agent/runtime.py does, against the ``MemoryBus`` instead of MQTT
and a tiny model instead of a backend. Messages cross the bus encoded and reach the core as
bytes, through its own decode and checks, timed as the MQTT transport times them (a receiver's
``ingress_bandwidth``: what the coordinator picks the fleet's chunk size from). The gradient
comes from a seeded generator (or a callback), the state is params + momentum, updated by SGD
with momentum. Faults fire at a round and phase
(``FaultSpec``): link cuts and loss on the bus, crash (the broker publishes the Will), hang (the
node gets no message and no timer until it resumes; the Will fires after ``will_delay``),
resume and restart. It makes no decision of its own: rounds, membership, state transfer, timers
are the core's.

``VirtualFleet(config).run()`` returns one ``RoundRecord`` per round: its duration (first
start to last result), whether any node was degraded, and every node's ``RoundResult``.
Used by the protocol's fault-matrix and property tests and by ``edgegrove analyze fault-cost``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Literal

import numpy as np

from agent.core import (
    AgentCore,
    ApplyControl,
    ApplyUpdate,
    Channel,
    ComputeGradient,
    CoreAction,
    CoreConfig,
    Displaced,
    FleetFinished,
    LoadState,
    Publish,
    ReportRound,
    RoundReport,
    SaveCheckpoint,
)
from agent.core.config import CoreOverrides, build_core_config
from agent.core.dispatch import ActionDispatcher
from agent.core.events import Disconnected, GradientReady, MessageArrived, Reconnected, Tick
from agent.core.progress import Phase as CorePhase
from agent.protocol.allreduce import AllreduceConfig, Note, RoundResult
from agent.protocol.membership import ModelIdentity, Refusal
from agent.protocol.messages import Status, View
from agent.protocol.state_transfer import state_hash
from agent.protocol.sync_period import PeriodRule
from agent.protocol.topics import Topics
from agent.protocol.wire import Flag, Frame, Kind
from agent.transport.memory import FakeClock, MemoryBus

FaultAction = Literal["cut", "heal", "loss", "crash", "hang", "resume", "restart", "flap", "isolate", "restore"]
Phase = Literal["reduce", "broadcast"]
GradientFn = Callable[[int, int, np.ndarray], np.ndarray]  # (node, round, params) -> gradient
JOB = "virtual"
TOPICS = Topics(JOB)
RECONNECT_DELAY = 0.02  # a dropped agent's reconnect, as paho's first retry on a LAN
RECONNECT_RETRY = 1.0  # an agent cut off the network tries to reconnect this often


@dataclass(frozen=True)
class FaultSpec:
    """``action`` on ``node`` (and ``peer`` for links) when round ``round`` enters ``phase``
    (reduce: the round's first start; broadcast: the root's first result chunk), ``after``
    seconds later. ``isolate`` cuts the node off the network (its packets dropped both ways,
    the Will after ``will_delay``, then it retries its connection) until ``restore``. ``value`` is the loss probability; for ``flap``, the number of connection
    drops (one every 50 ms; the broker publishes the Will, the agent reconnects at once)."""

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
    ingress_bandwidth: float | None = None  # bytes/s into each agent (its downlink)
    compute_time: float = 0.0
    # Each gradient takes up to this much longer, at random (seeded): real agents start a round
    # each at its own moment, which is where a short connection drop splits the fleet's view.
    compute_jitter: float = 0.0
    will_delay: float = 1.5  # a hung agent's Will fires after this (keepalive expiry)
    # How long a Will waits before it changes views (the real agent: 1 s, for a broker that
    # publishes every Will as it shuts down). 0 here by default: no broker here shuts down,
    # and views then follow a crash at once; tests of short drops set it like the agent.
    offline_settle: float = 0.0
    reconnect_delay: float = RECONNECT_DELAY  # a dropped connection is back after this
    lr: float = 0.01
    momentum: float = 0.9
    faults: tuple[FaultSpec, ...] = ()
    gradient_fn: GradientFn | None = None
    keep_gradients: bool = False
    max_time: float = 1e6
    # The coordinator's choice of chunk size and broadcast from its downlink's rate (the
    # receivers' ingress_bandwidth here), as in the agent; off: as configured in every round.
    adapt_chunks: bool = True
    adapt_broadcast: bool = True
    # An agent whose core is done exits as the runtime does: its offline status (naming its
    # round) is published, its connection closed. Off: done agents stay connected, silent.
    exit_when_done: bool = False
    # Sites in contiguous blocks of ids (as broker-config/make-sites splits them), each agent
    # announcing its own: the views then hold a site-aware tree. 0: no sites.
    sites: int = 0
    site_aware: bool = True  # off: the agents keep their sites to themselves (a site-blind tree)
    # Periodic averaging: local steps per round (a gradient takes compute_time per step), and
    # with sync_auto the coordinator's pick of them (the core's; sync_every is the start).
    sync_every: int | None = None
    sync_auto: PeriodRule | None = None
    # (node, factor): that node's steps take factor x compute_time (a straggler).
    slow: tuple[tuple[int, float], ...] = ()
    # Each agent keeps its state every this many rounds, and a restart resumes from the last
    # one, as the agent does from disk. 0: a restart resumes at the round it crashed in.
    checkpoint_every: int = 0

    def site_of(self, node: int) -> str:
        if not self.sites:
            return ""
        base, extra = divmod(self.nodes, self.sites)
        big = extra * (base + 1)  # the first `extra` sites hold one agent more
        return f"s{node // (base + 1) if node < big else extra + (node - big) // base}"


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
    local_steps: dict[int, int | None] = field(default_factory=dict)  # each node's (periodic averaging)
    result_at: dict[int, float] = field(default_factory=dict)  # when each node had its result
    notes: dict[int, list[Note]] = field(default_factory=dict)
    abandoned: set[int] = field(default_factory=set)  # nodes that gave the round up
    skipped: set[int] = field(default_factory=set)  # caught up past it by a state transfer

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def degraded(self) -> bool:
        return any(r.degraded for r in self.results.values())

    @property
    def ended(self) -> set[int]:
        """Nodes that ended the round: with a result, by giving it up because the fleet's
        newer state arrived, or by catching up past it (installing a later round's state)."""
        return set(self.results) | self.abandoned | self.skipped


def default_gradient(seed: int, length: int) -> GradientFn:
    def gradient(node: int, round: int, params: np.ndarray) -> np.ndarray:
        rng = np.random.default_rng([seed, node, round])
        return rng.standard_normal(length, dtype=np.float32)

    return gradient


# Every node's model (a view must name one; the cores admit only nodes of the view's).
FLEET_MODEL = ModelIdentity("0123456789abcdef", "virtual", 0)


def fleet_overrides(config: FleetConfig) -> CoreOverrides:
    """What the fleet runs differently from the agent's defaults (agent/core/config.py), all
    of it here. Its tests run timeouts of tens of ms in fake time: the agent's 3 s state-pull
    timeout and its linger (the deadline + 1 s + 3 timeouts, for real brokers and hosts) would
    stretch every faulty scenario, so a state pull waits one timeout (fixed) or the longest
    adaptive one, and the linger one round deadline. State chunks are the round's chunks, and
    a Will changes views as the fleet's ``offline_settle`` says."""
    ar = config.allreduce
    return CoreOverrides(
        state_pull_timeout=ar.fixed_timeout if ar.timeout_mode == "fixed" else ar.max_timeout,
        linger=ar.round_deadline, state_chunk_values=ar.chunk_size, offline_settle=config.offline_settle,
        lr=config.lr, adapt_chunks=config.adapt_chunks, adapt_broadcast=config.adapt_broadcast,
        sync_every=config.sync_every, sync_auto=config.sync_auto, checkpoint_every=config.checkpoint_every,
        model=FLEET_MODEL)


def core_config(config: FleetConfig, node: int) -> CoreConfig:
    overrides = fleet_overrides(config)
    overrides["site"] = config.site_of(node) if config.site_aware else ""
    return build_core_config(node, config.allreduce, job=JOB, arity=config.arity, rounds=config.rounds,
                             state_size=2 * config.length, **overrides)


class SimAgent:
    """One node: an ``AgentCore`` whose actions are executed on the bus."""

    def __init__(self, fleet: VirtualFleet, node: int, incarnation: int, state: np.ndarray,
                 resumed_round: int | None = None, resumed_age: float = 0.0) -> None:
        self.fleet, self.node = fleet, node
        self.name = f"agent-{node}"
        self.vector = state  # the training state: params then momentum
        self.core = AgentCore(core_config(fleet.config, node), incarnation,
                              resumed_round=resumed_round, resumed_age=resumed_age, now=fleet.clock.now())
        self.alive = True
        self.hung = False
        self.checkpoint: tuple[int, np.ndarray, float] | None = None  # (round, state, written at)
        self.timer_gen = 0
        self.timer_at: float | None = None
        self.pending_compute: ComputeGradient | None = None
        self.dispatcher = ActionDispatcher(self.core, self)

    @property
    def params(self) -> np.ndarray:
        return self.vector[: self.fleet.config.length]

    def connect(self) -> None:
        will = Publish.status_of(self.core.status("offline"))
        self.fleet.bus.connect(self.name, self.on_message, self.core.subscriptions(),
                               (will.topic(TOPICS), will.payload(), will.retain))
        # The birth message, as the MQTT transport publishes it after every (re)connect.
        self.execute([Publish.status_of(self.core.status("online"))])

    # ------------------------------------------------------------------ events in

    def on_message(self, topic: str, payload: object, size: int) -> None:
        if not self.alive:
            return
        assert isinstance(payload, bytes)  # everything travels encoded, as over MQTT
        self.execute(self.core.handle(MessageArrived(topic, payload, self.fleet.arrival(size)),
                                      self.fleet.clock.now()))

    def on_timer(self, gen: int) -> None:
        if gen != self.timer_gen or not self.alive or self.hung:
            return
        self.timer_at = None
        self.execute(self.core.handle(Tick(), self.fleet.clock.now()))

    def gradient_due(self, action: ComputeGradient) -> None:
        if not self.alive:
            return
        if self.hung:
            self.pending_compute = action  # a frozen process computes when it resumes
            return
        self.fleet.fire_faults(action.round, "reduce")
        if not self.alive or self.hung:
            self.pending_compute = action if self.hung else None
            return
        grad = self.fleet.gradient(self.node, action.round, self.params)
        own_hash = state_hash(self.params)
        self.fleet.record_start(self, action, grad, own_hash)
        self.execute(self.core.handle(GradientReady(action.round, 0.0, grad, own_hash), self.fleet.clock.now()))

    # ------------------------------------------------------------------ actions out

    def execute(self, actions: list[CoreAction]) -> None:
        self.dispatcher.run(actions)
        if self.fleet.config.exit_when_done and self.core.phase is CorePhase.DONE and self.alive:
            self.exit()
            return
        self.reschedule()

    def exit(self) -> None:
        """As the runtime's shutdown: the offline status with our round, then a clean close."""
        self.fleet.publish(self, Publish.status_of(self.core.status("offline")))
        self.fleet.bus.disconnect(self.name)
        self.alive = False

    # The effects of the core's actions (agent/core/dispatch.py's Driver), on the bus.

    def publish(self, message: Publish) -> None:
        self.fleet.publish(self, message)

    def state(self) -> np.ndarray:
        return self.vector

    def compute(self, action: ComputeGradient) -> None:
        """The gradient comes after the compute time (a straggler's longer): ``gradient_due``."""
        fleet, cfg = self.fleet, self.fleet.config
        step = cfg.compute_time * dict(cfg.slow).get(self.node, 1.0)
        delay = step * (action.local_steps or 1) + cfg.compute_jitter * float(fleet.jitter.random())
        fleet.bus.call_at(fleet.clock.now() + delay, partial(self.gradient_due, action))

    def apply_update(self, action: ApplyUpdate) -> None:
        self.apply(action.values)

    def load_state(self, action: LoadState) -> None:
        self.vector = action.state.copy()
        self.fleet.record_catch_up(self, action.round)

    def save_checkpoint(self, action: SaveCheckpoint) -> None:
        self.checkpoint = (action.round, self.vector.copy(), self.fleet.clock.now())

    def apply_control(self, action: ApplyControl) -> None:
        pass  # no transport faults in here: the bus takes faults directly

    def report_round(self, action: ReportRound) -> None:
        self.fleet.record_report(self, action.report)

    def displaced(self, action: Displaced) -> None:
        raise RuntimeError(f"node {self.node} displaced: two lives of one node in the fleet")

    def refused(self, action: Refusal) -> None:
        """Another model than the fleet's (the core is done): said, as the agent exits saying it."""
        self.fleet.finished_lines[self.node] = (self.fleet.clock.now(), action.line())

    def fleet_finished(self, action: FleetFinished) -> None:
        self.fleet.finished_lines[self.node] = (self.fleet.clock.now(), action.line())

    def apply(self, values: np.ndarray) -> None:
        cfg = self.fleet.config
        params, momentum = self.vector[: cfg.length], self.vector[cfg.length :]
        momentum *= np.float32(cfg.momentum)
        momentum += values
        params -= np.float32(cfg.lr) * momentum

    def reschedule(self) -> None:
        wake = self.core.next_deadline()
        if wake is None or wake == self.timer_at:
            return  # nothing to wait for, or that wake-up is already booked
        self.timer_at = wake
        self.timer_gen += 1
        self.fleet.bus.call_at(wake, partial(self.on_timer, self.timer_gen))

    def resume(self, held: list[tuple[str, object, int]]) -> None:
        self.hung = False
        for topic, payload, size in held:
            self.on_message(topic, payload, size)
        if self.pending_compute is not None:
            action, self.pending_compute = self.pending_compute, None
            self.gradient_due(action)
        self.timer_at = None
        self.execute(self.core.handle(Tick(), self.fleet.clock.now()))


class VirtualFleet:
    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self.clock = FakeClock()
        self.bus = MemoryBus(self.clock, np.random.default_rng([config.seed, 7]),
                             latency=config.latency, bandwidth=config.bandwidth,
                             broker_bandwidth=config.broker_bandwidth, will_delay=config.will_delay,
                             ingress_bandwidth=config.ingress_bandwidth)
        self.gradient: GradientFn = config.gradient_fn or default_gradient(config.seed, config.length)
        self.jitter = np.random.default_rng([config.seed, 11])
        self.initial_view = View(epoch=0, members=list(range(config.nodes)), arity=config.arity,
                                 coordinator=0, from_round=0, fingerprint=FLEET_MODEL.fingerprint,
                                 sites=[config.site_of(n) for n in range(config.nodes)]
                                 if config.sites and config.site_aware else [])
        # Bytes of link frames between agents of two sites, by (from site, to site): what
        # crosses the sites' uplinks.
        self.cross_site: dict[tuple[str, str], int] = {}
        init = np.random.default_rng([config.seed, 1]).standard_normal(config.length, dtype=np.float32)
        self.initial_state = np.concatenate([init, np.zeros(config.length, dtype=np.float32)])
        self.agents: dict[int, SimAgent] = {}
        self.records: dict[int, RoundRecord] = {}
        self.fired: set[tuple[int, str]] = set()
        self.pending_faults = 0
        self.finished_lines: dict[int, tuple[float, str]] = {}  # node -> (when, what it said)

    # ------------------------------------------------------------------ run

    def run(self) -> list[RoundRecord]:
        self.bus.publish("fleet", TOPICS.view_of(0), self.initial_view.encode(), retain=True, force=True)
        for node in range(self.config.nodes):
            agent = SimAgent(self, node, 0, self.initial_state.copy())
            self.agents[node] = agent
            agent.connect()
        self.bus.run_until(self.config.max_time, stop=self.finished)
        return [self.records[r] for r in sorted(self.records)]

    def release(self) -> None:
        """Let a finished fleet go at once: its agents (their state and round machines) hold
        the fleet and the bus's queued closures hold the bus, cycles that Python frees only at
        a full collection (arrays' bytes never trigger one; a loop of fleets grew by GBs)."""
        self.bus.close()
        self.agents.clear()

    @property
    def cross_site_bytes(self) -> int:
        return sum(self.cross_site.values())

    def finished(self) -> bool:
        if self.pending_faults:
            return False
        rec = self.records.get(self.config.rounds - 1)
        if rec is None:
            return False
        return all(node in rec.results or node in rec.abandoned or not self.is_up(node)
                   for node in rec.members)

    def is_up(self, node: int) -> bool:
        agent = self.agents.get(node)
        return agent is not None and agent.alive and not agent.hung

    # ------------------------------------------------------------------ agents call these

    def arrival(self, size: int) -> float:
        """Seconds a message of ``size`` bytes takes to arrive through a receiver's downlink,
        first byte to last, as the MQTT transport times it (0: at once)."""
        return size / self.config.ingress_bandwidth if self.config.ingress_bandwidth else 0.0

    def publish(self, agent: SimAgent, action: Publish) -> None:
        if action.channel is Channel.LINK:
            assert action.dst is not None
            self.send(agent, action.dst, action.frame)
        elif action.channel is Channel.FANOUT:
            self.fanout(agent, action.frame)
        else:
            self._put(agent, action)

    def send(self, agent: SimAgent, dst: int, frame: Frame) -> None:
        if frame.is_broadcast and frame.kind in (Kind.DATA, Kind.RELAY) and frame.flags & Flag.FINAL:
            self.fire_faults(frame.round, "broadcast")
        self._put(agent, Publish.frame_to(agent.node, dst, frame))

    def fanout(self, agent: SimAgent, frame: Frame) -> None:
        self.fire_faults(frame.round, "broadcast")
        self._put(agent, Publish.fanout(agent.node, frame))

    def _put(self, agent: SimAgent, action: Publish) -> None:
        here = self.config.site_of(agent.node)
        if action.channel is Channel.LINK and action.dst is not None and \
                here != (there := self.config.site_of(action.dst)):
            self.cross_site[here, there] = self.cross_site.get((here, there), 0) + len(action.payload())
        self.bus.publish(agent.name, action.topic(TOPICS), action.payload(), retain=action.retain)

    def record_start(self, agent: SimAgent, action: ComputeGradient, grad: np.ndarray,
                     params_hash: int) -> None:
        now = self.clock.now()
        rec = self.records.get(action.round)
        if rec is None:
            rec = self.records[action.round] = RoundRecord(action.round, action.members, now, now)
        rec.start_hashes[agent.node] = params_hash
        rec.starts[agent.node] = now
        rec.local_steps[agent.node] = action.local_steps
        if self.config.keep_gradients:
            rec.gradients[agent.node] = grad.copy()

    def record_catch_up(self, agent: SimAgent, to_round: int) -> None:
        for r, rec in self.records.items():
            if r < to_round and agent.node in rec.members and agent.node not in rec.ended:
                rec.skipped.add(agent.node)

    def record_report(self, agent: SimAgent, report: RoundReport) -> None:
        rec = self.records.get(report.round)
        if rec is None:
            return
        rec.notes.setdefault(agent.node, []).extend(report.notes)
        if report.result is None:
            rec.abandoned.add(agent.node)
            return
        rec.results[agent.node] = report.result
        rec.result_at[agent.node] = self.clock.now()
        rec.end = max(rec.end, self.clock.now())

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
        elif spec.action == "flap":
            self.flap(node, max(1, int(spec.value)))
        elif spec.action == "isolate":
            self.isolate(node)
        elif spec.action == "restore":
            self.bus.heal_node(f"agent-{node}")

    def isolate(self, node: int) -> None:
        """Cut ``node`` off the network: the process runs on (its timers fire, it publishes
        into the void); the broker's keepalive drops it after ``will_delay`` (its Will), the
        agent notices too and retries its connection every RECONNECT_RETRY s until healed."""
        agent = self.agents.get(node)
        if agent is None or not agent.alive:
            return

        def retry() -> None:
            if not (agent.alive and self.agents.get(node) is agent):
                return
            if not self.bus.reachable(agent.name):
                self.bus.call_at(self.clock.now() + RECONNECT_RETRY, retry)
                return
            agent.connect()
            agent.execute(agent.core.handle(Reconnected(), self.clock.now()))

        def expired() -> None:
            if agent.alive and self.agents.get(node) is agent:
                agent.execute(agent.core.handle(Disconnected(), self.clock.now()))
                self.bus.call_at(self.clock.now() + RECONNECT_RETRY, retry)

        self.bus.isolate(agent.name, on_expiry=expired)

    def flap(self, node: int, times: int, every: float = 0.05) -> None:
        """The node's connection drops ``times`` times (the broker publishes its Will) and the
        agent reconnects each time, the same process going on."""
        agent = self.agents.get(node)
        if agent is None or not agent.alive:
            return

        def drop_and_reconnect() -> None:
            # As the MQTT transport tells the runtime: lost (the broker publishes the Will),
            # then back after the reconnect delay, with the birth status published again.
            if agent.alive and self.agents.get(node) is agent:
                self.bus.crash(agent.name)
                agent.execute(agent.core.handle(Disconnected(), self.clock.now()))
                self.bus.call_at(self.clock.now() + self.config.reconnect_delay, reconnect)

        def reconnect() -> None:
            if agent.alive and self.agents.get(node) is agent:
                agent.connect()
                agent.execute(agent.core.handle(Reconnected(), self.clock.now()))

        for i in range(times):
            self.pending_faults += 1
            self.bus.call_at(self.clock.now() + i * every, partial(self._flap_once, drop_and_reconnect))

    def _flap_once(self, drop: Callable[[], None]) -> None:
        self.pending_faults -= 1
        drop()

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
        if self._status_of(node) == "offline":
            # The broker dropped us meanwhile (keepalive): reconnect, come back as a joiner.
            agent.alive = False
            self.restart(node, state=agent.vector)
            return
        agent.resume(held)

    def restart(self, node: int, state: np.ndarray | None = None) -> None:
        old = self.agents.get(node)
        if old is not None and old.alive:
            self.crash(node)
        incarnation = (old.core.parts.incarnation + 1) if old is not None else 0
        fresh = self.initial_state.copy() if state is None else state
        resumed, age = (old.core.round if old is not None else 0), 0.0
        if old is not None and old.checkpoint is not None and state is None:
            resumed, saved, written = old.checkpoint
            fresh, age = saved.copy(), self.clock.now() - written
        agent = SimAgent(self, node, incarnation, fresh, resumed_round=resumed, resumed_age=age)
        self.agents[node] = agent
        agent.connect()

    def _status_of(self, node: int) -> str | None:
        entry = self.bus.retained.get(TOPICS.status(node))
        if entry is None:
            return None
        return Status.decode(entry[0]).state


def run_fleet(nodes: int, rounds: int = 1, **options: object) -> list[RoundRecord]:
    """Shorthand: ``VirtualFleet(FleetConfig(nodes=..., rounds=..., **options)).run()``."""
    return VirtualFleet(FleetConfig(nodes=nodes, rounds=rounds, **options)).run()  # type: ignore[arg-type]


def count_problems(record: RoundRecord, chunk_size: int, atol: float = 2e-5) -> list[str]:
    """Check a round kept with ``keep_gradients``: for every node and chunk, the applied value
    is the mean over exactly the contributors its set names, and the set contains the node
    itself, or is the set a contributor applied (the fleet went on without the node: it takes
    the fleet's mean as it is). Returns what is wrong (empty = nothing counted twice, nothing invented)."""
    problems: list[str] = []
    for node, result in record.results.items():
        for j, ids in enumerate(result.contributors):
            lo, hi = j * chunk_size, min((j + 1) * chunk_size, len(result.values))
            if not ids:  # skipped (the root went down): nothing may be applied
                if np.any(result.values[lo:hi] != 0):
                    problems.append(f"node {node} chunk {j}: skipped but values applied")
                continue
            if node not in ids and not any(
                    m in record.results and record.results[m].contributors[j] == ids for m in ids):
                # Without us, only as the fleet's mean (the root's set: it routed around us).
                problems.append(f"node {node} chunk {j}: own contribution missing from {sorted(ids)}")
            if not ids <= set(record.gradients):
                problems.append(f"node {node} chunk {j}: unknown contributors {sorted(ids)}")
                continue
            exact = np.mean([record.gradients[c][lo:hi].astype(np.float64) for c in sorted(ids)], axis=0)
            err = float(np.max(np.abs(result.values[lo:hi] - exact), initial=0.0))
            if err > atol:
                problems.append(f"node {node} chunk {j}: off the mean of {sorted(ids)} by {err:.3g}")
    return problems
