"""The agent users run: the IO loop around the agent core.

Every decision is the core's (agent/core/): rounds, membership, state transfer, telemetry
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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from agent import checkpoint
from agent.clock import Clock, MonotonicClock
from agent.config import AgentConfig, ConfigError
from agent.core import (
    AgentCore,
    ApplyControl,
    ApplyUpdate,
    Channel,
    ComputeGradient,
    CoreAction,
    Displaced,
    FleetFinished,
    LoadState,
    Phase,
    Publish,
    ReportRound,
    RoundReport,
    SaveCheckpoint,
    telemetry_for,
)
from agent.core.dispatch import ActionDispatcher, Follow
from agent.core.events import (
    Arriving,
    CoreEvent,
    Disconnected,
    FaultInjected,
    GradientReady,
    MessageArrived,
    PublishFailed,
    Reconnected,
    Sending,
    Tick,
)
from agent.model.data import to_float_pixels
from agent.model.periodic import PeriodicTrainer
from agent.privacy.plan import with_privacy
from agent.protocol.keys import MemberKeys
from agent.protocol.membership import ModelIdentity, Refusal
from agent.protocol.messages import Suspect, Telemetry, View
from agent.protocol.topics import Topics
from agent.protocol.wire import Frame, Kind
from agent.runtime_config import core_config, member_keys
from agent.transport.base import Message, Notice, Transport, TransportError, Will
from agent.usage import ProcessUsage

if TYPE_CHECKING:
    from agent.model.backend import Backend
    from agent.model.contract import Model
    from agent.model.data import BatchStream

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
REFUSED_EXIT = 5  # the fleet of this job runs another model
EVAL_CHUNK = 1000

# Decorates the agent's transport, given its configuration (e.g. a fault injector).
TransportWrapper = Callable[[Transport, AgentConfig], Transport]

__all__ = ["AgentRuntime", "RoundReport", "Training", "TransportWrapper", "load_training",
           "new_incarnation", "run_agent"]

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
        model: ModelIdentity | None = None,
        labels: tuple[int, ...] = (),
        keys: MemberKeys | None = None,
    ) -> None:
        # Differential privacy: every gradient noised once, here on the device (agent/privacy).
        config, backend, self.dp = with_privacy(config, backend, _training_samples(batches),
                                                np.random.default_rng())  # OS entropy, never the job's seed
        if self.dp is not None:
            log.info("%s", self.dp.line())
        self.config = config
        # Periodic averaging: the round's vector is the local steps' model delta, and applying
        # the fleet's mean is the outer optimizer's step (agent/model/periodic.py).
        self.backend: Backend = backend if config.sync_every is None else PeriodicTrainer(backend, config.outer_config)
        self.batches = batches
        self.test_set = test_set
        self.transport = transport
        self.clock = clock or MonotonicClock()
        self.should_stop = should_stop
        self.on_round = on_round
        self.topics = Topics(config.job)
        self.incarnation = new_incarnation()
        self.displaced_by: Displaced | None = None
        self.refusal: Refusal | None = None
        resumed, age = self._resume() or (None, 0.0)
        self.checkpoints = checkpoint.BackgroundWriter(config.checkpoint_dir or Path("."))
        self.core = AgentCore(core_config(config, int(self.backend.state().size), model, labels, keys), self.incarnation,
                              resumed_round=resumed, resumed_age=age, pid=os.getpid(), now=self.clock.now())
        self.apply_seconds = 0.0
        self.read_at = self.clock.now()  # when the loop last read the transport
        self.computing = False  # taking local steps (the transport is read between them)
        self.deferred: deque[ComputeGradient] = deque()
        self.usage = ProcessUsage()  # CPU and memory of this process, in each round's telemetry
        self.dispatcher = ActionDispatcher(self.core, self)

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
        if self.refusal is not None:
            return REFUSED_EXIT
        return DISPLACED_EXIT if self.displaced_by is not None else 0

    def _connect(self) -> None:
        # The Will carries our incarnation: it must take THIS life offline, and, arriving
        # late, never a later one. Our own retained status comes back after every retained
        # message we subscribed to: the core then knows whether a fleet (a view) exists.
        offline, online = (Publish.status_of(self.core.status(s)) for s in ("offline", "online"))
        will = Will(offline.topic(self.topics), offline.payload(), retain=offline.retain)
        birth = Message(online.topic(self.topics), online.payload(), retained=online.retain)
        self.transport.connect(self.core.subscriptions(), will, birth)

    def _resume(self) -> tuple[int, float] | None:
        """The checkpoint's round and age in seconds (None: none to resume from)."""
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
        return saved.round, checkpoint.age(self.config.checkpoint_dir, time.time())

    def _shutdown(self) -> None:
        self.checkpoints.close()  # the last checkpoint is on disk before we say we are gone
        if self.displaced_by is None:  # else the node's retained status is the newer agent's
            self._publish(Publish.status_of(self.core.status("offline")))
        self.transport.close()

    # -- the loop ---------------------------------------------------------------------------

    def _pump(self, timeout: float) -> None:
        deaf = self.clock.now() - self.read_at  # since the last read: the last pump's work
        self._read(timeout)
        if deaf > CATCH_UP_AFTER_S or self.clock.now() - self.read_at > CATCH_UP_AFTER_S:
            self._catch_up()
        self._execute(self.core.handle(Tick(), self.clock.now()))

    def _read(self, timeout: float) -> bool:
        """Hand the core what arrived (waiting up to ``timeout`` for it); False: nothing did."""
        messages = self.transport.receive(timeout)
        self.read_at = self.clock.now()
        for message in messages:
            self._execute(self.core.handle(event_of(message), self.clock.now()))
        return bool(messages)

    def _catch_up(self) -> None:
        """We did not listen for a while: hear everything that came meanwhile, then judge."""
        until = self.clock.now() + CATCH_UP_MAX_S
        while self.clock.now() < until and self._read(CATCH_UP_QUIET_S):
            pass

    def _execute(self, actions: list[CoreAction]) -> None:
        self.dispatcher.run(actions)
        while self.deferred and not self.computing:
            self.dispatcher.run(self._compute(self.deferred.popleft()))

    # -- the effects of the core's actions (agent/core/dispatch.py's Driver) ---------------------

    def compute(self, action: ComputeGradient) -> Follow:
        if self.computing:
            self.deferred.append(action)  # decided while we listened between local steps
            return None
        return self._compute(action)

    def _compute(self, action: ComputeGradient) -> list[CoreAction]:
        started = self.clock.now()
        if action.local_steps is not None:
            assert isinstance(self.backend, PeriodicTrainer), "local steps need periodic averaging"
            # Heard between the steps (as between evaluation slices): many local steps on a slow
            # device must not look like silence, a report about us unrefuted until the fleet evicts us.
            self.computing = True
            try:
                loss, grad = self.backend.local_round(self.batches, action.local_steps, between=self._listen)
            finally:
                self.computing = False
        else:
            loss, grad = self.backend.gradients(*next(self.batches))
        now = self.clock.now()
        ready = GradientReady(action.round, float(loss), grad, self.backend.model_hash(),
                              compute_seconds=now - started)
        return self.core.handle(ready, now)

    def publish(self, message: Publish) -> None:
        _log_publish(message)
        self._publish(message)

    def state(self) -> np.ndarray:
        return self.backend.state()

    def apply_update(self, action: ApplyUpdate) -> None:
        started = self.clock.now()
        self.backend.set_learning_rate(action.learning_rate)
        self.backend.apply(action.values)
        self.apply_seconds = self.clock.now() - started

    def load_state(self, action: LoadState) -> None:
        self.backend.load_state(action.state)
        log.info("installed the fleet's state of round %d", action.round)

    def save_checkpoint(self, action: SaveCheckpoint) -> None:
        # state() is a copy: the writer thread never sees the model change under it.
        self.checkpoints.submit(checkpoint.Checkpoint(
            round=action.round, epoch=action.epoch, state=self.backend.state(),
            meta={"job": self.config.job, "node": self.config.id}))
        if self.core.done:
            self.checkpoints.close()  # the run's last is on disk before its round is reported

    def report_round(self, action: ReportRound) -> None:
        self._report(action.report)

    def displaced(self, action: Displaced) -> None:
        self.displaced_by = action
        log.error("another agent (pid %s, started later) runs as node %d with these credentials: "
                  "stopping this one; run one agent per node id", action.pid or "?", self.config.id)

    def refused(self, action: Refusal) -> None:
        self.refusal = action
        log.error("%s", action.line())

    def fleet_finished(self, action: FleetFinished) -> None:
        log.warning("%s", action.line())  # then the core is done: the loop ends, status 0

    def apply_control(self, action: ApplyControl) -> Follow:
        apply = getattr(self.transport, "apply_control", None)
        if apply is not None and apply(action.control):
            return self.core.handle(FaultInjected(action.control.peer, action.control.action), self.clock.now())
        return None

    def _report(self, report: RoundReport) -> None:
        report.phase_seconds["apply"] = self.apply_seconds
        report.phase_seconds["total"] += self.apply_seconds
        self.apply_seconds = 0.0
        report.samples = report.local_steps * self.config.batch if report.result is not None else 0
        if report.evaluate:
            report.accuracy = self._evaluate()
        if self.on_round is not None:
            self.on_round(report)
        self._warn_over_budget(report.round)
        if self.config.telemetry:
            wall = time.time()
            # The core's clock is monotonic; the wall clock lets a bench line up the agents of one
            # host (the fleet's collective time after its last gradient).
            reduced_at = wall - (self.clock.now() - report.ended_at) if report.ended_at else 0.0
            usage = self.usage.sample()
            telemetry = telemetry_for(self.config.id, self.core.parts.counters, report, algorithm=self.config.algorithm,
                                      model_hash=self.backend.model_hash(), wall_time=wall,
                                      machine=os.uname().machine, reduced_at=reduced_at,
                                      cpu_percent=usage.cpu_percent, rss_bytes=usage.rss_bytes)
            self._publish(Publish.telemetry(self._with_privacy_spent(telemetry)))

    def _with_privacy_spent(self, telemetry: Telemetry) -> Telemetry:
        if self.dp is None:
            return telemetry
        return replace(telemetry, dp_epsilon=self.dp.epsilon_spent(telemetry.round))

    def _warn_over_budget(self, round: int) -> None:
        if self.dp is not None and self.dp.over_budget(round):  # dp_at_budget warn: it goes on
            log.warning("differential privacy: this device's data has spent epsilon %.3g, over the budget %g",
                        self.dp.epsilon_spent(round) or 0.0, self.dp.plan.budget or 0.0)

    def _evaluate(self) -> float | None:
        x, y = self.test_set
        n = min(self.config.eval_samples, len(y))
        correct = 0.0
        for start in range(0, n, EVAL_CHUNK):
            # A chunk at a time: 10,000 images at once would cost ~45 MB of activations.
            stop = min(n, start + EVAL_CHUNK)
            acc = self.backend.accuracy(to_float_pixels(x[start:stop]), y[start:stop])
            correct += acc * (stop - start)
            self._listen()
        return correct / n if n else None

    def _listen(self) -> None:
        """Between two slices of long work (evaluation, local steps): take what arrived (ACKs are sent, a report that
        we are silent is refuted at once), but run no timer. A Pi evaluating 10,000 images
        for seconds would otherwise look frozen to its peers and be routed around. The
        core is between rounds then (the next one waits for this gradient), so nothing it
        answers can end a round under the evaluation."""
        self._read(0.0)

    def _publish(self, action: Publish) -> None:
        topic = action.topic(self.topics)
        try:
            self.transport.publish(topic, action.payload(), retain=action.retain, reliable=action.reliable)
        except TransportError as exc:
            # The broker is away: the round's timeouts and the deadline deal with the loss.
            self.core.handle(PublishFailed(), self.clock.now())
            log.debug("publish on %s failed: %s", topic, exc)


def event_of(message: Message) -> CoreEvent:
    """What the transport delivered, as the core's event."""
    if message.notice is None:
        return MessageArrived(message.topic, message.payload, message.arrival)
    notice = message.notice
    if notice is Notice.RECONNECTED:
        return Reconnected()
    if notice is Notice.DISCONNECTED:
        return Disconnected()
    return Arriving(message.about) if notice is Notice.ARRIVING else Sending()


def _log_publish(action: Publish) -> None:
    message = action.message
    if action.channel is Channel.SUSPECT and isinstance(message, Suspect):
        if message.peer == message.node:
            log.info("taking no part in rounds up to %d (catching up): telling the fleet", message.round)
        else:
            log.warning("no word from node %d for a whole timeout in round %d: reporting it silent",
                        message.peer, message.round)
    elif action.channel is Channel.LINK and isinstance(message, Frame) and message.kind is Kind.MODEL_PULL:
        # Every ask for the fleet's state, first or again: a catching-up agent is never silent.
        log.info("asking node %s for the fleet's state of round %d", action.dst, message.round)
    elif action.channel is Channel.VIEW and isinstance(message, View):
        log.info("coordinator: view epoch %d members %s from round %d",
                 message.epoch, message.members, message.from_round)


def _training_samples(batches: Iterator[tuple[np.ndarray, np.ndarray]]) -> int:
    """The examples the batches are drawn from (the sampling rate's denominator); a plain
    iterator (tests) counts as one batch drawn from itself."""
    from agent.model.data import BatchStream

    return len(batches.x) if isinstance(batches, BatchStream) else 1


# -- process entry ------------------------------------------------------------------------------


def _prepare_training(config: AgentConfig) -> (
    tuple[Backend, BatchStream, tuple[np.ndarray, np.ndarray], ModelIdentity, list[int]] | None
):
    """The model, this agent's data and the backend; None (said in one line) when unusable."""
    from agent.model.contract import ModelError
    from agent.model.data import DataError

    try:
        training = load_training(config)
    except (DataError, ModelError) as exc:
        log.error("%s", exc)
        return None
    return training.backend, training.batches, training.test_set, training.identity, training.labels


@dataclass(frozen=True)
class Training:
    """What an agent trains with: the backend holding the model, its data and the identity."""

    model: Model
    backend: Backend
    batches: BatchStream
    test_set: tuple[np.ndarray, np.ndarray]
    identity: ModelIdentity
    labels: list[int]


def load_training(config: AgentConfig, shard: tuple[int, int] | None = None) -> Training:
    """Load the model, this agent's part of the data and the backend; DataError or ModelError
    (one line) when unusable. ``shard`` (index, count) overrides the config's part of the data
    (a device training on its own data whole: (0, 1))."""
    from agent.model.backend import make_backend
    from agent.model.contract import fingerprint
    from agent.model.data import BatchStream
    from agent.model.data_budget import DataBudget
    from agent.model.datasets import DataRequest, load_agent_data
    from agent.model.loader import load_model
    from agent.model.partition import label_histogram

    index, count = shard or (config.id % config.fleet_size, config.fleet_size)
    model = load_model(config.model)
    part = load_agent_data(
        DataRequest(config.data, config.dataset, config.label_column, config.holdout,
                    config.partition, config.non_iid, config.seed, config.eval_samples,
                    DataBudget.of_device(config.data_max_mb)),
        index, count, model)
    # Same seed on every agent: the fleet starts from identical weights.
    backend = make_backend(config.backend, np.random.default_rng(config.seed), config.optimizer,
                           config.lr, model=model, seed=config.seed)
    labels = label_histogram(part.y_train, model.num_classes)
    # The fleet admits only agents of one model: announced in our status, mixed into frames.
    identity = ModelIdentity(fingerprint(model, config.seed), model.name, model.param_count)
    log.info("model %s (%d parameters, fingerprint %s), data %s: %d training samples, labels %s, "
             "%d test samples", model.name, model.param_count, identity.fingerprint, part.source,
             len(part.y_train), labels, len(part.y_test))
    batches = BatchStream(part.x_train, part.y_train, config.batch,
                          np.random.default_rng([config.seed, config.id]))
    return Training(model, backend, batches, (part.x_test, part.y_test), identity, list(labels))


def _log_round(r: RoundReport) -> None:
    log.info("round %d loss %.4f%s %.0f ms%s", r.round, r.loss,
             f" acc {r.accuracy:.4f}" if r.accuracy is not None else "",
             r.phase_seconds["total"] * 1000, " DEGRADED" if r.degraded else "")


def run_agent(config: AgentConfig, wrap_transport: TransportWrapper | None = None) -> int:
    """Build everything from the configuration and run until done or signalled.

    ``wrap_transport`` decorates the MQTT transport before the runtime gets it (a fault
    injector, say); without it the runtime talks to MQTT directly."""
    from agent.model.contract import ModelError
    from agent.transport.mqtt import MqttTransport

    stop = threading.Event()

    def _on_signal(signum: int, _frame: object) -> None:
        log.info("signal %d: finishing", signum)
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    training = _prepare_training(config)
    if training is None:
        return 2
    backend, batches, test_set, identity, labels = training
    try:
        keys = member_keys(config)
    except ConfigError as exc:
        log.error("%s", exc)
        return 2
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
        runtime = AgentRuntime(config, backend, batches, test_set, transport,
                               should_stop=stop.is_set,
                               on_round=_log_round, model=identity, labels=tuple(labels), keys=keys)
        return runtime.run()
    except TransportError as exc:
        log.error("%s", exc)
        return 3
    except ConfigError as exc:  # differential privacy that cannot be run here (agent/privacy/plan.py)
        log.error("%s", exc)
        return 2
    except ModelError as exc:  # the model's loss or gradient went NaN/inf: never averaged in
        log.error("%s", exc)
        return 2
