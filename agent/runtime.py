"""The one loop: model + protocol + transport + clock.

Everything the loop decides is delegated to the pure core (agent/protocol): the round state
machine, membership (views, start-up gating, incarnations), state transfer. The loop only
computes gradients, moves bytes and time, and reports. Paho's thread never runs any of this: the transport hands messages over a
bounded queue that ``receive`` drains.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agent import checkpoint
from agent.clock import Clock, MonotonicClock
from agent.config import AgentConfig
from agent.model.data import to_float_pixels
from agent.model.optim import scheduled_lr
from agent.protocol.allreduce import (
    AllreduceConfig,
    LinkEstimators,
    Note,
    RoundResult,
    Send,
    new_round,
)
from agent.protocol.membership import Membership, PublishView, StartupGate
from agent.protocol.messages import Control, MessageError, NodeState, Status, Telemetry, View
from agent.protocol.state_transfer import (
    STATE_CHUNK_VALUES,
    StateTransfer,
    resync_reason,
    serve_model_pull,
)
from agent.protocol.topics import Topics
from agent.protocol.topology import Tree
from agent.protocol.wire import (
    DType,
    Frame,
    Kind,
    Rejection,
    RejectReason,
    decode,
    encode,
    job_hash,
)
from agent.transport.base import Message, Transport, TransportError, Will

log = logging.getLogger("edgegrove.agent")

_WIRE_DTYPES = {"float32": DType.F32, "float16": DType.F16, "int8": DType.I8}
# Frames of rounds not yet started are kept (bounded) until the round starts.
FUTURE_ROUNDS = 2
MAX_BUFFERED_FRAMES = 4096
POLL_SECONDS = 0.05
EVAL_CHUNK = 1000
STATE_PULL_TIMEOUT = 3.0  # a peer silent this long: ask the next one
PULL_ROUNDS_PER_PEER = 2  # then give the transfer up (a new one starts when still needed)


@dataclass
class RoundReport:
    round: int
    epoch: int
    loss: float
    result: RoundResult
    phase_seconds: dict[str, float]
    notes: list[Note]
    accuracy: float | None = None
    bytes_sent: int = 0
    bytes_received: int = 0


@dataclass
class _Counters:
    bytes_sent: int = 0
    bytes_received: int = 0
    rejected: Counter[str] = field(default_factory=Counter)


_last_incarnation = 0


def new_incarnation() -> int:
    """Wall-clock milliseconds, strictly growing within this process too: a restarted agent
    outranks its predecessor, so the late Will of the old life does not take the new one
    offline (membership ignores statuses of older incarnations)."""
    global _last_incarnation
    _last_incarnation = max(time.time_ns() // 1_000_000, _last_incarnation + 1)
    return _last_incarnation


def allreduce_config(config: AgentConfig) -> AllreduceConfig:
    return AllreduceConfig(
        job=job_hash(config.job),
        algorithm=config.algorithm,
        chunk_size=config.chunk_size,
        wire_dtype=_WIRE_DTYPES[config.wire_dtype],
        timeout_mode=config.timeout_mode,
        fixed_timeout=config.timeout,
        min_timeout=config.min_timeout,
        max_timeout=config.max_timeout,
        initial_timeout=config.timeout,
        round_deadline=config.round_deadline,
        remember_dead_links=config.remember_dead_links,
    )


class AgentRuntime:
    """One agent. ``batches`` yields (x, y); ``test_set`` is (x, y) for evaluation."""

    def __init__(
        self,
        config: AgentConfig,
        backend: Any,
        batches: Iterator[tuple[np.ndarray, np.ndarray]],
        test_set: tuple[np.ndarray, np.ndarray],
        transport: Transport,
        clock: Clock | None = None,
        should_stop: Callable[[], bool] = lambda: False,
        on_round: Callable[[RoundReport], None] | None = None,
    ) -> None:
        self.config = config
        self.backend = backend
        self.batches = batches
        self.test_set = test_set
        self.transport = transport
        self.clock = clock or MonotonicClock()
        self.should_stop = should_stop
        self.on_round = on_round
        self.topics = Topics(config.job)
        self.job = job_hash(config.job)
        self.id = config.id
        self.ar_config = allreduce_config(config)
        self.links: LinkEstimators = self.ar_config.new_links()
        self.membership = Membership(config.id, config.arity, gate=StartupGate(
            config.expected_members, config.join_grace, self.clock.now()))
        self.round = 0
        self.joining = False
        self.machine: Any = None
        self.previous: Any = None
        self.future: list[Frame] = []
        self.counters = _Counters()
        self.transfer: StateTransfer | None = None
        self.received_state: tuple[int, np.ndarray] | None = None  # (round, state) fetched
        self.pending_pulls: dict[int, Frame] = {}  # puller -> its MODEL_PULL
        self.notes: list[Note] = []
        self.incarnation = new_incarnation()

    # -- life cycle -------------------------------------------------------------------------

    def run(self) -> int:
        self._connect()
        try:
            while not self.should_stop() and not self._done():
                self._install_fleet_state()
                view = self._await_view()
                if view is None:
                    break
                self._run_round(view)
            if self._done():
                self._linger()
        finally:
            self._shutdown()
        return 0

    def _install_fleet_state(self) -> None:
        """Between rounds: a state fetched because we fell behind replaces ours, and we
        continue at the fleet's round."""
        if self.joining or self.received_state is None or self.received_state[0] < self.round:
            return
        rnd, state = self.received_state
        self.received_state = None
        self.backend.load_state(state)
        log.info("caught up: state of round %d (was at %d)", rnd, self.round)
        self.notes.append(Note("resync", None, f"caught up from round {self.round} to {rnd}"))
        self.round = rnd
        self.future = [f for f in self.future if f.round >= rnd]

    def _await_final_state(self) -> None:
        """The last round fell back to our own gradient: there is no next round to resync in,
        so wait (bounded) for the fleet's final state, which lingering peers serve."""
        until = self.clock.now() + self.config.round_deadline
        while self.transfer is not None and self.clock.now() < until and not self.should_stop():
            self._pump(POLL_SECONDS)
        self._install_fleet_state()

    def _linger(self) -> None:
        """After the last round, keep answering pulls and NACKs for a while: a peer whose
        broadcast got lost must not find the fleet gone and end its last round degraded."""
        # Long enough for a peer whose last round ran to its deadline to fetch our state.
        until = self.clock.now() + self.config.round_deadline + 1.0 + 3 * self.config.timeout
        while self.clock.now() < until and not self.should_stop():
            self._pump(POLL_SECONDS)

    def _done(self) -> bool:
        return self.config.rounds > 0 and self.round >= self.config.rounds

    def _status(self, state: NodeState) -> Status:
        return Status(node=self.id, state=state, round=self.round, pid=os.getpid(),
                      incarnation=self.incarnation)

    def _connect(self) -> None:
        subscriptions = [self.topics.links_to(self.id), self.topics.all_status(),
                         self.topics.view, self.topics.control]
        resumed = self._resume()
        # The Will carries our incarnation: it must take THIS life offline, and, arriving
        # late, never a later one.
        will = Will(self.topics.status(self.id), self._status("offline").encode())
        # Our own retained status comes back after every retained message we subscribed to:
        # once it does we know whether a view (a running fleet) exists.
        birth = Message(self.topics.status(self.id), self._status("online").encode(), retained=True)
        self.transport.connect(subscriptions, will, birth)
        deadline = self.clock.now() + 10.0
        while (not self.membership.knows_incarnation(self.id, self.incarnation)
               and self.clock.now() < deadline):
            self._pump(0.1)
        latest = self.membership.latest
        fresh_fleet = latest is None or (
            self.id in latest.members and latest.from_round == self.round == 0 and not resumed)
        if not fresh_fleet:
            self.joining = True
            self._publish(self.topics.status(self.id), self._status("joining").encode(), retain=True)
            log.info("a fleet is running (view epoch %d): joining it", latest.epoch if latest else 0)

    def _resume(self) -> bool:
        if self.config.checkpoint_dir is None:
            return False
        saved = checkpoint.load(self.config.checkpoint_dir)
        if saved is None:
            return False
        self.backend.load_state(saved.state)
        self.round = saved.round
        log.info("resumed from checkpoint at round %d", saved.round)
        return True

    def _shutdown(self) -> None:
        self._publish(self.topics.status(self.id), self._status("offline").encode(), retain=True)
        self.transport.close()

    # -- membership ---------------------------------------------------------------------------

    def _await_view(self) -> View | None:
        """Block (pumping messages) until a view that includes us applies to our round."""
        while not self.should_stop():
            self._publish_views(self.membership.round_started(self.round, self.clock.now()))
            latest = self.membership.latest
            if self.joining and latest is not None and self.id in latest.members:
                if self.received_state is None:
                    self.round = max(self.round, latest.from_round)
                if not self._ensure_state():
                    continue
            view = self.membership.view_for(self.round)
            if view is not None and self.id in view.members and not self.joining:
                return view
            self._pump(POLL_SECONDS)
        return None

    def _publish_views(self, views: list[PublishView]) -> None:
        for publish in views:
            view = publish.view
            log.info("coordinator: view epoch %d members %s from round %d",
                     view.epoch, view.members, view.from_round)
            self._publish(self.topics.view, view.encode(), retain=True)

    def _ensure_state(self) -> bool:
        """A joiner pulls the fleet's state for its first round; True once installed."""
        if self.received_state is not None:
            rnd, state = self.received_state
            self.received_state = None
            if rnd >= self.round:
                self.backend.load_state(state)
                self.round = rnd
                self.joining = False
                self._publish(self.topics.status(self.id), self._status("online").encode(), retain=True)
                self.notes.append(Note("rejoin", None, f"state of round {rnd}"))
                log.info("joined with the fleet's state at round %d", rnd)
                return True
        peers = self.membership.online_peers(self.membership.live())
        if peers and (self.transfer is None or not set(self.transfer.peers) & set(peers)):
            self.transfer = None  # its peers are all gone: ask the live ones
            self._fetch_state(self.round, peers)
        self._pump(POLL_SECONDS)
        return False

    # -- one round ----------------------------------------------------------------------------

    def _run_round(self, view: View) -> None:
        tree = Tree.of(view.members, view.arity)
        t0 = self.clock.now()
        self._serve_pulls()
        x, y = next(self.batches)
        loss, grad = self.backend.gradients(x, y)
        t1 = self.clock.now()
        own_hash = self.backend.model_hash()
        self.previous, self.machine = self.machine, new_round(
            self.ar_config, tree, self.id, self.round, grad, own_hash, self.links, t1)
        sent_before, received_before = self.counters.bytes_sent, self.counters.bytes_received
        self._execute(self.machine.start(t1))
        for frame in self._take_future():
            self._execute(self.machine.on_frame(frame, self.clock.now()))
        while self.machine.result is None:
            if self.should_stop():
                return
            if self.received_state is not None and self.received_state[0] > self.round:
                self.notes.append(Note("abandoned", None, f"the fleet is at round {self.received_state[0]}"))
                self._report_abandoned(view, float(loss), t0)
                self.machine = None  # given up: its timers must not pull or retry for it any more
                return
            self._tick()
        result: RoundResult = self.machine.result
        t2 = self.clock.now()
        self._finish_round(result, own_hash)
        t3 = self.clock.now()
        report = RoundReport(
            round=self.round, epoch=view.epoch, loss=float(loss), result=result,
            phase_seconds={"compute": t1 - t0, "allreduce": t2 - t1, "apply": t3 - t2, "total": t3 - t0},
            notes=self.notes, bytes_sent=self.counters.bytes_sent - sent_before,
            bytes_received=self.counters.bytes_received - received_before,
        )
        self.notes = []
        self.round += 1
        if self._done() and self.transfer is not None:
            self._await_final_state()
        report.accuracy = self._maybe_evaluate()
        self._maybe_checkpoint(view)
        self._report(report, view)

    def _report_abandoned(self, view: View, loss: float, started: float) -> None:
        """A round given up because the fleet is ahead is still reported (degraded, nothing
        applied): the dashboard and the report must see it, not a gap."""
        if self.config.telemetry:
            telemetry = Telemetry(
                node=self.id, round=self.round, epoch=view.epoch, algorithm=self.config.algorithm,
                wall_time=time.time(), loss=_finite(loss),
                phase_seconds={"total": round(self.clock.now() - started, 6)},
                members=len(view.members), degraded=True, rejected=dict(self.counters.rejected),
                model_hash=f"{self.backend.model_hash():08x}",
                events=[{"kind": n.kind, "peer": n.peer, "detail": n.detail} for n in self.notes][:50],
            )
            self._publish(self.topics.telemetry(self.id), telemetry.encode())
        self.notes = []

    def _tick(self) -> None:
        wake = self._next_wake()
        wait = POLL_SECONDS if wake is None else min(POLL_SECONDS, max(0.0, wake - self.clock.now()))
        self._pump(wait)

    def _round_machines(self) -> list[Any]:
        return [m for m in (self.previous, self.machine) if m is not None]

    def _next_wake(self) -> float | None:
        times = [t for m in self._round_machines() if (t := m.next_timer()) is not None]
        return min(times) if times else None

    def _fire_round_timers(self) -> None:
        """Timers of this round's machine AND the last one: a round whose result is set may
        still owe a broadcast (a unit waiting on a dead link must time out and take the
        backup route, or the child behind it never gets this round's result)."""
        now = self.clock.now()
        for machine in self._round_machines():
            if (wake := machine.next_timer()) is not None and now >= wake:
                self._execute(machine.on_timer(now))

    def _finish_round(self, result: RoundResult, own_hash: int) -> None:
        if self.received_state is not None and self.received_state[0] == self.round:
            # A resync: the peer's state at this round's start, then this round's update.
            self.backend.load_state(self.received_state[1])
            self.notes.append(Note("resync", None, f"state of round {self.round}"))
            self.received_state = None
        elif (why := resync_reason(result, own_hash)) is not None:
            # Our model now differs from the fleet's: fetch its state for the next round, first
            # from peers whose link worked this round (a cut link would cost a pull timeout).
            broken = {p for p, state in result.link_states.items() if state in ("failed", "rerouted")}
            self._request_resync(why, avoid=broken)
        cfg = self.config
        self.backend.set_learning_rate(
            scheduled_lr(cfg.lr, self.round, cfg.rounds, cfg.lr_schedule, cfg.lr_final))
        self.backend.apply(result.values)

    def _request_resync(self, why: str, avoid: set[int] | frozenset[int] = frozenset()) -> None:
        self.notes.append(Note("drift", None, why))
        view = self.membership.view_for(self.round)
        peers = self.membership.online_peers(view.members if view is not None else [])
        peers = sorted(peers, key=lambda p: p in avoid)  # stable: the usual order otherwise
        if peers and (self.transfer is None or self.transfer.round <= self.round):
            self._fetch_state(self.round + 1, peers)

    def _maybe_evaluate(self) -> float | None:
        every = self.config.eval_every
        if every <= 0 or (self.round % every != 0 and not self._done()):
            return None
        x, y = self.test_set
        n = min(self.config.eval_samples, len(y))
        correct = 0.0
        for start in range(0, n, EVAL_CHUNK):
            # A chunk at a time: 10,000 images at once would cost ~45 MB of activations.
            stop = min(n, start + EVAL_CHUNK)
            _, acc = self.backend.evaluate(to_float_pixels(x[start:stop]), y[start:stop])
            correct += acc * (stop - start)
        return correct / n if n else None

    def _maybe_checkpoint(self, view: View) -> None:
        if self.config.checkpoint_dir is None:
            return
        if self.round % self.config.checkpoint_every == 0 or self._done():
            checkpoint.save(self.config.checkpoint_dir, checkpoint.Checkpoint(
                round=self.round, epoch=view.epoch, state=self.backend.state(),
                meta={"job": self.config.job, "node": self.id}))

    def _report(self, report: RoundReport, view: View) -> None:
        result = report.result
        stats = result.stats
        if self.on_round is not None:
            self.on_round(report)
        if not self.config.telemetry:
            return
        contributors = set().union(*result.contributors) if result.contributors else set()
        telemetry = Telemetry(
            node=self.id, round=report.round, epoch=report.epoch, algorithm=self.config.algorithm,
            wall_time=time.time(), loss=_finite(report.loss), accuracy=report.accuracy,
            phase_seconds={k: round(v, 6) for k, v in report.phase_seconds.items()},
            bytes_sent=report.bytes_sent, bytes_received=report.bytes_received,
            contributors=len(contributors), members=len(view.members),
            reroutes=int(getattr(stats, "reroutes", 0)), timeouts=int(getattr(stats, "timeouts", 0)),
            nacks=int(getattr(stats, "nacks", 0)), pulls=int(getattr(stats, "pulls", 0)),
            degraded=bool(result.degraded), missing_chunks=len(result.missing_chunks),
            rejected=dict(self.counters.rejected),
            links={str(k): v for k, v in result.link_states.items()},
            model_hash=f"{self.backend.model_hash():08x}",
            events=[{"kind": n.kind, "peer": n.peer, "detail": n.detail} for n in report.notes][:50],
        )
        self._publish(self.topics.telemetry(self.id), telemetry.encode())

    # -- messages -----------------------------------------------------------------------------

    def _pump(self, timeout: float) -> None:
        for message in self.transport.receive(timeout):
            self._handle(message)
        self._fire_round_timers()
        self._tick_transfer()

    def _handle(self, message: Message) -> None:
        link = self.topics.parse_link(message.topic)
        if link is not None:
            self._handle_frame(link[0], message.payload)
            return
        try:
            if self.topics.parse_status(message.topic) is not None:
                self._handle_status(Status.decode(message.payload))
            elif message.topic == self.topics.view:
                self.membership.on_view(View.decode(message.payload))
            elif message.topic == self.topics.control:
                self._handle_control(Control.decode(message.payload))
        except MessageError as exc:
            self.counters.rejected[f"json_{exc.reason}"] += 1

    def _handle_status(self, status: Status) -> None:
        before = self.membership.states.get(status.node)
        self._publish_views(self.membership.on_status(status, self.clock.now()))
        after = self.membership.states.get(status.node)
        if after != before:
            log.info("node %d is %s", status.node, after)
        if after != "offline" or status.state != "offline":
            return  # not a Will, or the Will of an older life of a node that is back
        if self.machine is not None and self.machine.result is None:
            # The broker's Last Will: no need to wait a timeout for this peer in this round.
            self._execute(self.machine.peer_down(status.node, self.clock.now()))

    def _handle_control(self, control: Control) -> None:
        apply = getattr(self.transport, "apply_control", None)
        if control.node == self.id and apply is not None and apply(control):
            self.notes.append(Note("fault_injected", control.peer, control.action))

    def _handle_frame(self, src: int, payload: bytes) -> None:
        self.counters.bytes_received += len(payload)
        frame = decode(payload, expected_sender=src, job=self.job)
        if isinstance(frame, Rejection):
            self.counters.rejected[frame.reason.value] += 1
            return
        if frame.kind == Kind.MODEL_PULL:
            self.pending_pulls[frame.sender] = frame
            self._serve_pulls()
        elif frame.kind == Kind.MODEL:
            self._on_state_frame(frame)
        elif self.machine is not None and frame.round == self.round:
            self._execute(self.machine.on_frame(frame, self.clock.now()))
        elif self.previous is not None and frame.round == self.round - 1:
            self._execute(self.previous.on_frame(frame, self.clock.now()))
        elif self.machine is not None and self.machine.round == frame.round:
            # The round we just finished: it still answers pulls and ACKs.
            self._execute(self.machine.on_frame(frame, self.clock.now()))
        elif frame.round >= self.round + FUTURE_ROUNDS and frame.kind != Kind.MODEL_PULL:
            self._fell_behind(frame)
        elif self.round <= frame.round <= self.round + FUTURE_ROUNDS:
            if len(self.future) < MAX_BUFFERED_FRAMES:
                self.future.append(frame)
            else:
                self.counters.rejected["buffer_full"] += 1
        else:
            self.counters.rejected[RejectReason.STALE_ROUND.value] += 1

    def _fell_behind(self, frame: Frame) -> None:
        """Frames two rounds ahead of ours: the fleet went on without us (we ran a round to its
        deadline, or hung). Catching up round by round never ends; fetch the fleet's state."""
        self.counters.rejected["future_round"] += 1
        if self.joining or self.transfer is not None or frame.sender not in self.membership.live():
            return  # a transfer under way takes any newer state than it asked for
        self.notes.append(Note("behind", frame.sender, f"at round {self.round}, peer at {frame.round}"))
        others = self.membership.online_peers(self.membership.live())
        # Ask for the state of the round AFTER the peer's: it is served as that round starts,
        # so we join it in step. The peer's current state would be a round old on arrival,
        # and we would fall behind again at once.
        self._fetch_state(frame.round + 1, [frame.sender, *(p for p in others if p != frame.sender)])

    def _take_future(self) -> list[Frame]:
        now_round = [f for f in self.future if f.round == self.round]
        self.future = [f for f in self.future if f.round > self.round]
        return now_round

    # -- state transfer -----------------------------------------------------------------------

    def _fetch_state(self, round: int, peers: list[int]) -> None:
        """Pull the fleet's state at the start of ``round`` (or later) from ``peers`` in turn."""
        now = self.clock.now()
        self.transfer = StateTransfer(self.id, self.job, round, peers, STATE_PULL_TIMEOUT, now,
                                      size=int(self.backend.state().size))
        self._execute(self.transfer.start(now))

    def _on_state_frame(self, frame: Frame) -> None:
        if self.transfer is None:
            return  # late or duplicate chunks of a transfer already done
        self._execute(self.transfer.on_frame(frame, self.clock.now()))
        if self.transfer.result is None:
            return
        rnd, state, _ = self.transfer.result
        self.transfer = None
        if rnd >= self.round:
            self.received_state = (rnd, state)

    def _tick_transfer(self) -> None:
        transfer, now = self.transfer, self.clock.now()
        if transfer is None or (wake := transfer.next_timer()) is None or now < wake:
            return
        if transfer.attempts >= PULL_ROUNDS_PER_PEER * len(transfer.peers):
            self.notes.append(Note("state_pull_failed", transfer.peer, f"round {transfer.round}"))
            self.transfer = None
            return
        self._execute(transfer.on_timer(now))

    def _serve_pulls(self) -> None:
        """Send our state to pullers that asked for a round we are at (or before)."""
        # Until a round's result is applied our state is that round's start state, so what we
        # send is always "the state at the start of self.round".
        for puller, request in list(self.pending_pulls.items()):
            if request.round <= self.round:
                del self.pending_pulls[puller]
                if self.joining:
                    continue
                self._execute(serve_model_pull(request, self.id, self.job, self.backend.state(),
                                               self.round, STATE_CHUNK_VALUES,
                                               self.backend.model_hash()))

    def _execute(self, actions: list[Any]) -> None:
        for action in actions:
            if isinstance(action, Send):
                self._send(action.dst, action.frame)
            elif isinstance(action, Note):
                self.notes.append(action)

    def _send(self, dst: int, frame: Frame) -> None:
        data = encode(frame)
        self.counters.bytes_sent += len(data)
        self._publish(self.topics.link(self.id, dst), data, reliable=False)

    def _publish(self, topic: str, payload: bytes, retain: bool = False, reliable: bool = True) -> None:
        try:
            self.transport.publish(topic, payload, retain=retain, reliable=reliable)
        except TransportError as exc:
            # The broker is away: the round's timeouts and the deadline deal with the loss.
            self.counters.rejected["publish_failed"] += 1
            log.debug("publish on %s failed: %s", topic, exc)


def _finite(value: float) -> float | None:
    """JSON has no NaN: a diverged loss travels as null."""
    return value if np.isfinite(value) else None


# -- process entry ------------------------------------------------------------------------------


def run_agent(config: AgentConfig) -> int:
    """Build everything from the configuration and run until done or signalled."""
    from agent.model.backend import make_backend
    from agent.model.data import BatchStream, DataError, load_mnist_shard
    from agent.transport.faults import FaultyTransport
    from agent.transport.mqtt import MqttTransport

    stop = threading.Event()

    def _on_signal(signum: int, _frame: object) -> None:
        log.info("signal %d: finishing", signum)
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        part = load_mnist_shard(config.id % config.fleet_size, config.fleet_size,
                                str(config.data) if config.data else None,
                                non_iid=config.non_iid, seed=config.seed,
                                test_limit=config.eval_samples, raw_pixels=True)
    except DataError as exc:
        log.error("%s", exc)
        return 2
    # Same seed on every agent: the fleet starts from identical weights.
    backend = make_backend(config.backend, np.random.default_rng(config.seed), config.optimizer, config.lr)
    batches = BatchStream(part.x_train, part.y_train, config.batch,
                          np.random.default_rng([config.seed, config.id]))
    try:
        mqtt = MqttTransport(
            f"edgegrove-{config.job}-{config.id}", config.broker,
            username=config.username, password=config.password,
            tls_ca=str(config.tls_ca) if config.tls_ca else None, protocol=config.mqtt_version,
            keepalive=config.keepalive,
            max_publish_bytes_per_s=config.publish_rate * 1e6 if config.publish_rate else None,
        )
        transport = FaultyTransport(mqtt, config.id, Topics(config.job),
                                    np.random.default_rng([config.seed, config.id, 7]))
        runtime = AgentRuntime(config, backend, batches, (part.x_test, part.y_test), transport,
                               should_stop=stop.is_set,
                               on_round=lambda r: log.info(
                                   "round %d loss %.4f%s %.0f ms%s", r.round, r.loss,
                                   f" acc {r.accuracy:.4f}" if r.accuracy is not None else "",
                                   r.phase_seconds["total"] * 1000,
                                   " DEGRADED" if r.result.degraded else ""))
        return runtime.run()
    except TransportError as exc:
        log.error("%s", exc)
        return 3
