"""The simulator's ear on the devices of a `--via-devices` run: their retained records, their
executions of the run's job and the job's result manifest.

Each message becomes a line of the run's event log (``device``, ``exec``, ``result``), and the
answers the run loop needs — are the devices up, where is each device's execution, is the
result published — are read under the fleet watch's condition, which every update notifies, so
the loop waits on signals, never on sleeps.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

import paho.mqtt.client as mqtt
from pydantic import ValidationError

from agent.jobs import topics as jt
from agent.jobs.document import DeviceRecord, ExecStatus, ResultManifest
from agent.jobs.states import DeviceState, ExecState
from dashboard.settings import parse_broker_url
from simulate.telemetry import RECONNECT_MAX_S, RECONNECT_MIN_S, EventLog, FleetWatch


class DeviceWatch:
    """A paho client subscribed to every device record and to one job's executions and result."""

    def __init__(self, broker_url: str, job: str, log: EventLog, watch: FleetWatch,
                 username: str | None = None, password: str | None = None,
                 ca_file: str | None = None) -> None:
        self.address = parse_broker_url(broker_url)
        self.job = job
        self.log = log
        self.watch = watch
        self.records: dict[str, DeviceRecord] = {}
        self.execs: dict[str, ExecStatus] = {}  # device -> its latest exec status of the job
        self.history: dict[str, list[str]] = {}  # device -> the states it went through, in order
        self.result: ResultManifest | None = None
        self.rejected = 0  # messages that did not parse
        self._connected = threading.Event()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2,
                                  client_id=f"edgegrove-simulate-devices-{job}-{id(self) % 100000}",
                                  protocol=mqtt.MQTTv311)
        if username is not None:
            self.client.username_pw_set(username, password)
        if self.address.tls:
            self.client.tls_set(ca_certs=ca_file)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.reconnect_delay_set(min_delay=RECONNECT_MIN_S, max_delay=RECONNECT_MAX_S)  # type: ignore[arg-type]

    def start(self, timeout: float = 20.0) -> None:
        self.client.connect(self.address.host, self.address.port, keepalive=30)
        self.client.loop_start()
        if not self._connected.wait(timeout):
            self.client.loop_stop()
            raise ConnectionError(f"the simulator could not subscribe to the device records at "
                                  f"{self.address.host}:{self.address.port} within {timeout:.0f} s")

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    # -- questions (under the fleet watch's lock) ----------------------------------------------

    def up(self, devices: Iterable[str]) -> list[str]:
        """Those of ``devices`` whose record says they are up and idle."""
        with self.watch.cond:
            return [d for d in devices if (r := self.records.get(d)) is not None
                    and r.state == DeviceState.IDLE]

    def state_of(self, device: str) -> ExecState | None:
        with self.watch.cond:
            status = self.execs.get(device)
            return None if status is None else status.state

    def states(self) -> dict[str, list[str]]:
        with self.watch.cond:
            return {d: list(h) for d, h in self.history.items()}

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        return self.watch.wait_for(predicate, timeout)

    # -- paho callbacks -------------------------------------------------------------------------

    def _on_connect(self, client: mqtt.Client, _userdata: Any, _flags: Any, reason: Any,
                    _properties: Any = None) -> None:
        if getattr(reason, "is_failure", False):
            self.log.add("collector", event="devices_connect_refused", reason=str(reason))
            return
        client.subscribe([(jt.all_device_records(), 1), (jt.job_execs(self.job), 1),
                          (jt.job_result(self.job), 1)])
        self._connected.set()

    def _on_message(self, _client: mqtt.Client, _userdata: Any, msg: mqtt.MQTTMessage) -> None:
        payload = bytes(msg.payload)
        if not payload:
            return
        try:
            self._dispatch(msg.topic, payload)
        except (ValidationError, ValueError):
            with self.watch.cond:
                self.rejected += 1

    def _dispatch(self, topic: str, payload: bytes) -> None:
        if jt.parse_device_record(topic) is not None:
            record = DeviceRecord.model_validate_json(payload)
            with self.watch.cond:
                before = self.records.get(record.id)
                self.records[record.id] = record
                self.watch.cond.notify_all()
            if before is None or (before.state, before.job) != (record.state, record.job):
                self.log.add("device", device=record.id, state=str(record.state), job=record.job,
                             node=record.node, refused=dict(record.refused))
        elif jt.parse_job_exec(topic) is not None:
            status = ExecStatus.model_validate_json(payload)
            with self.watch.cond:
                self.execs[status.device] = status
                history = self.history.setdefault(status.device, [])
                if not history or history[-1] != status.state:
                    history.append(str(status.state))
                self.watch.cond.notify_all()
            self.log.add("exec", **status.model_dump(mode="json"))
        elif jt.parse_job_result(topic) == self.job:
            manifest = ResultManifest.model_validate_json(payload)
            with self.watch.cond:
                self.result = manifest
                self.watch.cond.notify_all()
            self.log.add("result", job=manifest.job, device=manifest.device, node=manifest.node,
                         round=manifest.round, accuracy=manifest.accuracy, loss=manifest.loss,
                         model_hash=manifest.model_hash)
