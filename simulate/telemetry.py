"""The simulator's ear on the broker: status, view, telemetry and control of one job.

Every message (and every record the simulator adds: faults, process events) becomes one line
of the run's event log (JSON lines, ``t`` = seconds since the run started). The collector keeps
just enough state to answer the run loop's questions — are all agents online, which round is
the fleet in, did anything arrive lately — and wakes waiters through a condition variable, so
readiness is decided by signals, never by fixed sleeps. Bad messages are counted, not fatal.
"""

from __future__ import annotations

import json
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

import paho.mqtt.client as mqtt

from agent.protocol.messages import Control, MessageError, Status, Telemetry, View
from agent.protocol.topics import Topics
from dashboard.settings import parse_broker_url

# The collector's reconnect back-off, doubling from the first to the second (seconds).
RECONNECT_MIN_S, RECONNECT_MAX_S = 0.05, 0.25

Record = dict[str, Any]


class EventLog:
    """Append-only JSON lines; thread-safe; keeps the records in memory for the report."""

    def __init__(self, path: Path | None, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._start = clock()
        self._lock = threading.Lock()
        self._file: IO[str] | None = open(path, "a") if path is not None else None  # noqa: SIM115
        self.records: list[Record] = []
        self.listeners: list[Callable[[Record], None]] = []  # e.g. the dashboard's feed

    def now(self) -> float:
        return self._clock() - self._start

    def add(self, type_: str, **data: Any) -> Record:
        with self._lock:
            record = {"t": round(self.now(), 4), "type": type_, **data}
            self.records.append(record)
            if self._file is not None:
                self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
                self._file.flush()
        for listener in self.listeners:
            listener(record)
        return record

    def snapshot(self) -> list[Record]:
        with self._lock:
            return list(self.records)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


class FleetWatch:
    """What the run loop waits on; updated from the collector's thread under ``cond``."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.status: dict[int, Status] = {}
        self.view: View | None = None
        self.last_round: dict[int, int] = {}  # node -> last round it reported
        self.latest: dict[int, Telemetry] = {}
        self.last_telemetry_at = time.monotonic()
        self.round_totals: list[float] = []  # per round, slowest agent's round time
        self._round_time: dict[int, float] = {}

    def online(self) -> set[int]:
        return {n for n, s in self.status.items() if s.state == "online"}

    @property
    def fleet_round(self) -> int:
        """The round the fleet is in: one past the highest round any agent finished."""
        return max(self.last_round.values(), default=-1) + 1

    def round_seconds(self) -> dict[int, float]:
        """Per round, the slowest agent's round time."""
        with self.cond:
            return dict(self._round_time)

    def median_round_seconds(self) -> float | None:
        times = sorted(self._round_time.values())
        return times[len(times) // 2] if times else None

    def on_status(self, status: Status) -> None:
        with self.cond:
            self.status[status.node] = status
            self.cond.notify_all()

    def on_view(self, view: View) -> None:
        with self.cond:
            self.view = view
            self.cond.notify_all()

    def on_telemetry(self, tel: Telemetry) -> None:
        with self.cond:
            self.latest[tel.node] = tel
            self.last_round[tel.node] = max(tel.round, self.last_round.get(tel.node, -1))
            total = float(tel.phase_seconds.get("total", 0.0))
            self._round_time[tel.round] = max(total, self._round_time.get(tel.round, 0.0))
            self.last_telemetry_at = time.monotonic()
            self.cond.notify_all()

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``predicate()`` (called under the lock) holds or ``timeout`` passes."""
        with self.cond:
            return self.cond.wait_for(predicate, timeout)

    def poke(self) -> None:
        """Wake waiters (a process exited, a signal arrived, ...)."""
        with self.cond:
            self.cond.notify_all()


class Collector:
    """A paho client subscribed to the job's status, view, telemetry and control topics.

    ``on_control`` gets Control messages the simulator did not send itself (the dashboard's
    buttons); ``publish_control`` sends one (needs credentials allowed to write ``control``).
    """

    def __init__(self, broker_url: str, topics: Topics, log: EventLog, watch: FleetWatch,
                 username: str | None = None, password: str | None = None,
                 on_control: Callable[[Control], None] | None = None, ca_file: str | None = None) -> None:
        self.address = parse_broker_url(broker_url)
        self.topics = topics
        self.log = log
        self.watch = watch
        self.on_control = on_control
        self.rejected: Counter[str] = Counter()
        # (node, round) -> CRC of the report taken: an agent that reconnects may send one again.
        self._reports: dict[tuple[int, int], int] = {}
        self._sent_controls: Counter[bytes] = Counter()
        self._connected = threading.Event()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2,
                                  client_id=f"edgegrove-simulate-{topics.job}-{id(self) % 100000}",
                                  protocol=mqtt.MQTTv311)
        if username is not None:
            self.client.username_pw_set(username, password)
        if self.address.tls:
            self.client.tls_set(ca_certs=ca_file)  # None: the system's CAs
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_subscribe
        self.client.on_disconnect = self._on_disconnect
        self._subscribe_mid = -1
        # Back within a fraction of a second of a broker restart, before the agents' first
        # rounds (20 ms each here): what is published before we subscribe again is lost to
        # the report. paho's default back-off grows to 120 s; ours reached 2 s, and a fleet
        # ran all its 20 rounds after a restart unrecorded.
        self.client.reconnect_delay_set(min_delay=RECONNECT_MIN_S, max_delay=RECONNECT_MAX_S)  # type: ignore[arg-type]

    def start(self, timeout: float = 20.0) -> None:
        self.client.connect(self.address.host, self.address.port, keepalive=30)
        self.client.loop_start()
        if not self._connected.wait(timeout):
            self.client.loop_stop()
            raise ConnectionError(
                f"the simulator could not subscribe at {self.address.host}:{self.address.port} "
                f"within {timeout:.0f} s (wrong credentials or broker down?)"
            )

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def publish_control(self, control: Control) -> None:
        payload = control.encode()
        with self.watch.cond:
            self._sent_controls[payload] += 1
        self.client.publish(self.topics.control, payload, qos=1).wait_for_publish(10)

    # -- paho callbacks (paho's thread: decode, record, notify; nothing slow) -----------------

    def _on_connect(self, client: mqtt.Client, _userdata: Any, _flags: Any, reason: Any,
                    _properties: Any = None) -> None:
        if getattr(reason, "is_failure", False):
            self.log.add("collector", event="connect_refused", reason=str(reason))
            return
        t = self.topics
        _, mid = client.subscribe([(t.all_status(), 1), (t.all_views(), 1), (t.all_telemetry(), 0), (t.control, 1)])
        self._subscribe_mid = -1 if mid is None else mid
        if self._connected.is_set():  # a reconnect (the broker restarted): in the run's record
            self.log.add("collector", event="reconnected")
        self._connected.set()

    def _on_subscribe(self, _client: mqtt.Client, _userdata: Any, mid: int, reason_codes: Any,
                      _properties: Any = None) -> None:
        refused = [str(code) for code in reason_codes if getattr(code, "is_failure", False)]
        if mid == self._subscribe_mid and refused:
            self.log.add("collector", event="subscribe_refused", reasons=refused)

    def _on_disconnect(self, _client: mqtt.Client, _userdata: Any, _flags: Any, reason: Any,
                       _properties: Any = None) -> None:
        self.log.add("collector", event="disconnected", reason=str(reason))

    def _on_message(self, _client: mqtt.Client, _userdata: Any, msg: mqtt.MQTTMessage) -> None:
        try:
            self._dispatch(msg.topic, bytes(msg.payload))
        except MessageError as exc:
            self.rejected[exc.reason] += 1

    def _dispatch(self, topic: str, payload: bytes) -> None:
        t = self.topics
        if t.parse_telemetry(topic) is not None:
            tel = Telemetry.decode(payload)
            digest = zlib.crc32(payload)
            if self._reports.get((tel.node, tel.round)) == digest:
                self.rejected["telemetry_repeat"] += 1  # the same report twice: one reporter
                return
            self._reports[(tel.node, tel.round)] = digest
            self.log.add("telemetry", **asdict(tel))
            self.watch.on_telemetry(tel)
        elif t.parse_status(topic) is not None:
            if not payload:
                return  # a cleared retained status
            status = Status.decode(payload)
            # The status's own round may be stale (a Will's, a checkpoint's): note the fleet's.
            self.log.add("status", fleet_round=self.watch.fleet_round, **asdict(status))
            self.watch.on_status(status)
        elif t.is_view(topic):
            if not payload:
                return
            view = View.decode(payload)
            self.log.add("view", **asdict(view))
            self.watch.on_view(view)
        elif topic == t.control:
            self._control(payload)

    def _control(self, payload: bytes) -> None:
        control = Control.decode(payload)
        with self.watch.cond:
            own = self._sent_controls[payload] > 0
            if own:
                self._sent_controls[payload] -= 1
        self.log.add("control", source="simulator" if own else "external", **asdict(control))
        if not own and self.on_control is not None:
            self.on_control(control)
