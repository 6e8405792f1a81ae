"""Sites' bridges to the core broker, as the dashboard sees them. PURE, like state.py.

Two sources report a bridge, each through one validated model, ``BridgeReport``:
  * the broker: mosquitto publishes its bridge's state, retained, on the job's
    ``bridge/<site>`` topic ("1" connected, "0" not; ``notification_topic`` in
    broker-config/make-sites), on the site's broker and on the core the dashboard reads;
  * the simulator (``simulate --sites``): its ``uplinks`` records, the bytes each site's
    uplink proxy carried each way and which uplinks it has cut.
The broker's word on the state wins once heard: the simulator's "not cut" only says the
uplink is back, not that the bridge has redialled. Bytes come from the simulator alone; a
rate is measured over at least ``RATE_WINDOW`` seconds of counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent.protocol.messages import MessageError
from dashboard.kinds import EventKind
from dashboard.state import (
    BridgeInfo,
    BridgeState,
    Draft,
    FleetEvent,
    FleetState,
    Result,
    with_events,
)

MAX_SITES = 64  # bridges the state keeps: a flood of invented site names stops here
RATE_WINDOW = 1.0  # s: byte counts closer together than this would make a noisy rate
INVALID = "bridge_invalid"
_NOTIFICATION = {b"1": True, b"0": False}


class BridgeReport(BaseModel):
    """What one source says about one site's bridge; a field left None says nothing."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    site: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,32}$")
    source: Literal["broker", "simulator"]
    connected: bool | None = None
    bytes_up: int | None = Field(None, ge=0, le=2**63 - 1, description="to the core, total")
    bytes_down: int | None = Field(None, ge=0, le=2**63 - 1, description="from the core, total")


def notification_report(site: str, payload: bytes) -> BridgeReport:
    """A broker's bridge notification; MessageError for anything but "1" or "0"."""
    connected = _NOTIFICATION.get(payload.strip())
    if connected is None:
        raise MessageError(INVALID, f"bridge {site[:32]}: payload {payload[:16]!r}")
    return _validated({"site": site, "source": "broker", "connected": connected})


def uplink_reports(record: Mapping[str, object]) -> list[BridgeReport]:
    """The simulator's ``uplinks`` record: ``bytes`` site -> [up, down] and ``cut`` (sites
    whose uplink it cut; absent in runs before it said so). MessageError if malformed."""
    counts, cut = record.get("bytes"), record.get("cut", None)
    if not isinstance(counts, Mapping) or len(counts) > MAX_SITES:
        raise MessageError(INVALID, "uplinks: bytes must map at most 64 sites to [up, down]")
    if cut is not None and not isinstance(cut, list):
        raise MessageError(INVALID, "uplinks: cut must be a list of sites")
    reports = []
    for site, pair in counts.items():
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            raise MessageError(INVALID, f"uplinks: {str(site)[:32]} needs [up, down]")
        reports.append(_validated({
            "site": site, "source": "simulator", "bytes_up": pair[0], "bytes_down": pair[1],
            "connected": None if cut is None else site not in cut}))
    return reports


def _validated(raw: Mapping[str, object]) -> BridgeReport:
    try:
        return BridgeReport.model_validate(raw)
    except ValidationError as exc:
        raise MessageError(INVALID, str(exc.errors()[0]["msg"])[:200]) from None


def apply_bridge(state: FleetState, report: BridgeReport, now: float) -> Result:
    """One report: the bridge's state (an event when it changes) and its bytes and rates."""
    old = state.bridges.get(report.site)
    if old is None and len(state.bridges) >= MAX_SITES:
        raise MessageError(INVALID, f"more than {MAX_SITES} sites")
    bridge = _with_bytes(old or BridgeInfo(report.site), report, now)
    bridge, drafts = _with_connection(bridge, report, now, state.fleet_round)
    bridges = dict(state.bridges)
    bridges[report.site] = bridge
    return with_events(replace(state, bridges=MappingProxyType(bridges)), drafts, now)


def apply_bridges(state: FleetState, reports: list[BridgeReport], now: float) -> Result:
    """Several reports at once (one simulator record): all of them, or MessageError."""
    events: tuple[FleetEvent, ...] = ()
    for report in reports:
        state, new = apply_bridge(state, report, now)
        events += new
    return state, events


def _with_connection(bridge: BridgeInfo, report: BridgeReport, now: float,
                     round_no: int | None) -> tuple[BridgeInfo, list[Draft]]:
    if report.connected is None or (report.source == "simulator" and bridge.source == "broker"):
        return bridge, []
    state: BridgeState = "up" if report.connected else "down"
    if state == bridge.state:
        return replace(bridge, source=report.source), []
    changed = replace(bridge, state=state, source=report.source, since=now,
                      downs=bridge.downs + (state == "down"))
    if bridge.state == "unknown" and state == "up":
        return changed, []  # a bridge seen for the first time, working: not news
    said = "the broker says" if report.source == "broker" else "the simulator's uplink"
    detail = f"site {bridge.site}: bridge {bridge.state} -> {state} ({said})"
    kind = EventKind.BRIDGE_UP if state == "up" else EventKind.BRIDGE_DOWN
    return changed, [Draft(kind, None, None, round_no, detail)]


def _with_bytes(bridge: BridgeInfo, report: BridgeReport, now: float) -> BridgeInfo:
    up, down = report.bytes_up, report.bytes_down
    if up is None or down is None:
        return bridge
    base = bridge.rate_base
    if base is not None and (up < base[0] or down < base[1]):
        base = None  # the counters started again: no rate until the next window
    counted = replace(bridge, bytes_up=up, bytes_down=down, sampled_at=now)
    if base is None:
        return replace(counted, rate_up=None, rate_down=None, rate_base=(up, down, now))
    seconds = now - base[2]
    if seconds < RATE_WINDOW:
        return counted
    return replace(counted, rate_up=(up - base[0]) / seconds, rate_down=(down - base[1]) / seconds,
                   rate_base=(up, down, now))
