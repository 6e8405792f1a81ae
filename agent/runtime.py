"""The agent users run: the IO loop around the agent core.

Every decision is the core's (agent/core.py): rounds, membership, state transfer, telemetry
notes. This loop only executes the core's actions against the transport (MQTT), the clock,
the model backend and checkpoint files, and feeds the core what arrives and when time passes.
Paho's thread never runs any of this: the transport hands messages over a bounded queue that
``receive`` drains.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from agent import checkpoint
from agent.clock import Clock, MonotonicClock
from agent.config import AgentConfig
from agent.core import (
    AgentCore,
    ApplyControl,
    ApplyUpdate,
    ComputeGradient,
    CoreAction,
    Displaced,
    LoadState,
    Phase,
    PublishStatus,
    PublishSuspect,
    ReportRound,
    RoundReport,
    SaveCheckpoint,
    SendState,
    telemetry_for,
)
from agent.core_config import core_config
from agent.model.data import to_float_pixels
from agent.protocol.allreduce import Fanout, Note, Send
from agent.protocol.membership import PublishView
from agent.protocol.notes import NoteKind
from agent.protocol.topics import Topics
from agent.protocol.wire import Frame, encode
from agent.transport.base import Message, Transport, TransportError, Will

if TYPE_CHECKING:
    from agent.model.backend import Backend

log = logging.getLogger("edgegrove.agent")

POLL_SECONDS = 0.05
# After the loop went this long without reading (an evaluation of the test set, a slow gradient
# on a Pi), what arrived meanwhile is read before any timer runs: a peer's ACK still waiting in
# our socket or at the broker is no evidence that the peer went silent. Read until the link is
# quiet for CATCH_UP_QUIET_S, for CATCH_UP_MAX_S at most.
CATCH_UP_AFTER_S = 0.05
CATCH_UP_QUIET_S = 0.005
CATCH_UP_MAX_S = 0.5
DISPLACED_EXIT = 4  # another agent took over this node id (exit codes: 2 usage, 3 broker)
EVAL_CHUNK = 1000

# Decorates the agent's transport, given its configuration (e.g. a fault injector).
TransportWrapper = Callable[[Transport, AgentConfig], Transport]

__all__ = ["AgentRuntime", "RoundReport", "TransportWrapper", "new_incarnation", "run_agent"]

_last_incarnation = 0


def new_incarnation() -> int:
    """Wall-clock milliseconds, strictly growing within this process too: a restarted agent
    outranks its predecessor, so the late Will of the old life does not take the new one
    offline (membership ignores statuses of older incarnations)."""
    global _last_incarnation
    _last_incarnation = max(time.time_ns() // 1_000_000, _last_incarnation + 1)
    return _last_incarnation


class AgentRuntime:
    """One agent. ``batches`` yields (x, y); ``test_set`` is (x, y) for evaluation."""

    def __init__(
        self,
        config: AgentConfig,
        backend: Backend,
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
        self.incarnation = new_incarnation()
        self.displaced: Displaced | None = None
        resumed = self._resume()
        self.checkpoints = checkpoint.BackgroundWriter(config.checkpoint_dir or Path("."))
        self.core = AgentCore(core_config(config, int(backend.state().size)), self.incarnation,
                              resumed_round=resumed, pid=os.getpid(), now=self.clock.now())
        self.apply_seconds = 0.0
        self.read_at = self.clock.now()  # when the loop last read the transport

    @property
    def round(self) -> int:
        return self.core.round

    # -- life cycle -------------------------------------------------------------------------

    def run(self) -> int:
        self._connect()
        try:
            while not self.should_stop() and self.core.phase != Phase.DONE:
                deadline = self.core.next_deadline()
                wait = POLL_SECONDS if deadline is None else min(
                    POLL_SECONDS, max(0.0, deadline - self.clock.now()))
                self._pump(wait)
        finally:
            self._shutdown()
        return DISPLACED_EXIT if self.displaced is not None else 0

    def _connect(self) -> None:
        # The Will carries our incarnation: it must take THIS life offline, and, arriving
        # late, never a later one. Our own retained status comes back after every retained
        # message we subscribed to: the core then knows whether a fleet (a view) exists.
        will = Will(self.topics.status(self.core.node), self.core.status("offline").encode())
        birth = Message(self.topics.status(self.core.node), self.core.status("online").encode(),
                        retained=True)
        self.transport.connect(self.core.subscriptions(), will, birth)

    def _resume(self) -> int | None:
        if self.config.checkpoint_dir is None:
            return None
        saved = checkpoint.load(self.config.checkpoint_dir, expect=checkpoint.Plausible(
            state_size=int(self.backend.state().size),
            max_round=self.config.rounds or checkpoint.MAX_ROUND,
            job=self.config.job, node=self.config.id))
        if saved is None:
            return None
        self.backend.load_state(saved.state)
        log.info("resumed from checkpoint at round %d", saved.round)
        return saved.round

    def _shutdown(self) -> None:
        self.checkpoints.close()  # the last checkpoint is on disk before we say we are gone
        if self.displaced is None:  # else the node's retained status is the newer agent's
            self._publish(self.topics.status(self.core.node), self.core.status("offline").encode(),
                          retain=True)
        self.transport.close()

    # -- the loop ---------------------------------------------------------------------------

    def _pump(self, timeout: float) -> None:
        deaf = self.clock.now() - self.read_at  # since the last read: the last pump's work
        self._read(timeout)
        if deaf > CATCH_UP_AFTER_S or self.clock.now() - self.read_at > CATCH_UP_AFTER_S:
            self._catch_up()
        self._execute(self.core.on_tick(self.clock.now()))

    def _read(self, timeout: float) -> bool:
        """Hand the core what arrived (waiting up to ``timeout`` for it); False: nothing did."""
        messages = self.transport.receive(timeout)
        self.read_at = self.clock.now()
        for message in messages:
            self._execute(self.core.on_message(message.topic, message.payload, self.clock.now(),
                                                   message.arrival))
        return bool(messages)

    def _catch_up(self) -> None:
        """We did not listen for a while: hear everything that came meanwhile, then judge."""
        until = self.clock.now() + CATCH_UP_MAX_S
        while self.clock.now() < until and self._read(CATCH_UP_QUIET_S):
            pass

    def _execute(self, actions: list[CoreAction]) -> None:
        queue = deque(actions)
        while queue:
            action = queue.popleft()
            if isinstance(action, ComputeGradient):
                queue.extend(self._compute(action))
            else:
                self._do(action)

    def _compute(self, action: ComputeGradient) -> list[CoreAction]:
        started = self.clock.now()
        x, y = next(self.batches)
        loss, grad = self.backend.gradients(x, y)
        now = self.clock.now()
        return self.core.on_gradient(action.round, float(loss), grad, self.backend.model_hash(),
                                     now, compute_seconds=now - started)

    def _do(self, action: CoreAction) -> None:
        if isinstance(action, Send):
            self._send(action.dst, action.frame)
        elif isinstance(action, Fanout):
            self._publish(self.topics.fanout(self.core.node), encode(action.frame), reliable=False)
        elif isinstance(action, SendState):
            for send in self.core.state_frames(action, self.backend.state()):
                self._send(send.dst, send.frame)
        elif isinstance(action, PublishStatus):
            self._publish(self.topics.status(self.core.node), action.status.encode(), retain=True)
        elif isinstance(action, PublishSuspect):
            report = action.report
            if report.peer == self.core.node:
                log.info("taking no part in rounds up to %d (catching up): telling the fleet", report.round)
            else:
                log.warning("no word from node %d for a whole timeout in round %d: reporting it silent",
                            report.peer, report.round)
            # QoS 0: a report that cannot go out now (broker away) is stale later.
            self._publish(self.topics.suspect(self.core.node), action.report.encode(), reliable=False)
        elif isinstance(action, PublishView):
            view = action.view
            log.info("coordinator: view epoch %d members %s from round %d",
                     view.epoch, view.members, view.from_round)
            self._publish(self.topics.view_of(self.core.node), view.encode(), retain=True)
        elif isinstance(action, ApplyUpdate):
            started = self.clock.now()
            self.backend.set_learning_rate(action.learning_rate)
            self.backend.apply(action.values)
            self.apply_seconds = self.clock.now() - started
        elif isinstance(action, LoadState):
            self.backend.load_state(action.state)
            log.info("installed the fleet's state of round %d", action.round)
        elif isinstance(action, SaveCheckpoint):
            # state() is a copy: the writer thread never sees the model change under it.
            self.checkpoints.submit(checkpoint.Checkpoint(
                round=action.round, epoch=action.epoch, state=self.backend.state(),
                meta={"job": self.config.job, "node": self.core.node}))
            if self.core.done:
                self.checkpoints.close()  # the run's last is on disk before its round is reported
        elif isinstance(action, ApplyControl):
            self._apply_control(action)
        elif isinstance(action, ReportRound):
            self._report(action.report)
        elif isinstance(action, Displaced):
            self.displaced = action
            log.error("another agent (pid %s, started later) runs as node %d with these credentials: "
                      "stopping this one; run one agent per node id", action.pid or "?", self.core.node)

    def _apply_control(self, action: ApplyControl) -> None:
        apply = getattr(self.transport, "apply_control", None)
        if apply is not None and apply(action.control):
            self.core.record_note(Note(NoteKind.FAULT_INJECTED, action.control.peer, action.control.action))

    def _report(self, report: RoundReport) -> None:
        report.phase_seconds["apply"] = self.apply_seconds
        report.phase_seconds["total"] += self.apply_seconds
        self.apply_seconds = 0.0
        if report.evaluate:
            report.accuracy = self._evaluate()
        if self.on_round is not None:
            self.on_round(report)
        if self.config.telemetry:
            wall = time.time()
            # The core's clock is monotonic; the wall clock lets a bench line up the agents of one
            # host (the fleet's collective time after its last gradient).
            reduced_at = wall - (self.clock.now() - report.ended_at) if report.ended_at else 0.0
            telemetry = telemetry_for(self.core, report, algorithm=self.config.algorithm,
                                      model_hash=self.backend.model_hash(), wall_time=wall,
                                      machine=os.uname().machine, reduced_at=reduced_at)
            self._publish(self.topics.telemetry(self.core.node), telemetry.encode())

    def _evaluate(self) -> float | None:
        x, y = self.test_set
        n = min(self.config.eval_samples, len(y))
        correct = 0.0
        for start in range(0, n, EVAL_CHUNK):
            # A chunk at a time: 10,000 images at once would cost ~45 MB of activations.
            stop = min(n, start + EVAL_CHUNK)
            _, acc = self.backend.evaluate(to_float_pixels(x[start:stop]), y[start:stop])
            correct += acc * (stop - start)
            self._listen()
        return correct / n if n else None

    def _listen(self) -> None:
        """Between two slices of long work: take what arrived (ACKs are sent, a report that
        we are silent is refuted at once), but run no timer. A Pi evaluating 10,000 images
        for seconds would otherwise look frozen to its peers and be routed around. The
        core is between rounds then (the next one waits for this gradient), so nothing it
        answers can end a round under the evaluation."""
        self._read(0.0)

    def _send(self, dst: int, frame: Frame) -> None:
        self._publish(self.topics.link(self.core.node, dst), encode(frame), reliable=False)

    def _publish(self, topic: str, payload: bytes, retain: bool = False, reliable: bool = True) -> None:
        try:
            self.transport.publish(topic, payload, retain=retain, reliable=reliable)
        except TransportError as exc:
            # The broker is away: the round's timeouts and the deadline deal with the loss.
            self.core.count_rejected("publish_failed")
            log.debug("publish on %s failed: %s", topic, exc)


# -- process entry ------------------------------------------------------------------------------


def run_agent(config: AgentConfig, wrap_transport: TransportWrapper | None = None) -> int:
    """Build everything from the configuration and run until done or signalled.

    ``wrap_transport`` decorates the MQTT transport before the runtime gets it (a fault
    injector, say); without it the runtime talks to MQTT directly."""
    from agent.model.backend import make_backend
    from agent.model.contract import ModelError
    from agent.model.data import BatchStream, DataError
    from agent.model.datasets import DataRequest, load_agent_data
    from agent.model.loader import load_model
    from agent.model.partition import label_histogram
    from agent.transport.mqtt import MqttTransport

    stop = threading.Event()

    def _on_signal(signum: int, _frame: object) -> None:
        log.info("signal %d: finishing", signum)
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        model = load_model(config.model)
        part = load_agent_data(
            DataRequest(config.data, config.dataset, config.label_column, config.holdout,
                        config.partition, config.non_iid, config.seed, config.eval_samples),
            config.id % config.fleet_size, config.fleet_size, model)
        # Same seed on every agent: the fleet starts from identical weights.
        backend = make_backend(config.backend, np.random.default_rng(config.seed), config.optimizer,
                               config.lr, model=model, seed=config.seed)
    except (DataError, ModelError) as exc:
        log.error("%s", exc)
        return 2
    log.info("model %s (%d parameters), data %s: %d training samples, labels %s, %d test samples",
             model.name, model.param_count, part.source, len(part.y_train),
             label_histogram(part.y_train, model.num_classes), len(part.y_test))
    batches = BatchStream(part.x_train, part.y_train, config.batch,
                          np.random.default_rng([config.seed, config.id]))
    try:
        mqtt = MqttTransport(
            config.client_id or f"edgegrove-{config.job}-{config.id}", config.broker,
            username=config.username, password=config.password,
            tls_ca=str(config.tls_ca) if config.tls_ca else None, protocol=config.mqtt_version,
            keepalive=config.keepalive,
            threaded=False,  # paho's loop in this thread: no wake-up and GIL hand-over per message
            max_publish_bytes_per_s=config.publish_rate * 1e6 if config.publish_rate else None,
        )
        transport = mqtt if wrap_transport is None else wrap_transport(mqtt, config)
        runtime = AgentRuntime(config, backend, batches, (part.x_test, part.y_test), transport,
                               should_stop=stop.is_set,
                               on_round=lambda r: log.info(
                                   "round %d loss %.4f%s %.0f ms%s", r.round, r.loss,
                                   f" acc {r.accuracy:.4f}" if r.accuracy is not None else "",
                                   r.phase_seconds["total"] * 1000,
                                   " DEGRADED" if r.degraded else ""))
        return runtime.run()
    except TransportError as exc:
        log.error("%s", exc)
        return 3
    except ModelError as exc:  # the model's loss or gradient went NaN/inf: never averaged in
        log.error("%s", exc)
        return 2
