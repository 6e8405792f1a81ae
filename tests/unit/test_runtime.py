"""The runtime (the IO shell) on the in-memory bus, in fake time: start-up gating, the Last
Will's incarnation, a joiner pulling the fleet's state, a resync after a local fallback.

Peers are scripted bus clients (a coordinator built on the pure Membership, a state server
built on serve_model_pull); one runtime runs for real, single-threaded, with a tiny backend.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from agent import checkpoint
from agent.config import AgentConfig
from agent.core.events import (
    Arriving,
    CoreEvent,
    Disconnected,
    GradientReady,
    MessageArrived,
    Reconnected,
    Sending,
    Tick,
)
from agent.protocol.membership import Membership, ModelIdentity
from agent.protocol.messages import StateDigest, Status, Suspect, Telemetry, View
from agent.protocol.state_transfer import (
    STATE_CHUNK_VALUES,
    serve_model_pull,
    state_digest,
    state_hash,
)
from agent.protocol.topics import Topics
from agent.protocol.wire import Frame, Kind, decode, encode, job_hash
from agent.runtime import AgentRuntime, RoundReport, event_of, new_incarnation
from agent.transport.base import Message, Notice, Will
from agent.transport.memory import MemoryBus, MemoryTransport

JOB = "unit"
TOPICS = Topics(JOB)
SIZE = 8
MODEL = ModelIdentity("0123456789abcdef", "tiny", SIZE)  # a view must name its fleet's model


class BusTransport(MemoryTransport):
    """MemoryTransport plus the birth message of the Transport protocol."""

    def connect(self, subscriptions: list[str], will: Will | None = None,
                birth: Message | None = None) -> None:
        super().connect(subscriptions, will)
        if birth is not None:
            self.publish(birth.topic, birth.payload, retain=birth.retained)


class TinyBackend:
    """A 'model' of SIZE floats; the gradient is all ones."""

    def __init__(self) -> None:
        self.values = np.zeros(SIZE, np.float32)
        self.rates: list[float] = []  # set before each apply

    def state(self) -> np.ndarray:
        return self.values.copy()

    def load_state(self, state: np.ndarray) -> None:
        self.values = np.asarray(state, np.float32).copy()

    def model_hash(self) -> int:
        return state_hash(self.values)

    def gradients(self, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        return 1.0, np.ones(SIZE, np.float32)

    def apply(self, values: np.ndarray) -> None:
        self.values = self.values - values

    def set_learning_rate(self, lr: float) -> None:
        self.rates.append(lr)

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        return 0.0, 1.0

    def accuracy(self, x: np.ndarray, y: np.ndarray) -> float:
        return 1.0


@dataclass
class Peer:
    """A scripted member: records what reaches it, serves ``state`` labelled ``round`` (and
    announces its digest)."""

    bus: MemoryBus
    node: int
    state: np.ndarray
    round: int
    membership: Membership | None = None
    pulls: list[Frame] = field(default_factory=list)
    views: list[View] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.name = f"peer-{self.node}"
        self.bus.connect(self.name, self.on_message,
                         [TOPICS.links_to(self.node), TOPICS.all_status(), TOPICS.all_suspect()])
        self.publish(TOPICS.status(self.node), Status(self.node, "online", round=self.round, fingerprint=MODEL.fingerprint).encode(), True)

    def publish(self, topic: str, payload: bytes, retain: bool = False) -> None:
        self.bus.publish(self.name, topic, payload, retain=retain, size=len(payload))

    def on_message(self, topic: str, payload: Any, size: int) -> None:
        if TOPICS.parse_suspect(topic) is not None and Suspect.decode(payload).peer == self.node:
            # Alive (it just never takes part in a round): it refutes, as an agent does.
            self.publish(TOPICS.status(self.node), Status(self.node, "online", round=self.round, fingerprint=MODEL.fingerprint).encode(), True)
        if TOPICS.parse_status(topic) is not None and self.membership is not None:
            for out in self.membership.on_status(Status.decode(payload), self.bus.now()):
                self.views.append(out.view)
                self.publish(TOPICS.view_of(self.node), out.view.encode(), retain=True)
        link = TOPICS.parse_link(topic)
        frame = decode(payload, expected_sender=link[0], job=job_hash(JOB, MODEL.fingerprint)) if link else None
        if isinstance(frame, Frame) and frame.kind == Kind.MODEL_PULL:
            self.pulls.append(frame)
            # As a member does: the digest of the state it serves, then the state.
            digest = StateDigest(self.node, self.round, state_digest(self.state))
            self.publish(TOPICS.state(self.node), digest.encode(), retain=True)
            for send in serve_model_pull(frame, self.node, job_hash(JOB, MODEL.fingerprint), self.state, self.round,
                                         STATE_CHUNK_VALUES):
                self.publish(TOPICS.link(self.node, send.dst), encode(send.frame))


def runtime(bus: MemoryBus, node: int, **options: Any) -> AgentRuntime:
    config = AgentConfig(**{"id": node, "job": JOB, "telemetry": False, "eval_every": 0, "timeout_mode": "fixed",
                            "timeout": 0.2, "round_deadline": 2.0, **options})
    batch = (np.zeros((1, 1), np.float32), np.zeros(1, np.int64))
    return AgentRuntime(config, TinyBackend(), itertools.repeat(batch), batch,
                        BusTransport(bus, f"agent-{node}"), clock=bus.clock, model=MODEL)


def retained_status(bus: MemoryBus, node: int) -> Status:
    return Status.decode(bus.retained[TOPICS.status(node)][0])


def test_the_first_view_waits_for_the_expected_members_then_the_grace() -> None:
    bus = MemoryBus(will_delay=1.0)
    agent = runtime(bus, 0, fleet_size=3, join_grace=5.0, rounds=2)
    assert agent.run() == 0
    view = View.decode(bus.retained[TOPICS.view_of(0)][0])
    assert view.members == [0] and view.from_round == 0 and view.epoch == 1
    assert agent.round == 2 and agent.backend.values.tolist() == [-2.0] * SIZE
    # Alone, 2 of the 3 expected missing: the coordinator published only after the grace.
    assert bus.clock.now() >= 5.0


def test_a_linear_schedule_sets_each_rounds_rate_before_it_is_applied() -> None:
    bus = MemoryBus(will_delay=1.0)
    agent = runtime(bus, 0, fleet_size=1, rounds=5, lr=0.01, lr_schedule="linear", lr_final=0.2)
    assert agent.run() == 0
    assert agent.backend.rates == pytest.approx([0.01, 0.008, 0.006, 0.004, 0.002])


def test_the_last_will_carries_the_incarnation_which_grows_across_restarts() -> None:
    bus = MemoryBus()
    first = runtime(bus, 3, rounds=1)
    first._connect()
    will = bus.clients["agent-3"].will
    assert will is not None and will[0] == TOPICS.status(3)
    last_word = Status.decode(will[1])
    assert last_word.state == "offline" and last_word.incarnation == first.incarnation > 0
    bus.crash("agent-3")
    bus.run_until(bus.now() + 1.0)
    restarted = runtime(bus, 3, rounds=1)
    assert restarted.incarnation > first.incarnation
    restarted._connect()
    assert retained_status(bus, 3).state == "online"
    # The old life's Will, delivered late (a keepalive expiry), must not take the new one offline.
    bus.publish("broker", TOPICS.status(3), will[1], retain=True, force=True)
    bus.run_until(bus.now() + 1.0)
    restarted._pump(0.0)
    assert restarted.core.parts.membership.is_online(3)
    assert new_incarnation() > restarted.incarnation


def test_a_joiner_pulls_the_fleets_state_before_it_contributes() -> None:
    bus = MemoryBus()
    fleet_view = View(epoch=3, members=[0, 1], arity=2, coordinator=0, from_round=10,
                      fingerprint=MODEL.fingerprint)
    bus.publish("fleet", TOPICS.view_of(0), fleet_view.encode(), retain=True, force=True)
    fleet_state = np.arange(SIZE, dtype=np.float32)
    coordinator = Membership(0, 2, fleet_view, identity=MODEL)
    coordinator.round_started(10, 0.0)
    peers = [Peer(bus, 0, fleet_state, 12, coordinator), Peer(bus, 1, fleet_state, 12)]
    for p in peers:
        coordinator.on_status(Status(p.node, "online", fingerprint=MODEL.fingerprint), 0.0)
    joiner = runtime(bus, 2, rounds=0, fleet_size=3)
    joiner.should_stop = lambda: joiner.round >= 12 and not joiner.core.progress.joining
    joiner.run()
    assert [v.members for v in peers[0].views] == [[0, 1, 2]] and peers[0].views[0].from_round == 12
    pulls = peers[0].pulls + peers[1].pulls
    assert len(pulls) == 1 and pulls[0].round == 12  # the view's first round
    assert joiner.round == 12 and joiner.backend.values.tolist() == fleet_state.tolist()
    assert retained_status(bus, 2).incarnation == joiner.incarnation


def test_a_round_that_fell_back_to_the_own_gradient_resyncs_the_next_round() -> None:
    bus = MemoryBus()
    fleet_state = np.full(SIZE, 5.0, np.float32)
    silent_root = Peer(bus, 0, fleet_state, 1)  # never takes part in a round, serves its state
    bus.publish("fleet", TOPICS.view_of(0), View(1, [0, 1], 2, 0, 0, fingerprint=MODEL.fingerprint).encode(),
                retain=True, force=True)
    reports: list[RoundReport] = []
    agent = runtime(bus, 1, rounds=2, fleet_size=2)
    agent.on_round = reports.append
    agent.run()
    assert [r.round for r in reports] == [0, 1] and reports[0].result.missing_chunks
    assert [n.kind for n in reports[0].notes if n.kind in ("drift", "resync")] == ["drift"]
    assert [p.round for p in silent_root.pulls] == [1]  # the state for the NEXT round
    assert "resync" in [n.kind for n in reports[1].notes]
    # Round 1 started from the fleet's state; its (fallen back) update applied on top.
    assert agent.backend.values.tolist() == (fleet_state - reports[1].result.values).tolist()



def test_the_last_checkpoint_is_on_disk_before_the_last_round_is_reported(tmp_path: Any) -> None:
    # Checkpoints are written on a thread; the run's last one is waited for (the operator,
    # and a test, may read it as soon as the last round is reported).
    bus = MemoryBus(will_delay=1.0)
    agent = runtime(bus, 0, fleet_size=1, rounds=3, checkpoint_every=100, checkpoint_dir=tmp_path)
    seen: list[int | None] = []

    def at_report(report: RoundReport) -> None:
        saved = checkpoint.load(tmp_path) if report.round == 2 else None
        seen.append(saved.round if saved is not None else None)

    agent.on_round = at_report
    assert agent.run() == 0
    assert seen == [None, None, 3]  # nothing at rounds 0 and 1 (every 100), the last at once


class _StepClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t


class _Arrivals:
    """A transport whose messages arrive at set times (receive waits up to ``timeout``)."""

    def __init__(self, clock: _StepClock, arrivals: list[tuple[float, str]]) -> None:
        self.clock, self.arrivals, self.receives = clock, sorted(arrivals), 0

    def receive(self, timeout: float) -> list[Message]:
        self.receives += 1
        if not any(t <= self.clock.t for t, _ in self.arrivals) and timeout > 0:
            upcoming = [t for t, _ in self.arrivals if t <= self.clock.t + timeout]
            self.clock.t = min(upcoming) if upcoming else self.clock.t + timeout
        out = [Message(topic, b"") for t, topic in self.arrivals if t <= self.clock.t]
        self.arrivals = [(t, topic) for t, topic in self.arrivals if t > self.clock.t]
        return out


class _RecordingCore:
    """Stands in for the core: records what the loop hands it; some messages take long."""

    def __init__(self, clock: _StepClock, busy: dict[str, float]) -> None:
        self.clock, self.busy, self.log = clock, busy, []

    def handle(self, event: CoreEvent, now: float) -> list[Any]:
        if isinstance(event, Tick):
            self.log.append("tick")
        elif isinstance(event, MessageArrived):
            self.log.append(event.topic)
            self.clock.t += self.busy.get(event.topic, 0.0)  # e.g. the round it ends is evaluated
        return []


def _loop_with(arrivals: list[tuple[float, str]], busy: dict[str, float]) -> tuple[AgentRuntime, _RecordingCore, _Arrivals]:
    rt = runtime(MemoryBus(), 0)
    clock = _StepClock()
    core, transport = _RecordingCore(clock, busy), _Arrivals(clock, arrivals)
    rt.clock, rt.core, rt.transport, rt.read_at = clock, core, transport, 0.0  # type: ignore[assignment]
    return rt, core, transport


def test_after_a_long_stretch_without_reading_the_loop_hears_what_came_before_any_timer_runs() -> None:
    # The last broadcast chunk ends the round, whose evaluation takes 1 s; a peer's ACK came
    # meanwhile. Judged before it is read, the peer would look silent (a false report).
    rt, core, _ = _loop_with([(0.0, "last-chunk"), (0.5, "ack")], busy={"last-chunk": 1.0})
    rt._pump(0.05)
    assert core.log == ["last-chunk", "ack", "tick"]


def test_a_quick_pump_runs_the_timers_right_after_its_messages() -> None:
    rt, core, transport = _loop_with([(0.0, "ack"), (0.01, "later")], busy={})
    rt._pump(0.05)
    assert core.log == ["ack", "tick"] and transport.receives == 1


def test_while_it_evaluates_the_test_set_the_agent_still_hears_its_peers_but_runs_no_timer() -> None:
    rt, core, _ = _loop_with([(0.1, "report-that-we-are-silent")], busy={})

    def accuracy(x: np.ndarray, y: np.ndarray) -> float:
        core.log.append("eval")
        core.clock.t += 0.3  # a Pi's thousand images
        return 1.0

    rt.backend.accuracy = accuracy  # type: ignore[method-assign]
    rt.test_set = (np.zeros((2500, 784), np.uint8), np.zeros(2500, np.int64))
    assert rt._evaluate() == 1.0
    # Answered after the first slice (a refutation goes out), not 0.9 s later; no verdict of
    # ours on a peer is taken while we were the one not listening.
    assert core.log == ["eval", "report-that-we-are-silent", "eval", "eval"]


def test_the_telemetry_says_on_the_wall_clock_when_the_rounds_allreduce_ended() -> None:
    # The core's clock is monotonic (here: the bus's fake one); agents of one host line up by
    # the wall clock, so the runtime converts (bench round-profile's time after the last gradient).
    bus = MemoryBus(will_delay=1.0)
    started = time.time()
    agent = runtime(bus, 0, fleet_size=1, rounds=2, telemetry=True)
    ends: list[float] = []
    agent.on_round = lambda report: ends.append(report.ended_at)
    reports: list[Telemetry] = []
    bus.connect("collector", lambda topic, payload, size: reports.append(Telemetry.decode(payload)),
                [TOPICS.telemetry(0)])
    assert agent.run() == 0
    assert [t.round for t in reports] == [0, 1] and all(e > 0 for e in ends)
    for tel in reports:
        assert started <= tel.reduced_at <= tel.wall_time <= time.time()
        # What the process costs its device, read from the OS by the runtime (Linux: statm).
        assert tel.rss_bytes > 1_000_000 and tel.cpu_percent is not None and tel.cpu_percent >= 0


def test_the_transports_notices_reach_the_core_as_typed_events() -> None:
    assert event_of(Message("t/1", b"x", arrival=0.5)) == MessageArrived("t/1", b"x", 0.5)
    assert event_of(Message.of_notice(Notice.RECONNECTED)) == Reconnected()
    assert event_of(Message.of_notice(Notice.DISCONNECTED)) == Disconnected()
    assert event_of(Message.of_notice(Notice.ARRIVING, "t/2")) == Arriving("t/2")
    assert event_of(Message.of_notice(Notice.SENDING)) == Sending()


class TinyModelBackend(TinyBackend):
    """TinyBackend with the parameter access periodic averaging needs (its state is its values)."""

    name = "tiny"

    def params(self) -> np.ndarray:
        return self.values.copy()

    def set_params(self, flat: np.ndarray) -> None:
        self.values = np.asarray(flat, np.float32).copy()


@pytest.mark.parametrize(("outer", "expected"), [("avg", -6.0), ("nesterov", -0.7 * 3 * (1.9 + 2.71))])
def test_with_sync_every_a_round_averages_the_delta_of_that_many_local_steps(outer: str, expected: float) -> None:
    bus = MemoryBus(will_delay=1.0)
    config = AgentConfig(id=0, job=JOB, telemetry=False, eval_every=0, timeout_mode="fixed", timeout=0.2,
                         round_deadline=2.0, fleet_size=1, rounds=2, batch=10, sync_every=3,
                         outer_optimizer=outer)  # type: ignore[arg-type]
    batch = (np.zeros((1, 1), np.float32), np.zeros(1, np.int64))
    agent = AgentRuntime(config, TinyModelBackend(), itertools.repeat(batch), batch,
                         BusTransport(bus, "agent-0"), clock=bus.clock, model=MODEL)
    reports: list[RoundReport] = []
    agent.on_round = reports.append
    assert agent.run() == 0
    # Alone, each round's mean is its own delta: 3 steps of the all-ones gradient.
    assert [r.result.values.tolist() for r in reports if r.result] == [[3.0] * SIZE] * 2
    assert [(r.local_steps, r.samples) for r in reports] == [(3, 30), (3, 30)]
    assert agent.backend.params().tolist() == pytest.approx([expected] * SIZE)
    assert agent.backend.state().size == SIZE * (2 if outer == "nesterov" else 1)
    # The state a joiner pulls is the trainer's (anchor + outer momentum), not the inner backend's.
    assert agent.core.parts.config.state_size == agent.backend.state().size


def test_between_local_steps_the_agent_still_hears_its_peers_and_starts_no_round() -> None:
    from agent.core.actions import ComputeGradient
    from agent.model.periodic import OuterConfig, PeriodicTrainer

    rt, core, _ = _loop_with([(0.1, "report-that-we-are-silent")], busy={})

    class SlowSteps(TinyBackend):
        name = "slow-steps"

        def gradients(self, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
            core.log.append("step")
            core.clock.t += 0.3  # a Pi's local step
            return super().gradients(x, y)

        def params(self) -> np.ndarray:
            return self.values.copy()

        def set_params(self, flat: np.ndarray) -> None:
            self.values = np.asarray(flat, np.float32).copy()

    rt.backend = PeriodicTrainer(SlowSteps(), OuterConfig())  # type: ignore[arg-type]
    recorded = core.handle

    def handle(event: CoreEvent, now: float) -> list[Any]:
        out = recorded(event, now)
        if isinstance(event, GradientReady):
            core.log.append(f"ready-{event.round}")
        # What the core decides meanwhile (here: the next round, one step) waits for these steps.
        return [ComputeGradient(1, (0,), local_steps=1)] if isinstance(event, MessageArrived) else out

    core.handle = handle  # type: ignore[method-assign]
    rt._execute([ComputeGradient(0, (0,), local_steps=3)])
    # Heard after the first step (a refutation goes out), not after all three; the next
    # round's step after this round's, never inside it.
    assert core.log == ["step", "report-that-we-are-silent", "step", "step", "ready-0", "step", "ready-1"]
    assert not rt.computing and not rt.deferred
