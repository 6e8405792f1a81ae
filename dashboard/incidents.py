"""Fault windows and incidents: inject -> detect -> recovered, with the evidence. PURE, like state.py.

An incident opens when the simulator says it injected a fault (source "injected"), when the
operator made one with the dashboard's controls (source "operator"), or when the fleet's own
signals show one nobody announced (source "detected": a crash, a hung node, a failed link).
Later events of the same kind and targets are its evidence. Undoing the fault (a heal, a
restart) does not end it: it ends when the fleet's own evidence shows its targets recovered,
back in the view and reporting the fleet's model hash (``settle``). Incidents are kept apart
from the event ring buffer so that a long run never loses its early fault windows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Literal

from agent.protocol.notes import NoteKind
from dashboard.kinds import EventKind, IncidentKind, Kind

IncidentSource = Literal["injected", "detected", "operator"]
Key = tuple[IncidentKind, tuple[int, ...]]

MAX_INCIDENTS = 500
MAX_EVIDENCE = 6

# Fleet events that reveal a fault, as (incident kind, whether the event may open one).
_DETECTS: dict[Kind, tuple[IncidentKind, bool]] = {
    EventKind.CRASH: (IncidentKind.CRASH, True),
    EventKind.HUNG: (IncidentKind.HANG, True),
    EventKind.LINK_FAILED: (IncidentKind.LINK, True),
    # A node running another model than the fleet's (it is refused and stops).
    EventKind.MODEL_MISMATCH: (IncidentKind.MODEL, True),
    # A parent left a child out for lying about its contribution (the note names the liar).
    NoteKind.LIAR: (IncidentKind.LIAR, True),
    # A rerouted link may be the backup route in use, working as designed: evidence only.
    EventKind.LINK_REROUTED: (IncidentKind.LINK, False),
}
# Fleet events that show a fault is over: they close a detected incident of that kind. A node
# that crashed or hung is recovered only once back in the view with the fleet's hash (settle).
_RECOVERS: dict[Kind, IncidentKind] = {
    EventKind.LINK_OK: IncidentKind.LINK,
    EventKind.OFFLINE: IncidentKind.MODEL,  # the refused node left
}
# Kinds that end on the fleet's evidence (settle), not on an event.
SETTLED_KINDS = frozenset({IncidentKind.CRASH, IncidentKind.HANG, IncidentKind.ISOLATE, IncidentKind.LOSS,
                           IncidentKind.LATENCY, IncidentKind.BANDWIDTH, IncidentKind.LINK})
# Titles of detected incidents whose kind alone does not say it ("crash node 3 ...").
_TITLES = {IncidentKind.MODEL: "model mismatch: node {}", IncidentKind.LIAR: "lying: node {} left out by its parent"}
# Events that count as evidence for any active incident touching the event's node or peer:
# the agents' notes, then the dashboard's own events.
_SYMPTOMS: frozenset[Kind] = frozenset({
    NoteKind.TIMEOUT, NoteKind.NACK, NoteKind.DEGRADED, NoteKind.REROUTE, NoteKind.SUSPECTED,
    EventKind.LINK_SUSPECTED, EventKind.CRASH, EventKind.HUNG, EventKind.LINK_FAILED,
    EventKind.LINK_REROUTED, EventKind.OFFLINE})


@dataclass(frozen=True)
class Incident:
    id: int
    kind: IncidentKind
    targets: tuple[int, ...]
    title: str
    source: IncidentSource
    start_round: int | None
    start_time: float
    end_round: int | None = None
    end_time: float | None = None
    detected_round: int | None = None
    recovered_round: int | None = None  # its targets back in the view with the fleet's hash
    healed_round: int | None = None  # the fault undone (heal, restart, resume) by who made it
    evidence: tuple[str, ...] = ()

    @property
    def active(self) -> bool:
        return self.end_time is None

    @property
    def key(self) -> Key:
        return self.kind, self.targets


@dataclass(frozen=True)
class Observation:
    """One fleet event as incidents see it (state.FleetEvent without the import cycle)."""

    kind: Kind
    node: int | None
    peer: int | None
    round: int | None
    detail: str


def targets_of(kind: IncidentKind, nodes: Iterable[int]) -> tuple[int, ...]:
    """A link's two ends in order (a cut of 3-1 is the cut of 1-3); any other fault's as given."""
    ids = tuple(nodes)
    return tuple(sorted(ids)) if kind is IncidentKind.LINK else ids


def inject(incidents: tuple[Incident, ...], kind: IncidentKind, nodes: Iterable[int], title: str,
           round_no: int | None, now: float, source: IncidentSource = "injected"
           ) -> tuple[Incident, ...]:
    """The simulator (or the operator) made a fault. A detected incident it explains becomes
    this one."""
    targets = targets_of(kind, nodes)
    found = _find_active(incidents, (kind, targets))
    if found is not None:
        start = round_no if found.start_round is None else min(found.start_round, round_no or found.start_round)
        merged = replace(found, source=source, title=title, start_round=start)
        return _replace(incidents, merged)
    new = Incident(_next_id(incidents), kind, targets, title, source, round_no, now)
    return (*incidents, new)[-MAX_INCIDENTS:]


def heal(incidents: tuple[Incident, ...], kind: IncidentKind, nodes: Iterable[int], round_no: int | None,
         now: float) -> tuple[Incident, ...]:
    """The fault was undone. A kind the fleet must show recovered stays active until it does."""
    found = _find_active(incidents, (kind, targets_of(kind, nodes)))
    if found is None:
        return incidents
    if kind in SETTLED_KINDS:
        return _replace(incidents, replace(found, healed_round=round_no))
    return _replace(incidents, replace(found, healed_round=round_no, end_round=round_no, end_time=now))


def awaiting_recovery(incidents: tuple[Incident, ...]) -> list[Incident]:
    """Active incidents that end on the fleet's evidence: undone faults, and detected ones."""
    return [i for i in incidents if i.active and i.kind in SETTLED_KINDS
            and (i.healed_round is not None or i.source == "detected")]


def evidence_from(incident: Incident) -> int:
    """The first round whose reports can show the incident over."""
    if incident.healed_round is not None:
        return incident.healed_round
    return (incident.start_round or 0) + 1


def settle(incidents: tuple[Incident, ...], recovered: dict[int, int], now: float
           ) -> tuple[Incident, ...]:
    """Close the incidents (by id) the fleet showed recovered, at the given rounds."""
    return tuple(replace(i, recovered_round=recovered[i.id], end_round=recovered[i.id], end_time=now)
                 if i.id in recovered and i.active else i for i in incidents)


def close_all(incidents: tuple[Incident, ...], round_no: int | None, now: float
              ) -> tuple[Incident, ...]:
    """The run ended: nothing is active any more."""
    return tuple(replace(i, end_round=round_no, end_time=now) if i.active else i for i in incidents)


def observe(incidents: tuple[Incident, ...], events: Iterable[Observation], fleet_round: int | None,
            now: float) -> tuple[Incident, ...]:
    for event in events:
        incidents = _observe_one(incidents, event, fleet_round, now)
    return incidents


def _observe_one(incidents: tuple[Incident, ...], e: Observation, fleet_round: int | None,
                 now: float) -> tuple[Incident, ...]:
    round_no = e.round if e.round is not None else fleet_round
    if e.kind in _RECOVERS and e.node is not None:
        incidents = _recover(incidents, _event_key(_RECOVERS[e.kind], e), round_no, now)
    if e.kind in _DETECTS and e.node is not None:
        kind, opens = _DETECTS[e.kind]
        key = _event_key(kind, e)
        if opens and _find_active(incidents, key) is None and not _explained(incidents, key):
            title = (_TITLES[kind].format(*key[1]) if kind in _TITLES
                     else f"{kind} {_targets_text(key[1])} (seen by the fleet)")
            opened = Incident(_next_id(incidents), kind, key[1], title, "detected", round_no, now,
                              detected_round=round_no, evidence=(_evidence(e, round_no),))
            return (*incidents, opened)[-MAX_INCIDENTS:]
    if e.kind in _SYMPTOMS:
        return _add_evidence(incidents, e, round_no)
    return incidents


def _event_key(kind: IncidentKind, e: Observation) -> Key:
    nodes = (e.node,) if kind is not IncidentKind.LINK or e.peer is None else (e.node, e.peer)
    if kind is IncidentKind.LIAR:
        nodes = (e.peer,)  # the liar, not its parent who noted it
    return kind, targets_of(kind, [n for n in nodes if n is not None])


def _recover(incidents: tuple[Incident, ...], key: Key, round_no: int | None, now: float
             ) -> tuple[Incident, ...]:
    """The fleet shows recovery: a detected incident closes; another one notes the round."""
    for incident in reversed(incidents):
        if incident.key != key or incident.recovered_round is not None:
            continue
        if incident.source == "detected" and incident.active:
            return _replace(incidents, replace(incident, recovered_round=round_no,
                                               end_round=round_no, end_time=now))
        if incident.kind not in SETTLED_KINDS:
            return _replace(incidents, replace(incident, recovered_round=round_no))
    return incidents


def _add_evidence(incidents: tuple[Incident, ...], e: Observation, round_no: int | None
                  ) -> tuple[Incident, ...]:
    touched = {n for n in (e.node, e.peer) if n is not None}
    for incident in incidents:
        if not incident.active or not touched & set(incident.targets):
            continue
        if len(incident.evidence) >= MAX_EVIDENCE:
            continue
        detected = incident.detected_round if incident.detected_round is not None else round_no
        incidents = _replace(incidents, replace(
            incident, detected_round=detected, evidence=(*incident.evidence, _evidence(e, round_no))))
    return incidents


def _evidence(e: Observation, round_no: int | None) -> str:
    who = f"node {e.node}" + (f"->{e.peer}" if e.peer is not None else "")
    text = f"r{round_no} {e.kind.replace('_', ' ')} {who}"
    return f"{text}: {e.detail}"[:160] if e.detail else text


def _targets_text(targets: tuple[int, ...]) -> str:
    return "-".join(str(t) for t in targets) if len(targets) == 2 else f"node {targets[0]}"


def _explained(incidents: tuple[Incident, ...], key: Key) -> bool:
    """A link failing next to a crashed, hung or isolated node is that node's incident."""
    return key[0] is IncidentKind.LINK and any(
        i.active and i.kind is not IncidentKind.LINK and set(i.targets) & set(key[1]) for i in incidents)


def _find_active(incidents: tuple[Incident, ...], key: Key) -> Incident | None:
    for incident in reversed(incidents):
        if incident.active and incident.key == key:
            return incident
    return None


def _replace(incidents: tuple[Incident, ...], new: Incident) -> tuple[Incident, ...]:
    return tuple(new if i.id == new.id else i for i in incidents)


def _next_id(incidents: tuple[Incident, ...]) -> int:
    return incidents[-1].id + 1 if incidents else 1
