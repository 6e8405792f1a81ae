"""Each node's own series, round by round: round time, CPU, memory and link bytes.

What the charts add when the operator picks a node (``GET /api/nodes/{node}/series``). Kept
beside the FleetState by the store (the reducer's state stays small): compact arrays, at most
``max_points`` rounds per node (the latest; ``dropped`` says how many older ones went), and
node ids are bounded by the message validation (0..1023), so the memory is bounded too:
about 48 bytes a round, 192 KB per node at the default 4,096 rounds.
"""

from __future__ import annotations

import bisect
import math
from array import array
from dataclasses import dataclass

from agent.protocol.messages import Telemetry

DEFAULT_MAX_POINTS = 4096
_NONE = math.nan  # "not said" in a float array


@dataclass(frozen=True)
class NodePoint:
    round: int
    round_seconds: float | None  # the node's phase_seconds["total"]
    cpu_percent: float | None  # of one core, since its previous report
    rss_bytes: int | None
    bytes_sent: int
    bytes_received: int


class _Series:
    """One node's rounds, in round order, in parallel arrays."""

    def __init__(self) -> None:
        self.rounds = array("q")
        self.seconds = array("d")
        self.cpu = array("d")
        self.rss = array("q")
        self.sent = array("q")
        self.received = array("q")
        self.dropped = 0

    def columns(self) -> tuple[array, ...]:
        return self.rounds, self.seconds, self.cpu, self.rss, self.sent, self.received

    def put(self, values: tuple[int, float, float, int, int, int], max_points: int) -> None:
        round_no = values[0]
        at = len(self.rounds)
        if at and round_no <= self.rounds[-1]:  # late, or a round reported again
            at = bisect.bisect_left(self.rounds, round_no)
            if at < len(self.rounds) and self.rounds[at] == round_no:
                for column, value in zip(self.columns(), values, strict=True):
                    column[at] = value
                return
            if at == 0 and self.dropped:
                return  # older than what is kept: it went already
        for column, value in zip(self.columns(), values, strict=True):
            column.insert(at, value)
        excess = len(self.rounds) - max_points
        if excess > 0:
            excess = max(excess, max_points // 8)  # trim in batches: deleting is a copy
            for column in self.columns():
                del column[:excess]
            self.dropped += excess

    def point(self, i: int) -> NodePoint:
        seconds, cpu, rss = self.seconds[i], self.cpu[i], self.rss[i]
        return NodePoint(self.rounds[i], None if math.isnan(seconds) else seconds,
                         None if math.isnan(cpu) else cpu, rss if rss > 0 else None,
                         self.sent[i], self.received[i])


@dataclass(frozen=True)
class SeriesPage:
    node: int
    points: list[NodePoint]
    first_round: int | None  # the node's first round kept
    last_round: int | None
    dropped: int  # older rounds let go (past max_points)


class NodeSeriesBook:
    def __init__(self, max_points: int = DEFAULT_MAX_POINTS) -> None:
        if max_points < 8:
            raise ValueError("max_points must be at least 8")
        self.max_points = max_points
        self._series: dict[int, _Series] = {}

    def add(self, msg: Telemetry) -> None:
        total = msg.phase_seconds.get("total")
        seconds = float(total) if isinstance(total, (int, float)) and math.isfinite(total) else _NONE
        cpu = msg.cpu_percent if msg.cpu_percent is not None else _NONE
        series = self._series.setdefault(msg.node, _Series())
        series.put((msg.round, seconds, cpu, msg.rss_bytes, msg.bytes_sent, msg.bytes_received),
                   self.max_points)

    def nodes(self) -> list[int]:
        return sorted(self._series)

    def __contains__(self, node: int) -> bool:
        return node in self._series

    def page(self, node: int, since: int | None = None, before: int | None = None,
             limit: int | None = None) -> SeriesPage:
        """Rounds with since < round < before, oldest first: the first ``limit`` after
        ``since``, or without ``since`` the last ``limit`` (paging back), as /api/rounds."""
        series = self._series.get(node)
        if series is None:
            return SeriesPage(node, [], None, None, 0)
        rounds = series.rounds
        lo = 0 if since is None else bisect.bisect_right(rounds, since)
        hi = len(rounds) if before is None else bisect.bisect_left(rounds, before)
        if limit is not None and hi - lo > limit:
            lo, hi = (hi - limit, hi) if since is None else (lo, lo + limit)
        return SeriesPage(node, [series.point(i) for i in range(lo, max(lo, hi))],
                          rounds[0] if rounds else None, rounds[-1] if rounds else None,
                          series.dropped)
