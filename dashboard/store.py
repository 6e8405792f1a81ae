"""Holds the current FleetState: decodes raw MQTT messages, runs the reducer, logs events.

The only mutable object between the MQTT listener and the web handlers. Everything runs on
the server's event loop, so no lock is needed; ``changed`` wakes WebSocket pushers.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import logging
import zlib
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import IO

from agent.jobs import topics as device_topics
from agent.protocol.messages import Control, MessageError, Status, Telemetry, View
from agent.protocol.topics import Topics
from dashboard.bridges import apply_bridge, notification_report
from dashboard.device_logs import DeviceLogBook, place_of
from dashboard.directory import Directory, is_directory_topic, take
from dashboard.node_series import DEFAULT_MAX_POINTS, NodeSeriesBook
from dashboard.records import Record, apply_operator, apply_record, telemetry_record
from dashboard.state import (
    FleetEvent,
    FleetState,
    Result,
    RoundSummary,
    apply_malformed,
    apply_status,
    apply_telemetry,
    apply_view,
    tick,
)

log = logging.getLogger(__name__)
REPORTS_REMEMBERED = 16  # rounds per node whose report a resend could repeat


class FleetStore:
    def __init__(
        self,
        topics: Topics,
        initial: FleetState,
        clock: Callable[[], float],
        event_log: Path | None = None,
        wall_offset: float = 0.0,
        max_history: int = 1_000_000,
        max_node_points: int = DEFAULT_MAX_POINTS,
    ) -> None:
        self.topics = topics
        self.state = initial
        self._clock = clock
        self._log_path = event_log
        self._wall_offset = wall_offset  # event log lines carry Unix time, like the API
        self._log_file: IO[str] | None = None
        self._waiters: set[asyncio.Event] = set()
        # Every event of the run, oldest first (the state keeps only its last max_events):
        # the timeline and the charts' marks page through it. Past max_history the oldest
        # go, and ``history_dropped`` says how many.
        self.history: list[FleetEvent] = []
        self.history_dropped = 0
        self._max_history = max_history
        # Every round of the run: the state keeps its last max_rounds (what the page gets
        # pushed); rounds it lets go are kept here, served paged by /api/rounds.
        self.round_archive: dict[int, RoundSummary] = {}
        # Each node's last reports by round: a checksum of the payload. A reliable (QoS 1)
        # report the agent resends under load can reach us twice; it is one report.
        self._reports: dict[int, dict[int, int]] = {}
        # Each node's own rounds (round time, CPU, memory, bytes): the charts' per-node series.
        self.node_series = NodeSeriesBook(max_node_points)
        # The devices and jobs the broker's retained topics tell of (agent.jobs' wire).
        self.directory = Directory()
        # The devices' warnings and errors (edgegrove/devices/<device>/log), placed at their round.
        self.device_logs = DeviceLogBook()

    def ingest(self, topic: str, payload: bytes) -> tuple[FleetEvent, ...]:
        """One raw MQTT message. Anything malformed is counted by reason, never raised."""
        now = self._clock()
        if (device := device_topics.parse_device_log(topic)) is not None:
            place = place_of(device, self.directory, self.state, self.topics.job)
            self.device_logs.add(device, payload, now, place)
            return ()
        if is_directory_topic(topic):
            self.directory = take(self.directory, topic, payload, now)
            self.wake_all()
            return ()
        try:
            result = self._reduce(topic, payload, now)
        except MessageError as exc:
            result = apply_malformed(self.state, exc.reason, now)
        return self._commit(result)

    def count_malformed(self, reason: str) -> None:
        """A message dropped before decoding (too large, queue overflow, internal error)."""
        self._commit(apply_malformed(self.state, reason, self._clock()))

    def tick(self) -> tuple[FleetEvent, ...]:
        return self._commit(tick(self.state, self._clock()))

    def tick_at(self, now: float) -> tuple[FleetEvent, ...]:
        """A silence check at a given time (a replay's recorded clock)."""
        return self._commit(tick(self.state, now))

    def ingest_record(self, record: Record, now: float | None = None) -> tuple[FleetEvent, ...]:
        """One simulator record (live from the simulator, or a replayed line)."""
        now = self._clock() if now is None else now
        telemetry = telemetry_record(record)
        if telemetry is None:
            return self._commit(apply_record(self.state, record, now))
        self.node_series.add(telemetry)
        return self._commit(apply_telemetry(self.state, telemetry, now))

    def operator_command(self, control: Control, by: str = "") -> tuple[FleetEvent, ...]:
        """The operator's command, sent from the dashboard: its mark and its incident, and
        who sent it (the audit line of the event log)."""
        return self._commit(apply_operator(self.state, control.action, control.node, control.peer,
                                           control.value, self._clock(), by))

    def events_page(self, since: int | None = None, before: int | None = None,
                    limit: int | None = None) -> list[FleetEvent]:
        """Events with since < seq < before: the first ``limit`` of them after ``since``, or
        without ``since`` the last ``limit`` (before ``before``: paging back)."""
        lo = 0 if since is None else bisect.bisect_right(self.history, since, key=_seq)
        hi = len(self.history) if before is None else bisect.bisect_left(self.history, before, key=_seq)
        if limit is None or hi - lo <= limit:
            return self.history[lo:hi]
        return self.history[hi - limit:hi] if since is None else self.history[lo:lo + limit]

    def rounds_page(self, since: int | None = None, before: int | None = None,
                    limit: int | None = None) -> list[RoundSummary]:
        """Rounds with since < round < before, oldest first, from the whole run: the first
        ``limit`` after ``since``, or without ``since`` the last ``limit`` (paging back)."""
        merged = {**self.round_archive, **self.state.rounds}
        keys = sorted(r for r in merged
                      if (since is None or r > since) and (before is None or r < before))
        if limit is not None and len(keys) > limit:
            keys = keys[-limit:] if since is None else keys[:limit]
        return [merged[r] for r in keys]

    @property
    def first_round(self) -> int | None:
        """The run's first round the server holds (the archive's, else the state's)."""
        if self.round_archive:
            return min(self.round_archive)
        return min(self.state.rounds) if self.state.rounds else None

    def subscribe(self) -> asyncio.Event:
        """An Event set on every change; the caller clears it after reading the state."""
        event = asyncio.Event()
        self._waiters.add(event)
        return event

    def wake_all(self) -> None:
        for waiter in self._waiters:
            waiter.set()

    def unsubscribe(self, event: asyncio.Event) -> None:
        self._waiters.discard(event)

    def close(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def _reduce(self, topic: str, payload: bytes, now: float) -> Result:
        if self.topics.is_view(topic):
            return apply_view(self.state, View.decode(payload), now)
        node = self.topics.parse_status(topic)
        if node is not None:
            status = Status.decode(payload)
            _check_sender(node, status.node)
            return apply_status(self.state, status, now)
        node = self.topics.parse_telemetry(topic)
        if node is not None:
            telemetry = Telemetry.decode(payload)
            _check_sender(node, telemetry.node)
            if self._repeated(telemetry, payload):
                raise MessageError("telemetry_repeat", f"node {node} round {telemetry.round} again")
            self.node_series.add(telemetry)
            return apply_telemetry(self.state, telemetry, now)
        site = self.topics.parse_bridge(topic)
        if site is not None:
            return apply_bridge(self.state, notification_report(site, payload), now)
        raise MessageError("unknown_topic", topic[:100])

    def _commit(self, result: Result) -> tuple[FleetEvent, ...]:
        previous, before = self.state.version, self.state.rounds
        self.state, events = result
        if self.state.rounds is not before and len(before) >= self.state.max_rounds:
            self._archive_dropped(before)
        if events:
            self._append_log(events)
            self.history.extend(events)
            excess = len(self.history) - self._max_history
            if excess > 0:
                del self.history[:excess]
                self.history_dropped += excess
        if self.state.version != previous:
            for waiter in self._waiters:
                waiter.set()
        return events

    def _repeated(self, telemetry: Telemetry, payload: bytes) -> bool:
        """The same report (byte for byte) of a node's round seen before; remembers it."""
        recent = self._reports.setdefault(telemetry.node, {})
        digest = zlib.crc32(payload)
        if recent.get(telemetry.round) == digest:
            return True
        recent[telemetry.round] = digest
        if len(recent) > REPORTS_REMEMBERED:
            del recent[min(recent)]
        return False

    def _archive_dropped(self, before: Mapping[int, RoundSummary]) -> None:
        """Keep the rounds the state's ring buffer let go (its oldest)."""
        for round_no in before.keys() - self.state.rounds.keys():
            self.round_archive[round_no] = before[round_no]

    def _append_log(self, events: tuple[FleetEvent, ...]) -> None:
        if self._log_path is None:
            return
        try:
            if self._log_file is None:
                self._log_path.parent.mkdir(parents=True, exist_ok=True)
                self._log_file = self._log_path.open("a", encoding="utf-8")
            for event in events:
                line = {**asdict(event), "time": round(event.time + self._wall_offset, 3)}
                self._log_file.write(json.dumps(line, separators=(",", ":")) + "\n")
            self._log_file.flush()
        except OSError as exc:
            log.error("event log %s not writable (%s); logging to it stops", self._log_path, exc)
            self._log_path = None


def _check_sender(topic_node: int, message_node: int) -> None:
    if topic_node != message_node:
        raise MessageError("node_mismatch", f"topic says {topic_node}, message {message_node}")


def _seq(event: FleetEvent) -> int:
    return event.seq
