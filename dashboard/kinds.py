"""The kinds the dashboard speaks of, each a closed set, and how the page shows them.

- ``NoteKind`` (agent/protocol/notes.py): what an agent notes in its telemetry.
- ``EventKind``: the dashboard's own timeline events (a node joined or crashed, a link failed,
  the simulator healed a fault, the run ended). Its values are not NoteKind's: with NoteKind it
  is ``Kind``, the closed set of the timeline.
- ``IncidentKind``: what an incident is about: the simulator's fault kinds (scenario.py's
  FAULT_KINDS), and a node running another model.

The page reads every kind, and each table keyed by one, from ``/kinds.js``, which ``page_module``
writes from the enums here: no kind is spelled in the page's JavaScript.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from typing import Literal

from agent.jobs.states import DeviceState, ExecState
from agent.protocol.notes import NoteKind
from dashboard.directory import JobState


class EventKind(enum.StrEnum):
    JOIN = "join"
    CRASH = "crash"  # offline while in the view
    OFFLINE = "offline"  # offline outside the view
    EXIT = "exit"  # offline because the run is over for it
    HUNG = "hung"  # silent long after the fleet moved on (suspected: NoteKind.SUSPECTED)
    RECOVERED = "recovered"  # reports again after it was suspected or hung
    VIEW_CHANGE = "view_change"
    MODEL_MISMATCH = "model_mismatch"
    LINK_OK = "link_ok"
    LINK_SUSPECTED = "link_suspected"
    LINK_REROUTED = "link_rerouted"
    LINK_FAILED = "link_failed"
    BRIDGE_UP = "bridge_up"
    BRIDGE_DOWN = "bridge_down"
    # The simulator injected a fault: NoteKind.FAULT_INJECTED; the agents' own note of that
    # name (a Control applied) is shown as CONTROL_APPLIED.
    FAULT_HEALED = "fault_healed"
    FAULT_RECOVERED = "fault_recovered"  # the fleet shows its targets back
    CONTROL = "control"  # the outcome of an operator's command
    CONTROL_APPLIED = "control_applied"
    RUN_END = "run_end"
    UNKNOWN = "unknown"  # an agent's note of no kind we know (its text leads the detail)


Kind = NoteKind | EventKind


class IncidentKind(enum.StrEnum):
    LINK = "link"
    CRASH = "crash"
    HANG = "hang"
    LOSS = "loss"
    LATENCY = "latency"
    BANDWIDTH = "bandwidth"
    FLAP = "flap"
    ISOLATE = "isolate"
    BROKER_RESTART = "broker-restart"
    BRIDGE_CUT = "bridge-cut"
    SITE_BROKER_RESTART = "site-broker-restart"
    MODEL = "model"  # a node running another model than the fleet's
    LIAR = "liar"  # a node its parent left out for lying about its contribution (NoteKind.LIAR)


def note_kind(text: str) -> NoteKind | None:
    """The agent's note of this name, or None: an agent speaks only NoteKind."""
    try:
        return NoteKind(text)
    except ValueError:
        return None


# ---------------------------------------------------------------- the page's view of the kinds

# The colour of an event's badge on the timeline: a node or link state's (app.js COLORS).
Badge = Literal["ok", "suspected", "failed", "rerouted", "joining", "rejoining", "hung", "offline"]
BADGES: Mapping[Kind, Badge] = {
    EventKind.CRASH: "failed", EventKind.OFFLINE: "offline", EventKind.EXIT: "offline",
    EventKind.LINK_FAILED: "failed", NoteKind.TIMEOUT: "suspected", EventKind.LINK_SUSPECTED: "suspected",
    NoteKind.SUSPECTED: "suspected", EventKind.HUNG: "hung", NoteKind.REROUTE: "rerouted",
    EventKind.LINK_REROUTED: "rerouted", NoteKind.DEGRADED: "suspected", NoteKind.REJOIN: "rejoining",
    EventKind.JOIN: "joining", EventKind.VIEW_CHANGE: "joining", EventKind.LINK_OK: "ok",
    EventKind.RECOVERED: "ok", NoteKind.RESYNC: "rejoining", NoteKind.PULL: "rerouted",
    NoteKind.NACK: "suspected", NoteKind.LINK_DEAD: "failed", NoteKind.LINK_HEALED: "ok",
    NoteKind.FAULT_INJECTED: "failed", EventKind.FAULT_HEALED: "ok", EventKind.CONTROL: "joining",
    EventKind.RUN_END: "offline", EventKind.CONTROL_APPLIED: "joining", EventKind.MODEL_MISMATCH: "failed",
    EventKind.FAULT_RECOVERED: "ok", EventKind.BRIDGE_DOWN: "failed", EventKind.BRIDGE_UP: "ok",
}
# The timeline's filters (besides "all"): the kinds each shows.
FILTERS: Mapping[str, frozenset[Kind]] = {
    "faults": frozenset({
        NoteKind.FAULT_INJECTED, EventKind.FAULT_HEALED, EventKind.FAULT_RECOVERED, EventKind.CRASH,
        EventKind.HUNG, NoteKind.SUSPECTED, EventKind.RECOVERED, NoteKind.REJOIN, EventKind.CONTROL,
        EventKind.CONTROL_APPLIED, EventKind.LINK_FAILED, EventKind.RUN_END, EventKind.OFFLINE,
        EventKind.BRIDGE_DOWN, EventKind.BRIDGE_UP}),
    "membership": frozenset({
        EventKind.JOIN, NoteKind.REJOIN, EventKind.OFFLINE, EventKind.EXIT, EventKind.CRASH,
        EventKind.VIEW_CHANGE, NoteKind.RESYNC, EventKind.RUN_END}),
    "links": frozenset({
        EventKind.LINK_FAILED, EventKind.LINK_REROUTED, EventKind.LINK_SUSPECTED, EventKind.LINK_OK,
        NoteKind.LINK_DEAD, NoteKind.LINK_HEALED, NoteKind.REROUTE, NoteKind.TIMEOUT}),
}
# Per-chunk notes, many a round: the timeline collapses each kind into one row with a count.
CHATTY = frozenset({NoteKind.PULL, NoteKind.RELAY, NoteKind.NACK, NoteKind.DEGRADED, NoteKind.TIMEOUT,
                    NoteKind.REROUTE, NoteKind.RESYNC})
# One colour per incident kind: its window on the charts, its incident, its marks.
FAULT_COLOURS: Mapping[IncidentKind, str] = {
    IncidentKind.LINK: "#d63b3b", IncidentKind.CRASH: "#b42318", IncidentKind.HANG: "#e46a17",
    IncidentKind.LOSS: "#e0a100", IncidentKind.LATENCY: "#7b4fd6", IncidentKind.BANDWIDTH: "#7b4fd6",
    IncidentKind.FLAP: "#c2410c", IncidentKind.ISOLATE: "#6b7280", IncidentKind.BROKER_RESTART: "#1f2937",
    IncidentKind.BRIDGE_CUT: "#b42318", IncidentKind.SITE_BROKER_RESTART: "#1f2937",
    IncidentKind.MODEL: "#a4262c", IncidentKind.LIAR: "#86198f",
}
# The charts' marks besides an incident's start (in its kind's colour): a crashed node's
# return, a view change.
MARK_COLOURS: Mapping[Kind, str] = {NoteKind.REJOIN: "#13a3b5", EventKind.VIEW_CHANGE: "#3a7bd5"}


# The devices and jobs views: the badge of a device's, an execution's and a job's state (a
# COLORS entry of app.js).
DEVICE_BADGES: Mapping[DeviceState, str] = {
    DeviceState.IDLE: "joining", DeviceState.TRAINING: "online", DeviceState.OFFLINE: "offline"}
EXEC_BADGES: Mapping[ExecState, str] = {
    ExecState.QUEUED: "unknown", ExecState.ACCEPTED: "joining", ExecState.REJECTED: "evicted",
    ExecState.DOWNLOADING: "rejoining", ExecState.TRAINING: "online", ExecState.SUCCEEDED: "ok",
    ExecState.FAILED: "failed", ExecState.CANCELED: "offline", ExecState.TIMED_OUT: "hung"}
JOB_BADGES: Mapping[JobState, str] = {
    JobState.SUBMITTED: "unknown", JobState.RUNNING: "online", JobState.SUCCEEDED: "ok",
    JobState.FAILED: "failed", JobState.CANCELED: "offline", JobState.TIMED_OUT: "hung",
    JobState.REJECTED: "evicted"}


def page_kinds() -> dict[str, object]:
    """Everything the page knows of kinds: the enums by member name, and the tables."""
    return {
        "note": {k.name: k.value for k in NoteKind},
        "event": {k.name: k.value for k in EventKind},
        "incident": {k.name: k.value for k in IncidentKind},
        "badge": {str(k): v for k, v in BADGES.items()},
        "filters": {name: sorted(kinds) for name, kinds in FILTERS.items()},
        "chatty": sorted(CHATTY),
        "faultColors": {str(k): v for k, v in FAULT_COLOURS.items()},
        "markColors": {str(k): v for k, v in MARK_COLOURS.items()},
        "deviceBadge": {str(k): v for k, v in DEVICE_BADGES.items()},
        "execBadge": {str(k): v for k, v in EXEC_BADGES.items()},
        "jobBadge": {str(k): v for k, v in JOB_BADGES.items()},
    }


def page_module() -> str:
    """``/kinds.js``: the page's one source of kinds (loaded before charts.js and app.js)."""
    return ("// The dashboard's kinds, written by dashboard/kinds.py from its enums: edit them there.\n"
            f'"use strict";\nconst KINDS = Object.freeze({json.dumps(page_kinds(), indent=1)});\n')
