"""The simulator's records (its events.jsonl lines) as FleetState changes. PURE, like state.py.

A simulator running the dashboard hands it the records only it knows: faults injected and
healed (with the fleet's round), the outcome of each fault-control command, the end of the run.
A replay (``edgegrove dashboard --replay``) feeds every line of a finished run the same way,
status, view and telemetry included, so the page shows what the live page showed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any, TypeVar

from agent.protocol.messages import MessageError, Status, Telemetry, View
from agent.protocol.notes import NoteKind
from dashboard import incidents as inc
from dashboard.bridges import apply_bridges, uplink_reports
from dashboard.kinds import EventKind, IncidentKind, Kind
from dashboard.sessions import TOKEN_ACTOR
from dashboard.state import (
    ControlOutcome,
    Draft,
    FleetState,
    OperatorAction,
    Result,
    apply_malformed,
    apply_status,
    apply_telemetry,
    apply_view,
    with_events,
)

Record = Mapping[str, Any]
MAX_CONTROLS = 50
# What only the simulator knows; the rest of its records it heard on the broker, like us.
SIMULATOR_ONLY = frozenset({"fault", "dashboard_control", "run", "uplinks", "broker"})
Message = TypeVar("Message", Status, View, Telemetry)


def apply_record(state: FleetState, record: Record, now: float) -> Result:
    """One simulator record. Unknown or malformed records change nothing (never raise)."""
    kind = record.get("type")
    try:
        if kind == "status":
            return apply_status(state, _message(Status, record), now)
        if kind == "view":
            return apply_view(state, _message(View, record), now)
        if kind == "telemetry":
            return apply_telemetry(state, _message(Telemetry, record), now)
        if kind == "fault":
            return _fault(state, record, now)
        if kind == "dashboard_control":
            return _control_outcome(state, record, now)
        if kind == "run":
            return _run(state, record, now)
        if kind == "uplinks":
            return _uplinks(state, record, now)
        if kind == "broker":
            return _broker(state, record, now)
    except (MessageError, KeyError, TypeError, ValueError):
        pass
    return state, ()


def telemetry_record(record: Record) -> Telemetry | None:
    """The telemetry message a record carries (None: another record, or a malformed one)."""
    if record.get("type") != "telemetry":
        return None
    try:
        return _message(Telemetry, record)
    except (MessageError, KeyError, TypeError, ValueError):
        return None


def _message(cls: type[Message], record: Record) -> Message:
    names = {f.name for f in fields(cls)}
    message = cls(**{k: v for k, v in record.items() if k in names})
    message.validate()
    return message


def _fault(state: FleetState, record: Record, now: float) -> Result:
    """``inject`` opens an incident (with the fleet's round), ``heal`` closes it."""
    round_no = record.get("round")
    round_no = round_no if isinstance(round_no, int) else state.fleet_round
    index, kind = int(record["index"]), IncidentKind(str(record["kind"]))
    if record["action"] == "inject":
        targets = tuple(int(t) for t in record.get("targets", []))
        title = f"{record.get('description', kind)} ({record.get('mechanism', '')})"
        state = _with_fault_targets(state, index, kind, targets)
        incidents = inc.inject(state.incidents, kind, targets, title, round_no, now)
        draft = _fault_draft(NoteKind.FAULT_INJECTED, targets, round_no, title)
    elif record["action"] == "heal":
        kind, targets = state.fault_targets.get(index, (kind, ()))
        incidents = inc.heal(state.incidents, kind, targets, round_no, now)
        draft = _fault_draft(EventKind.FAULT_HEALED, targets, round_no, f"{kind} undone")
    else:
        return state, ()
    return with_events(replace(state, incidents=incidents), [draft], now)


def _with_fault_targets(state: FleetState, index: int, kind: IncidentKind, targets: tuple[int, ...]
                        ) -> FleetState:
    known = dict(state.fault_targets)
    known[index] = (kind, inc.targets_of(kind, targets))
    return replace(state, fault_targets=known)


def _fault_draft(kind: Kind, targets: tuple[int, ...], round_no: int | None, detail: str) -> Draft:
    node = targets[0] if targets else None
    peer = targets[1] if len(targets) > 1 else None
    return Draft(kind, node, peer, round_no, detail[:200])


def _control_outcome(state: FleetState, record: Record, now: float) -> Result:
    outcome = str(record.get("outcome", ""))[:200]
    applied = bool(record.get("applied", not outcome.startswith(("ignored", "failed"))))
    peer = record.get("peer")
    seq = state.controls[-1].seq + 1 if state.controls else 1
    entry = ControlOutcome(seq, now, str(record["action"])[:16], int(record["node"]),
                           peer if isinstance(peer, int) else None, applied, outcome)
    state = replace(state, controls=(*state.controls, entry)[-MAX_CONTROLS:])
    value = record.get("value")
    state = _operator_answered(state, entry, value if isinstance(value, (int, float)) else None, now)
    targets = _operator_targets(entry.action, entry.node, entry.peer)
    target = f"node {entry.node}" + (f"->{entry.peer}" if entry.peer is not None else "") if targets else "the broker"
    detail = f"{entry.action} {target}: {outcome}"
    draft = Draft(EventKind.CONTROL, entry.node if targets else None, entry.peer, state.fleet_round, detail)
    return with_events(state, [draft], now)


# The operator's commands (the dashboard's controls): the fault each makes, and the fault each
# undoes. A loss or latency of 0 undoes that fault.
_OPERATOR_MAKES = {"crash": IncidentKind.CRASH, "hang": IncidentKind.HANG, "isolate": IncidentKind.ISOLATE,
                   "cut": IncidentKind.LINK, "loss": IncidentKind.LOSS, "latency": IncidentKind.LATENCY,
                   "broker_restart": IncidentKind.BROKER_RESTART}
_OPERATOR_UNDOES = {"restart": IncidentKind.CRASH, "resume": IncidentKind.HANG, "rejoin": IncidentKind.ISOLATE,
                    "heal": IncidentKind.LINK}
MAX_OPERATOR_ACTIONS = 500


def apply_operator(state: FleetState, action: str, node: int, peer: int | None, value: float | None,
                   now: float, by: str = "") -> Result:
    """The dashboard sent the operator's command: marked at the fleet's round, and the fault it
    makes (or undoes) is the operator's incident, whatever it targets, before the fleet sees it."""
    state, made = _operator_action(state, action, node, peer, value, now, by)
    title = f"{made.action} {_targets_text(made.targets)}"
    sender = _sender(by)
    node_of = node if made.targets else None  # a broker command names no node
    draft = Draft(EventKind.CONTROL, node_of, peer, made.round, f"{title}: sent by {sender} from the dashboard", by)
    return with_events(state, [draft], now)


def _operator_answered(state: FleetState, entry: ControlOutcome, value: float | None, now: float
                       ) -> FleetState:
    """The simulator answered an operator's command: the action the dashboard recorded when it
    sent it gets the outcome (and a fault it made is undone if the simulator did not carry it
    out); an applied one it never recorded (a replay, another dashboard) is recorded now."""
    targets = _operator_targets(entry.action, entry.node, entry.peer)
    for action in reversed(state.operator_actions):
        if action.action == entry.action and action.targets == targets and not action.outcome:
            answered = replace(action, outcome=entry.outcome)
            actions = tuple(answered if a.seq == action.seq else a for a in state.operator_actions)
            state = replace(state, operator_actions=actions)
            if entry.applied or action.incident is None or action.undoes:
                return state
            return replace(state, incidents=inc.heal(state.incidents, action.incident, targets,
                                                     state.fleet_round, now))
    if not entry.applied:
        return state
    state, made = _operator_action(state, entry.action, entry.node, entry.peer, value, now)
    return replace(state, operator_actions=(*state.operator_actions[:-1], replace(made, outcome=entry.outcome)))


def _operator_targets(action: str, node: int, peer: int | None) -> tuple[int, ...]:
    kind = _OPERATOR_MAKES.get(action) or _OPERATOR_UNDOES.get(action)
    if kind is IncidentKind.BROKER_RESTART:
        return ()  # the broker: every node's link to it
    nodes = (node,) if peer is None else (node, peer)
    return inc.targets_of(kind, nodes) if kind is not None else nodes


def _operator_action(state: FleetState, action: str, node: int, peer: int | None, value: float | None,
                     now: float, by: str = "") -> tuple[FleetState, OperatorAction]:
    """Records the command and opens (or undoes) its fault as the operator's incident."""
    round_no = state.fleet_round
    targets = _operator_targets(action, node, peer)
    undoes = action in _OPERATOR_UNDOES or (action in ("loss", "latency") and value is not None and value <= 0)
    kind = _OPERATOR_UNDOES.get(action) or _OPERATOR_MAKES.get(action)
    incidents = state.incidents
    if kind is not None and undoes:
        incidents = inc.heal(incidents, kind, targets, round_no, now)
    elif kind is not None:
        title = f"{action} {_targets_text(targets)} (made by {_sender(by)} from the dashboard)"
        incidents = inc.inject(incidents, kind, targets, title, round_no, now, "operator")
    seq = state.operator_actions[-1].seq + 1 if state.operator_actions else 1
    made = OperatorAction(seq, now, round_no, action[:16], targets, kind, undoes, by=by)
    actions = (*state.operator_actions, made)[-MAX_OPERATOR_ACTIONS:]
    return replace(state, incidents=incidents, operator_actions=actions), made


def _sender(by: str) -> str:
    """Who sent a command, in the timeline's words."""
    if by == TOKEN_ACTOR:
        return "the operator with the control token"
    return f"operator {by}" if by else "the operator"


def _targets_text(targets: tuple[int, ...]) -> str:
    if not targets:
        return "the broker"
    return f"link {targets[0]}-{targets[1]}" if len(targets) == 2 else f"node {targets[0]}"


def _broker(state: FleetState, record: Record, now: float) -> Result:
    """The simulator's broker is back after the operator's restart: its incident closes at the
    fleet's round (a scenario's restart closes with its fault's heal record)."""
    operators = any(i.active and i.kind is IncidentKind.BROKER_RESTART and i.source == "operator"
                    for i in state.incidents)
    if record.get("event") != "started" or not operators:
        return state, ()
    incidents = inc.heal(state.incidents, IncidentKind.BROKER_RESTART, (), state.fleet_round, now)
    draft = Draft(EventKind.FAULT_HEALED, None, None, state.fleet_round, "broker back up")
    return with_events(replace(state, incidents=incidents), [draft], now)


def _uplinks(state: FleetState, record: Record, now: float) -> Result:
    """What crossed each site's uplink, and which the simulator cut; a malformed record is
    counted, like a malformed message, and changes nothing else."""
    try:
        return apply_bridges(state, uplink_reports(record), now)
    except MessageError as exc:
        return apply_malformed(state, exc.reason, now)


def _run(state: FleetState, record: Record, now: float) -> Result:
    """The simulator stops the fleet (``stopping``), then the run ends (``end``)."""
    phase = record.get("phase")
    if phase not in ("stopping", "end"):
        return state, ()
    run = replace(state.run, phase="ending" if phase == "stopping" else "finished")
    if record.get("replay"):
        run = replace(run, replay_hint=str(record["replay"])[:300])
    incidents = inc.close_all(state.incidents, state.fleet_round, now)
    state = replace(state, run=run, incidents=incidents)
    if phase == "stopping":
        return replace(state, version=state.version + 1), ()
    return with_events(state, [Draft(EventKind.RUN_END, None, None, state.fleet_round, "run finished")], now)
