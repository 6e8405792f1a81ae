"""The device's IO loop: MQTT in, the core's decisions out, one job's runtime in-process.

Every decision is the core's (agent/device/core.py). This loop feeds it what arrives on the
device's topics and when time passes, and executes its actions: publishing, the state
directory, the model file's download, loading a job and running its agent runtime. While a
job trains, the runtime's ``should_stop`` hook drives this loop, so the device still hears its
topics (a stop, a queued job) between the runtime's polls; nothing here runs on paho's thread.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from agent.config import AgentConfig
from agent.device import execution, facts
from agent.device.actions import (
    DeviceAction,
    DropBlob,
    FetchBlob,
    Level,
    LogLine,
    Persist,
    PrepareJob,
    PublishExec,
    PublishRecord,
    PublishResult,
    StartTraining,
    StopTraining,
    StoreBlob,
)
from agent.device.config import DeviceConfig
from agent.device.core import Capabilities, DeviceCore
from agent.device.events import (
    BlobOnDisk,
    ChunkArrived,
    ControlArrived,
    DeviceEvent,
    ExecArrived,
    Outcome,
    Prepared,
    RoundReported,
    SpecArrived,
    Tick,
    TrainingEnded,
)
from agent.device.logs import LogForwarder
from agent.device.store import StateStore
from agent.device.verifier import Verifier
from agent.jobs import topics
from agent.jobs.document import canonical_json
from agent.jobs.envelope import Verdict
from agent.jobs.states import ExecState
from agent.runtime import RoundReport, Training, TransportWrapper
from agent.transport.base import Message, Notice, TransportError, Will
from agent.transport.mqtt import MqttTransport

log = logging.getLogger("edgegrove.device")
POLL_S = 0.2
LEVELS = {Level.INFO: logging.INFO, Level.WARNING: logging.WARNING, Level.ERROR: logging.ERROR}


class DeviceDaemon:
    def __init__(self, config: DeviceConfig, core: DeviceCore, device_facts: facts.Facts,
                 verifier: Verifier, clock: Callable[[], float] = time.time,
                 wrap_transport: TransportWrapper | None = None) -> None:
        self.config = config
        self.wrap_transport = wrap_transport  # decorates each job's transport (the simulator's faults)
        self.core = core
        self.facts = device_facts
        self.verifier = verifier
        self.clock = clock
        self.store = StateStore(config.state_dir)
        self.transport = self._link(config.mqtt_client_id)
        self.blob_link: MqttTransport | None = None
        self.work: deque[PrepareJob | StartTraining] = deque()
        self.prepared: tuple[AgentConfig, Training] | None = None
        self.stop_job: str | None = None
        self.losses: list[float] = []
        self.finished: execution.Finished | None = None
        self.running: StartTraining | None = None
        self.shutdown = threading.Event()
        self.logs = LogForwarder(config.id, topics.device_log(config.id), self._send_log,
                                 config.log_rate, clock)

    def _link(self, client_id: str) -> MqttTransport:
        c = self.config
        return MqttTransport(client_id, c.broker, username=c.username, password=c.password,
                             tls_ca=str(c.tls_ca) if c.tls_ca else None, protocol=c.mqtt_version,
                             keepalive=c.keepalive, threaded=True)

    # -- life cycle ---------------------------------------------------------------------------

    def run(self) -> int:
        offline = facts.record(self.config, self.facts, None, self.clock())
        will = Will(topics.device_record(self.config.id), canonical_json(offline).encode(), retain=True)
        # Our own retained executions first: they arrive before the specs they concern.
        subscriptions = [topics.all_execs(), topics.all_job_controls(), topics.all_job_specs()]
        try:
            self.transport.connect(subscriptions, will)
        except TransportError as exc:
            log.error("%s", exc)
            return 3
        logging.getLogger("edgegrove").addHandler(self.logs)
        try:
            self._publish_record()
            booted = self.store.booted()
            if booted.envelope is not None:
                booted = replace(booted, verdict=self.verifier.check(booted.envelope))
            self._execute(self.core.handle(booted, self.clock()))
            while not self.shutdown.is_set():
                if self.work:
                    self._do(self.work.popleft())
                else:
                    self._pump(POLL_S)
        finally:
            logging.getLogger("edgegrove").removeHandler(self.logs)
            self._close()
        return 0

    def _close(self) -> None:
        self._drop_blob_link()
        offline = facts.record(self.config, self.facts, None, self.clock())
        self._publish(topics.device_record(self.config.id), canonical_json(offline).encode(), retain=True)
        self.transport.close()

    # -- input --------------------------------------------------------------------------------

    def _pump(self, timeout: float) -> None:
        messages = self.transport.receive(timeout)
        if self.blob_link is not None:
            messages += self.blob_link.receive(0.0)
        signed = [m.payload for m in messages if m.payload and (
            topics.parse_job_spec(m.topic) is not None or topics.parse_job_control(m.topic) is not None)]
        verdicts = dict(zip(signed, self.verifier.check_all(signed), strict=True)) if signed else {}
        for message in messages:
            event = self._event_of(message, verdicts)
            if event is not None:
                self._execute(self.core.handle(event, self.clock()))
        self._execute(self.core.handle(Tick(), self.clock()))

    def _event_of(self, message: Message, verdicts: dict[bytes, Verdict]) -> DeviceEvent | None:
        if message.notice is Notice.RECONNECTED:
            self._publish_record()  # the broker may have lost it, or sent our Will
            return None
        if message.notice is not None:
            return None
        topic, raw = message.topic, message.payload
        if (job := topics.parse_job_spec(topic)) is not None:
            return SpecArrived(job, raw, verdicts.get(raw))
        if (job := topics.parse_job_control(topic)) is not None:
            return ControlArrived(job, raw, verdicts.get(raw))
        if (pair := topics.parse_job_exec(topic)) is not None:
            return ExecArrived(pair[0], pair[1], raw)
        if (chunk := topics.parse_blob_chunk(topic)) is not None:
            return ChunkArrived(chunk[0], chunk[1], raw)
        return None

    # -- actions ------------------------------------------------------------------------------

    def _execute(self, actions: list[DeviceAction]) -> None:
        for action in actions:
            self._act(action)

    def _act(self, action: DeviceAction) -> None:
        match action:
            case PublishExec(status=status):
                self._publish(topics.job_exec(status.job, status.device), canonical_json(status).encode(),
                              retain=True)
            case PublishRecord():
                self._publish_record()
            case FetchBlob(blob=blob):
                if self.store.has_blob(blob):
                    self._execute(self.core.handle(BlobOnDisk(blob.sha256), self.clock()))
                else:
                    self._open_blob_link(blob.sha256)
            case StoreBlob(blob=blob, data=data):
                self._drop_blob_link()
                self.store.store_blob(blob, data)
            case DropBlob():
                self._drop_blob_link()
            case PrepareJob() | StartTraining():
                self.work.append(action)
            case StopTraining(job=job):
                self.stop_job = job
            case PublishResult(job=job, states=states):
                self._publish_result(job, states)
            case Persist():
                self.store.persist(action)
            case LogLine(level=level, line=line):
                log.log(LEVELS[level], "%s", line)

    def _publish(self, topic: str, payload: bytes, retain: bool = False) -> None:
        try:
            self.transport.publish(topic, payload, retain=retain, reliable=True)
        except TransportError as exc:
            log.debug("publish on %s failed: %s", topic, exc)

    def _send_log(self, topic: str, payload: bytes) -> None:
        self.transport.publish(topic, payload, retain=False, reliable=False)

    def _publish_record(self) -> None:
        record = facts.record(self.config, self.facts, self.core.summary(), self.clock())
        self._publish(topics.device_record(self.config.id), canonical_json(record).encode(), retain=True)

    def _open_blob_link(self, sha256: str) -> None:
        self._drop_blob_link()
        link = self._link(f"{self.config.mqtt_client_id}-blob")
        try:
            link.connect([topics.blob_chunks(sha256)])
        except TransportError as exc:
            log.warning("cannot fetch the model file: %s", exc)  # the core's download deadline acts
            return
        self.blob_link = link

    def _drop_blob_link(self) -> None:
        if self.blob_link is not None:
            self.blob_link.close()
            self.blob_link = None

    # -- a job --------------------------------------------------------------------------------

    def _do(self, work: PrepareJob | StartTraining) -> None:
        if isinstance(work, PrepareJob):
            self._execute(self.core.handle(self._prepare(work), self.clock()))
        else:
            self._train(work)

    def _prepare(self, work: PrepareJob) -> Prepared:
        spec = work.spec
        blob = None if isinstance(spec.model, str) else spec.model
        try:
            execution.check_memory(spec, self.config.min_free_memory_mb)
            execution.job_keys(self.config, spec, work.node)
            config = execution.agent_config(self.config, spec, work.node,
                                            self.store.blob_path(blob) if blob else None,
                                            self.store.checkpoints(spec.name))
            self.prepared = (config, execution.prepare(config, spec))
        except execution.Unfit as unfit:
            return Prepared(spec.name, unfit.reason, str(unfit))
        return Prepared(spec.name)

    def _train(self, work: StartTraining) -> None:
        job = work.spec.name
        if self.prepared is None or self.prepared[0].job != job:
            return
        config, training = self.prepared
        self.stop_job, self.losses, self.running = None, [], work
        log.info("job %s: training as node %d of %d", job, work.node, work.spec.fleet_size)
        finished = execution.run(config, training, lambda: self._should_stop(job),
                                 lambda report: self._on_round(job, report), self.wrap_transport,
                                 execution.job_keys(self.config, work.spec, work.node))
        if self.shutdown.is_set():
            self.prepared = None
            return  # the state directory keeps the job: the next start resumes it
        finished.losses = self.losses
        if finished.outcome is Outcome.FAILED and self.logs.last_error:
            finished.detail = f"{finished.detail}: {self.logs.last_error}"
        self.finished = finished
        ended = TrainingEnded(job, finished.outcome, finished.round, finished.detail, finished.coordinator)
        self._execute(self.core.handle(ended, self.clock()))
        self.prepared, self.finished, self.running = None, None, None
        release_memory()

    def _should_stop(self, job: str) -> bool:
        self._pump(0.0)
        return self.shutdown.is_set() or self.stop_job == job

    def _on_round(self, job: str, report: RoundReport) -> None:
        self.losses.append(report.loss)
        accuracy = f" acc {report.accuracy:.4f}" if report.accuracy is not None else ""
        log.info("job %s round %d loss %.4f%s", job, report.round, report.loss, accuracy)
        event = RoundReported(job, report.round, report.loss, report.accuracy)
        self._execute(self.core.handle(event, self.clock()))

    def _publish_result(self, job: str, states: dict[str, ExecState]) -> None:
        running, finished = self.running, self.finished
        if self.prepared is None or running is None or finished is None or finished.params is None:
            return
        config, training = self.prepared
        # The fleet's final parameters, scored here on this device's test set: the metric the
        # fetched model reproduces.
        try:
            training.backend.set_params(finished.params)
            accuracy = execution.evaluate(training, training.backend.accuracy, config.eval_samples)
        except Exception:  # the user's model: the result goes out without the metric
            log.exception("job %s: the trained model could not be scored", job)
            accuracy = None
        messages = execution.result_messages(running.spec, self.config.id, running.node, training,
                                             finished, accuracy, states, self.clock())
        for topic, payload in messages:
            self._publish(topic, payload, retain=True)
        log.info("job %s: published the trained model (round %d, accuracy %s)", job,
                 finished.round, "n/a" if accuracy is None else f"{accuracy:.4f}")


def release_memory() -> None:
    """Between jobs: the job's arrays are garbage now; hand the heap's free pages back to the
    OS (glibc keeps them otherwise, and an idle device would sit on a job's peak)."""
    gc.collect()
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: the allocator keeps what it keeps


def capabilities(config: DeviceConfig, device_facts: facts.Facts) -> Capabilities:
    return Capabilities(config.id, frozenset(config.data), frozenset(device_facts.backends),
                        tuple(sorted(config.labels.items())))
