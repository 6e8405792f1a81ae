"""The devices' warnings and errors, as they arrive on ``edgegrove/devices/<device>/log``.

A device sends its WARNING-and-above lines there (agent.device.logs.LogForwarder: rate-limited,
a line says how many it dropped before it). The dashboard keeps the last MAX_LINES of the
fleet, each numbered (``seq``, for ``?since=``) and placed at the round its device was in when
the line arrived: the node's latest round in the job this dashboard follows, else the round
of the device's execution of its job as the broker holds it.
"""

from __future__ import annotations

import enum
import json
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass

from dashboard.directory import Directory
from dashboard.state import FleetState

MAX_LINES = 20_000
MAX_LINE_CHARS = 500  # what the device sends at most; longer is cut
PAGE = 500


class LogLevel(enum.IntEnum):
    """A line's level; a filter shows its level and above."""

    WARNING = 30
    ERROR = 40
    CRITICAL = 50

    @classmethod
    def named(cls, name: str) -> LogLevel:
        try:
            return cls[name.upper()]
        except KeyError:
            raise ValueError(f"log level {name!r}: use warning, error or critical") from None


@dataclass(frozen=True)
class DeviceLogLine:
    seq: int
    device: str
    level: LogLevel
    logger: str
    line: str
    sent_at: float | None  # the device's clock (Unix time), if it said
    heard_at: float  # the dashboard's clock
    job: str | None
    node: int | None  # its node in that job
    round: int | None
    dropped: int  # lines the device dropped (its rate limit) just before this one


@dataclass(frozen=True)
class Place:
    """Where a device was when a line of it arrived (None: not in a job, or not known)."""

    job: str | None = None
    node: int | None = None
    round: int | None = None


@dataclass(frozen=True)
class LogQuery:
    since: int | None = None
    device: str | None = None
    level: LogLevel = LogLevel.WARNING
    text: str = ""  # case-insensitive, in the line or its logger
    limit: int = PAGE

    def matches(self, line: DeviceLogLine) -> bool:
        return ((self.since is None or line.seq > self.since)
                and (self.device is None or line.device == self.device)
                and line.level >= self.level
                and (not self.text or self.text.lower() in f"{line.logger} {line.line}".lower()))


class DeviceLogBook:
    """The fleet's last MAX_LINES device log lines, oldest first."""

    def __init__(self, max_lines: int = MAX_LINES) -> None:
        self.lines: deque[DeviceLogLine] = deque(maxlen=max_lines)
        self.next_seq = 1
        self.unreadable = 0
        self.devices: set[str] = set()
        # Every line heard since the start (the ring keeps the last MAX_LINES): /metrics.
        self.heard: Counter[tuple[str, LogLevel]] = Counter()
        self.dropped: Counter[str] = Counter()  # lines the devices said they dropped

    def add(self, device: str, payload: bytes, heard_at: float, place: Place) -> DeviceLogLine | None:
        """One message of a device's log topic (None: it did not parse, and is counted)."""
        try:
            level, logger, text, sent_at, dropped = _fields(payload)
        except ValueError:
            self.unreadable += 1
            return None
        line = DeviceLogLine(self.next_seq, device, level, logger, text, sent_at, heard_at, place.job, place.node,
                             place.round, dropped)
        self.next_seq += 1
        self.lines.append(line)
        self.devices.add(device)
        self.heard[device, level] += 1
        self.dropped[device] += dropped
        return line

    def page(self, query: LogQuery) -> list[DeviceLogLine]:
        """The matching lines, oldest first: the first ``limit`` after ``since``, or without
        ``since`` the last ``limit``."""
        found = [line for line in self.lines if query.matches(line)]
        return found[:query.limit] if query.since is not None else found[-query.limit:]


def place_of(device: str, directory: Directory, state: FleetState, followed_job: str) -> Place:
    """The job a device is in, its node and its round now: the node's own latest round when
    the job is the one this dashboard follows, else its execution's round on the broker."""
    entry = directory.devices.get(device)
    if entry is None or entry.record.job is None:
        return Place()
    job, node = entry.record.job, entry.record.node
    if job == followed_job and node is not None and node in state.nodes:
        return Place(job, node, state.nodes[node].last_round)
    execution = directory.jobs[job].execs.get(device) if job in directory.jobs else None
    return Place(job, node, execution.round if execution is not None else None)


def _fields(payload: bytes) -> tuple[LogLevel, str, str, float | None, int]:
    """Level, logger, line, the device's time and its dropped count (ValueError: not a line)."""
    try:
        data = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError("not JSON") from None
    if not isinstance(data, Mapping) or not isinstance(data.get("line"), str):
        raise ValueError("no line")
    sent_at = data.get("time")
    dropped = data.get("dropped", 0)
    return (LogLevel.named(str(data.get("level", "warning"))), str(data.get("logger", ""))[:100],
            data["line"][:MAX_LINE_CHARS],
            float(sent_at) if isinstance(sent_at, int | float) and not isinstance(sent_at, bool) else None,
            dropped if isinstance(dropped, int) and not isinstance(dropped, bool) and dropped >= 0 else 0)
