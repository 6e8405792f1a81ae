"""The fleet as the dashboard sees it: a PURE reducer over status, view and telemetry messages.

Every ``apply_*`` function takes the current ``FleetState``, one decoded message and the
time ``now`` (injected: seconds on any monotonic scale) and returns ``(new_state, events)``.
Nothing here does IO or reads a clock, so recorded message sequences replay exactly in
tests. The state's memory is bounded: its rounds and events are ring buffers (``max_rounds``,
``max_events``: what the page is pushed); the store keeps the run's whole history beside it.
Node ids are bounded by the message validation (0..1023).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal

from agent.protocol.membership import view_root, view_tree
from agent.protocol.messages import Status, Telemetry, View
from agent.protocol.notes import NoteKind
from agent.protocol.topology import Tree
from dashboard import incidents as inc
from dashboard.incidents import Incident, Observation
from dashboard.kinds import EventKind, IncidentKind, Kind, note_kind

NodeDisplay = Literal["online", "joining", "rejoining", "suspected", "hung", "offline", "unknown"]
LinkDisplay = Literal["ok", "suspected", "failed", "rerouted", "unknown"]
LinkKind = Literal["tree", "backup", "extra"]
BridgeState = Literal["up", "down", "unknown"]
# Who said a bridge's state: the broker's bridge notification, or the simulator's uplink.
BridgeSource = Literal["", "broker", "simulator"]
Silence = Literal["", "suspected", "hung"]
# live: following a fleet; ending: the simulator is stopping it (offline is an exit, not a
# crash); finished: the run is over (its end seen, or a replay of a finished run).
RunPhase = Literal["live", "ending", "finished"]

# Worst wins when the two ends of a link disagree: a link is as bad as its worst report.
_LINK_SEVERITY: dict[str, int] = {"unknown": 0, "ok": 1, "suspected": 2, "rerouted": 3, "failed": 4}
_LINK_EVENT: dict[str, EventKind] = {
    "suspected": EventKind.LINK_SUSPECTED,
    "rerouted": EventKind.LINK_REROUTED,
    "failed": EventKind.LINK_FAILED,
    "ok": EventKind.LINK_OK,
}
_MAX_TEXT = 200
_SUSPICION_KINDS: frozenset[Kind] = frozenset({NoteKind.SUSPECTED, EventKind.HUNG})
_SILENCE_EVENT: dict[Silence, Kind] = {"suspected": NoteKind.SUSPECTED, "hung": EventKind.HUNG}
# An agent reports every Control it applies as "fault_injected", a heal (loss 0) included:
# on the page that is a control the agent applied; injections are the simulator's to report.
_AGENT_KIND_ALIASES: dict[NoteKind, Kind] = {NoteKind.FAULT_INJECTED: EventKind.CONTROL_APPLIED}


def _frozen(mapping: Mapping[Any, Any]) -> Mapping[Any, Any]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class FleetEvent:
    """One line of the timeline. ``seq`` grows by one per event, for ``?since=``."""

    seq: int
    time: float
    kind: Kind
    node: int | None = None
    peer: int | None = None
    round: int | None = None
    detail: str = ""
    by: str = ""  # the operator who sent it (an operator's command), else ""


# Upper bounds (seconds) of the buckets of each node's round-time histogram (/metrics).
ROUND_TIME_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True)
class RoundTimes:
    """A node's round times, every report counted: per bucket (the last one: above the
    largest bound), their sum and their number."""

    buckets: tuple[int, ...] = (0,) * (len(ROUND_TIME_BUCKETS) + 1)
    total: float = 0.0
    count: int = 0

    def observe(self, seconds: float) -> RoundTimes:
        at = next((k for k, bound in enumerate(ROUND_TIME_BUCKETS) if seconds <= bound), len(ROUND_TIME_BUCKETS))
        buckets = tuple(n + (k == at) for k, n in enumerate(self.buckets))
        return RoundTimes(buckets, self.total + seconds, self.count + 1)


@dataclass(frozen=True)
class NodeInfo:
    node: int
    status: str = "unknown"  # the last Status.state, "unknown" before any status
    incarnation: int = 0
    pid: int = 0
    rejoining: bool = False  # came back (after offline or as a new incarnation), not yet online
    silence: Silence = ""  # from tick(): no telemetry for a while although the fleet moved on
    last_round: int | None = None
    last_seen: float | None = None  # `now` of its last telemetry
    epoch: int | None = None
    loss: float | None = None
    accuracy: float | None = None
    degraded: bool = False
    model_hash: str = ""
    bytes_sent: int = 0  # totals over every round it reported
    bytes_received: int = 0
    reroutes: int = 0
    timeouts: int = 0
    pulls: int = 0  # chunks it pulled from a peer (ft-pull)
    state_pulls: int = 0  # times it asked a peer for the model's state (its state_pull notes)
    round_times: RoundTimes = field(default_factory=RoundTimes)
    # Its process's latest CPU (percent of one core over its last round) and resident memory,
    # as it reported them (None/0: never said).
    cpu_percent: float | None = None
    rss_bytes: int = 0
    dp_epsilon: float | None = None  # differential privacy: its data's epsilon spent (docs/PRIVACY.md)
    restarts: int = 0  # new incarnations seen after the first
    # The agent's rejected-frame counters are totals since it started: keep its latest.
    rejected: Mapping[str, int] = field(default_factory=lambda: _frozen({}))
    links: Mapping[int, str] = field(default_factory=lambda: _frozen({}))
    # Peers whose frames it relayed in its latest round: the backup link to each is in use.
    relaying: frozenset[int] = frozenset()
    returned_at: float | None = None  # `now` of the status that brought it back after a crash
    # It left because the run is over (or it trained every round): the page keeps showing its
    # last live state, and its links are not failed for it.
    exited: bool = False
    # What its status says it trains: the model's fingerprint, name, parameter count, and its
    # shard's training samples per label.
    fingerprint: str = ""
    model: str = ""
    params: int = 0
    labels: tuple[int, ...] = ()
    site: str = ""  # the site its status names ("" when none)

    @property
    def display(self) -> NodeDisplay:
        if self.status == "offline":
            return "offline"
        if self.silence:
            return self.silence
        if self.rejoining:
            return "rejoining"
        if self.status in ("online", "joining"):
            return self.status  # type: ignore[return-value]
        return "online" if self.last_seen is not None else "unknown"


@dataclass(frozen=True)
class LinkInfo:
    a: int  # a < b: links are undirected on the page
    b: int
    kind: LinkKind
    state: LinkDisplay


@dataclass(frozen=True)
class BridgeInfo:
    """A site's bridge to the core broker: whether it is connected, and what crossed it."""

    site: str
    state: BridgeState = "unknown"
    source: BridgeSource = ""
    since: float | None = None  # `now` of its last change of state
    downs: int = 0  # times it went down
    bytes_up: int | None = None  # totals through the uplink (None: nobody counts them)
    bytes_down: int | None = None
    rate_up: float | None = None  # bytes/s over the last rate window
    rate_down: float | None = None
    sampled_at: float | None = None  # `now` of the last byte counts
    # The byte counts a rate is measured from: (up, down, `now`).
    rate_base: tuple[int, int, float] | None = None


@dataclass(frozen=True)
class RoundSummary:
    """What the nodes reported about one round, merged as their telemetry arrives."""

    round: int
    epoch: int
    algorithm: str
    first_seen: float
    version: int  # FleetState.version of its last update (WebSocket deltas)
    reports: int = 0
    members: int = 0
    loss_sum: float = 0.0
    loss_count: int = 0
    accuracy_sum: float = 0.0
    accuracy_count: int = 0
    round_seconds: float = 0.0  # the slowest node's phase_seconds["total"]
    node_seconds: tuple[float, ...] = ()  # every report's round time, for the median agent
    bytes_sent: int = 0
    reroutes: int = 0
    timeouts: int = 0
    nacks: int = 0
    pulls: int = 0
    degraded_nodes: int = 0
    missing_chunks: int = 0
    contributors: int = 0
    event_kinds: tuple[Kind, ...] = ()
    model_hashes: tuple[str, ...] = ()  # every report's model hash: the fleet's is the common one
    local_steps: int = 1  # optimizer steps each agent took before this round's average
    samples: int = 0  # training samples behind the reports' contributions
    compute_seconds: float = 0.0  # the slowest agent's local steps
    sync_seconds: float = 0.0  # the slowest agent's allreduce

    @property
    def bytes_per_sample(self) -> float | None:
        return self.bytes_sent / self.samples if self.samples else None

    @property
    def fleet_hash(self) -> str:
        """The model hash at least two reports of the round agree on (the most common)."""
        counts: dict[str, int] = {}
        for h in self.model_hashes:
            if h:
                counts[h] = counts.get(h, 0) + 1
        best = max(counts.items(), key=lambda kv: kv[1], default=("", 0))
        return best[0] if best[1] >= 2 or (best[1] == 1 and self.members == 1) else ""

    @property
    def loss(self) -> float | None:
        return self.loss_sum / self.loss_count if self.loss_count else None

    @property
    def accuracy(self) -> float | None:
        return self.accuracy_sum / self.accuracy_count if self.accuracy_count else None

    @property
    def degraded(self) -> bool:
        return self.degraded_nodes > 0

    @property
    def median_seconds(self) -> float:
        times = sorted(self.node_seconds)
        return times[len(times) // 2] if times else 0.0


@dataclass(frozen=True)
class Counters:
    messages: Mapping[str, int] = field(default_factory=lambda: _frozen({}))
    malformed: Mapping[str, int] = field(default_factory=lambda: _frozen({}))
    rounds: int = 0  # distinct rounds seen
    bytes_sent: int = 0
    reroutes: int = 0
    timeouts: int = 0
    degraded_rounds: int = 0
    late_telemetry: int = 0  # telemetry for a round already moved out of the ring buffer
    suspicions: int = 0  # events saying a node is suspected or hung (an agent's or ours)


@dataclass(frozen=True)
class ControlOutcome:
    """What the simulator did with a fault-control command (applied, or ignored and why)."""

    seq: int
    time: float
    action: str
    node: int
    peer: int | None
    applied: bool
    outcome: str


@dataclass(frozen=True)
class OperatorAction:
    """A command the operator sent from the dashboard's controls, at the fleet's round: the
    charts mark it, and the fault it makes (or undoes) is an incident labelled as theirs."""

    seq: int
    time: float
    round: int | None
    action: str
    targets: tuple[int, ...]  # the node, or the link's two ends
    incident: IncidentKind | None  # the kind of fault it makes or undoes (None: none)
    undoes: bool  # it undoes a fault (heal, restart, resume, rejoin, a loss or latency of 0)
    outcome: str = ""  # what the simulator said it did ("": no simulator answered)
    by: str = ""  # the operator's account (`token`: the control token; "": not known, a replay)


@dataclass(frozen=True)
class RunInfo:
    phase: RunPhase = "live"
    fleet_size: int | None = None  # known when a simulator drives the fleet
    total_rounds: int | None = None  # the rounds the run trains, when known
    replay_hint: str = ""  # how to open this run again once it is over
    replay_of: str = ""  # set when this state is a replay of a finished run


@dataclass(frozen=True)
class FleetState:
    max_rounds: int = 2000
    max_events: int = 2000
    suspect_after: float = 5.0
    hung_after: float = 15.0
    version: int = 0
    nodes: Mapping[int, NodeInfo] = field(default_factory=lambda: _frozen({}))
    view: View | None = None
    links: Mapping[tuple[int, int], LinkInfo] = field(default_factory=lambda: _frozen({}))
    rounds: Mapping[int, RoundSummary] = field(default_factory=lambda: _frozen({}))
    events: tuple[FleetEvent, ...] = ()
    next_seq: int = 1
    counters: Counters = field(default_factory=Counters)
    incidents: tuple[Incident, ...] = ()
    controls: tuple[ControlOutcome, ...] = ()
    operator_actions: tuple[OperatorAction, ...] = ()
    run: RunInfo = field(default_factory=RunInfo)
    # The simulator's fault index -> (kind, targets): its heal records name only the index.
    fault_targets: Mapping[int, tuple[IncidentKind, tuple[int, ...]]] = field(
        default_factory=lambda: _frozen({}))
    bridges: Mapping[str, BridgeInfo] = field(default_factory=lambda: _frozen({}))

    @property
    def latest_round(self) -> int | None:
        return max(self.rounds) if self.rounds else None

    @property
    def fleet_round(self) -> int | None:
        """The round the fleet is in now: one past the highest round any node finished.

        Events that a message does not date reliably (a Last Will carries the round of the
        node's last status, a restarted node's status its checkpoint's) are dated with it.
        """
        latest = self.latest_round
        return None if latest is None else latest + 1

    @property
    def tree(self) -> Tree | None:
        if self.view is None or not self.view.members:
            return None
        return _view_tree(self.view)


Result = tuple[FleetState, tuple[FleetEvent, ...]]


# ---------------------------------------------------------------- public reducer functions


def apply_status(state: FleetState, msg: Status, now: float) -> Result:
    old = state.nodes.get(msg.node)
    node = old or NodeInfo(msg.node)
    drafts: list[Draft] = []
    returning = old is not None and old.status != "unknown" and (
        (old.status == "offline" and msg.state != "offline") or msg.incarnation > old.incarnation
    )
    at = state.fleet_round
    exiting = False
    if msg.state == "offline" and old is not None and old.exited:
        return state, ()  # its exit is known: a repeated offline status says nothing new
    if msg.state == "offline" and old is not None and old.status in ("online", "joining"):
        kind = _offline_kind(state, msg.node)
        exiting = kind is EventKind.EXIT
        drafts.append(Draft(kind, msg.node, None, at,
                             f"status offline (Last Will or exit) at fleet round {at}"))
    elif returning:
        detail = f"{msg.state}, restart {node.restarts + 1}, resumes from round {msg.round}"
        drafts.append(Draft(NoteKind.REJOIN, msg.node, None, at, detail))
    elif (old is None or old.status == "unknown") and msg.state != "offline":
        drafts.append(Draft(EventKind.JOIN, msg.node, None, at, msg.state))
    rejoining = (returning or node.rejoining) and msg.state == "joining"
    restarted = old is not None and old.incarnation != 0 and msg.incarnation > old.incarnation
    node = replace(
        node,
        # An exit keeps the node's last live state on the page; the run is over for it.
        status=node.status if exiting else msg.state,
        exited=exiting,
        incarnation=msg.incarnation,
        pid=msg.pid,
        rejoining=rejoining,
        silence="" if returning else node.silence,
        returned_at=now if returning else node.returned_at,
        restarts=node.restarts + restarted,
    )
    if msg.state != "offline":  # a Will says nothing about the model
        node = replace(node, fingerprint=msg.fingerprint, model=msg.model, params=msg.params,
                       labels=tuple(msg.labels) or node.labels, site=msg.site or node.site)
    drafts += _mismatch_drafts(state, state.view, (node,), at)
    state = _with_node(state, node)
    state = _count(state, "status")
    return _finish(state, drafts, now)


def model_mismatch(view: View | None, node: NodeInfo) -> bool:
    """A live node whose model is not the one the fleet's view names: the coordinator never
    admits it, and it stops (refused) as it sees the view."""
    return (view is not None and bool(view.fingerprint) and node.status in ("online", "joining")
            and node.fingerprint != view.fingerprint)


def _mismatch_drafts(state: FleetState, view: View | None, nodes: Iterable[NodeInfo],
                     at: int | None) -> list[Draft]:
    """A "model_mismatch" event for each node that now runs another model than the view's
    and did not before (statuses are published again and again: one event per change)."""
    drafts = []
    for node in nodes:
        old = state.nodes.get(node.node)
        if model_mismatch(view, node) and not (old is not None and model_mismatch(state.view, old)):
            assert view is not None
            drafts.append(Draft(EventKind.MODEL_MISMATCH, node.node, None, at,
                                f"model {node.model or '?'} ({node.params:,} params, fingerprint "
                                f"{node.fingerprint or 'none'}) is not the fleet's {view.model or '?'} "
                                f"({view.params:,} params, {view.fingerprint})"))
    return drafts


def _offline_kind(state: FleetState, node: int) -> EventKind:
    if state.run.phase != "live" or _finished_its_rounds(state, node):
        return EventKind.EXIT  # the run is over or being stopped: not a failure
    in_view = state.view is not None and node in state.view.members
    return EventKind.CRASH if in_view else EventKind.OFFLINE


def _finished_its_rounds(state: FleetState, node: int) -> bool:
    total, info = state.run.total_rounds, state.nodes.get(node)
    last = info.last_round if info is not None else None
    return total is not None and last is not None and last >= total - 1


def apply_view(state: FleetState, msg: View, now: float) -> Result:
    drafts: list[Draft] = []
    old = state.view
    if old is None or (old.epoch, old.members, old.arity) != (msg.epoch, msg.members, msg.arity):
        drafts.append(Draft(EventKind.VIEW_CHANGE, msg.coordinator, None, msg.from_round, _view_detail(old, msg)))
    drafts += _mismatch_drafts(state, msg, tuple(state.nodes.values()), msg.from_round)
    state = replace(state, view=msg)
    for member in msg.members:
        if member not in state.nodes:
            state = _with_node(state, NodeInfo(member))
    state = _count(state, "view")
    return _finish(state, drafts, now)


def apply_telemetry(state: FleetState, msg: Telemetry, now: float) -> Result:
    drafts = [_telemetry_event(msg, e) for e in msg.events if isinstance(e, dict)]
    if msg.degraded and _round_degraded_count(state, msg.round) == 0:
        detail = f"{msg.missing_chunks} chunks missing at node {msg.node}"
        drafts.append(Draft(NoteKind.DEGRADED, msg.node, None, msg.round, detail))
    node = state.nodes.get(msg.node) or NodeInfo(msg.node)
    if node.silence:
        detail = f"was {node.silence}, reports round {msg.round}"
        drafts.append(Draft(EventKind.RECOVERED, msg.node, None, state.fleet_round, detail))
    updated = _node_with_telemetry(node, msg, now)
    state = _with_node(state, updated)
    state = _merge_round(state, msg, now, [d.kind for d in drafts])
    state, recovered = _settle(state, now)
    drafts += recovered
    state = _count(state, "telemetry")
    # Re-deriving every link per message is the reducer's main cost on a big fleet; a report
    # that repeats the node's previous link states cannot change any link.
    changed = dict(updated.links) != dict(node.links) or updated.relaying != node.relaying
    return _finish(state, drafts, now, relink=changed)


def _settle(state: FleetState, now: float) -> tuple[FleetState, list[Draft]]:
    """Close the incidents whose targets the fleet's own reports show recovered."""
    recovered: dict[int, int] = {}
    drafts: list[Draft] = []
    for incident in inc.awaiting_recovery(state.incidents):
        rounds = [_back_in_fleet(state, n, inc.evidence_from(incident)) for n in incident.targets]
        if incident.kind is IncidentKind.LINK and len(incident.targets) == 2 and not _link_reported_ok(state, *incident.targets):
            continue
        if rounds and all(r is not None for r in rounds):
            at = max(r for r in rounds if r is not None)
            recovered[incident.id] = at
            what = f"{incident.kind} {'-'.join(map(str, incident.targets))}"
            drafts.append(Draft(EventKind.FAULT_RECOVERED, incident.targets[0],
                                incident.targets[1] if len(incident.targets) == 2 else None, at,
                                f"{what}: back in the view with the fleet's model hash"))
    if not recovered:
        return state, []
    return replace(state, incidents=inc.settle(state.incidents, recovered, now)), drafts


def _back_in_fleet(state: FleetState, node: int, since: int) -> int | None:
    """The round at which ``node`` reported, from ``since`` on, as a member of the current
    view with the model hash the fleet agrees on; None if it has not (yet)."""
    info, view = state.nodes.get(node), state.view
    if info is None or view is None or info.last_round is None or node not in view.members:
        return None
    if info.last_round < max(since, view.from_round) or info.status == "offline":
        return None
    summary = state.rounds.get(info.last_round)
    fleet_hash = summary.fleet_hash if summary is not None else ""
    return info.last_round if fleet_hash and info.model_hash == fleet_hash else None


def _link_reported_ok(state: FleetState, a: int, b: int) -> bool:
    """Both ends' latest reports say the link between them works (or do not name it)."""
    ends = [(state.nodes.get(a), b), (state.nodes.get(b), a)]
    return all(info is not None and info.links.get(peer, "ok") == "ok" for info, peer in ends)


def apply_malformed(state: FleetState, reason: str, now: float) -> Result:
    """A message that failed to decode (or came on a wrong topic): count it by reason."""
    malformed = dict(state.counters.malformed)
    malformed[reason] = malformed.get(reason, 0) + 1
    counters = replace(state.counters, malformed=_frozen(malformed))
    return replace(state, counters=counters, version=state.version + 1), ()


def tick(state: FleetState, now: float) -> Result:
    """Re-judge silent nodes: suspected, then hung, when the fleet moved on without them."""
    latest = state.latest_round
    drafts: list[Draft] = []
    for node in list(state.nodes.values()):
        silence = _silence(state, node, latest, now)
        if silence != node.silence:
            state = _with_node(state, replace(node, silence=silence))
            if silence:
                quiet = now - (node.last_seen or now)
                detail = f"silent {quiet:.1f} s, last reported round {node.last_round}"
                drafts.append(Draft(_SILENCE_EVENT[silence], node.node, None, state.fleet_round, detail))
    if not drafts:
        return state, ()
    return _finish(state, drafts, now)


def with_events(state: FleetState, drafts: Iterable[Draft], now: float) -> Result:
    """Add events that no message caused (the simulator's records), without re-linking."""
    return _finish(state, drafts, now, relink=False)


def rounds_since(state: FleetState, since: int | None) -> list[RoundSummary]:
    keys = sorted(r for r in state.rounds if since is None or r > since)
    return [state.rounds[r] for r in keys]


def rejected_frames(state: FleetState) -> dict[str, int]:
    """Frames the agents rejected, by reason: the sum of every node's latest totals."""
    total: dict[str, int] = {}
    for node in state.nodes.values():
        for reason, count in node.rejected.items():
            total[reason] = total.get(reason, 0) + count
    return total


def events_since(state: FleetState, since: int | None) -> list[FleetEvent]:
    return [e for e in state.events if since is None or e.seq > since]


# ---------------------------------------------------------------- helpers


@dataclass(frozen=True)
class Draft:
    """An event before it gets its sequence number and time."""

    kind: Kind
    node: int | None
    peer: int | None
    round: int | None
    detail: str
    by: str = ""


def _finish(state: FleetState, drafts: Iterable[Draft], now: float, relink: bool = True) -> Result:
    """Bump the version, re-derive links (adding link events), number and store events."""
    state = replace(state, version=state.version + 1)
    all_drafts = list(drafts)
    if relink:
        links = derive_links(state)
        offline = frozenset(n for n, info in state.nodes.items() if info.status == "offline")
        all_drafts += _link_changes(state.links, links, state.latest_round, offline)
        state = replace(state, links=_frozen(links))
    seq = state.next_seq
    events = tuple(
        FleetEvent(seq + i, now, d.kind, d.node, d.peer, d.round, d.detail, d.by)
        for i, d in enumerate(all_drafts)
    )
    if events:
        suspected = sum(e.kind in _SUSPICION_KINDS for e in events)
        if suspected:
            state = replace(state, counters=replace(state.counters, suspicions=state.counters.suspicions + suspected))
        kept = (*state.events, *events)[-state.max_events :]
        observed = [Observation(e.kind, e.node, e.peer, e.round, e.detail) for e in events]
        incidents = inc.observe(state.incidents, observed, state.fleet_round, now)
        state = replace(state, events=kept, next_seq=seq + len(events), incidents=incidents)
    return state, events


def _with_node(state: FleetState, node: NodeInfo) -> FleetState:
    nodes = dict(state.nodes)
    nodes[node.node] = node
    return replace(state, nodes=_frozen(nodes))


def _count(state: FleetState, kind: str) -> FleetState:
    messages = dict(state.counters.messages)
    messages[kind] = messages.get(kind, 0) + 1
    return replace(state, counters=replace(state.counters, messages=_frozen(messages)))


def _view_detail(old: View | None, new: View) -> str:
    text = f"epoch {new.epoch}: {len(new.members)} members, arity {new.arity}"
    if old is not None:
        gone = sorted(set(old.members) - set(new.members))
        came = sorted(set(new.members) - set(old.members))
        text += "".join([f", left {gone}" if gone else "", f", joined {came}" if came else ""])
        if new.chunk_values != old.chunk_values:
            text += f", chunks of {new.chunk_values:,} values" if new.chunk_values else ", chunks as configured"
        if new.broadcast != old.broadcast:
            text += f", {new.broadcast} broadcast" if new.broadcast else ", broadcast as configured"
    return text


def _telemetry_event(msg: Telemetry, raw: Mapping[str, Any]) -> Draft:
    peer = raw.get("peer")
    valid_peer = isinstance(peer, int) and not isinstance(peer, bool) and 0 <= peer <= 1023
    text, detail = str(raw.get("kind", ""))[:32], str(raw.get("detail", ""))
    note = note_kind(text)
    if note is None:  # a kind no agent of ours notes: shown as unknown, with what it said
        kind: Kind = EventKind.UNKNOWN
        detail = f"{text}: {detail}" if text else detail
    else:
        kind = _AGENT_KIND_ALIASES.get(note, note)
    return Draft(kind, msg.node, peer if valid_peer else None, msg.round, detail[:_MAX_TEXT])


def _parse_links(raw: Mapping[str, str]) -> dict[int, str]:
    links: dict[int, str] = {}
    for key, value in raw.items():
        if key.isdigit() and int(key) <= 1023:
            links[int(key)] = value
    return links


def _node_with_telemetry(node: NodeInfo, msg: Telemetry, now: float) -> NodeInfo:
    totals = replace(
        node,
        bytes_sent=node.bytes_sent + msg.bytes_sent,
        bytes_received=node.bytes_received + msg.bytes_received,
        reroutes=node.reroutes + msg.reroutes,
        timeouts=node.timeouts + msg.timeouts,
        pulls=node.pulls + msg.pulls,
        state_pulls=node.state_pulls + sum(
            1 for e in msg.events if isinstance(e, dict) and e.get("kind") == NoteKind.STATE_PULL),
        round_times=_observed(node.round_times, msg),
        last_seen=now,
        silence="",
    )
    if node.last_round is not None and msg.round < node.last_round:
        return totals  # a late report: counts, but does not roll the node's state back
    return replace(
        totals,
        last_round=msg.round,
        epoch=msg.epoch,
        loss=msg.loss if msg.loss is not None else totals.loss,
        accuracy=msg.accuracy if msg.accuracy is not None else totals.accuracy,
        degraded=msg.degraded,
        cpu_percent=msg.cpu_percent if msg.cpu_percent is not None else totals.cpu_percent,
        rss_bytes=msg.rss_bytes or totals.rss_bytes,
        dp_epsilon=msg.dp_epsilon if msg.dp_epsilon is not None else totals.dp_epsilon,
        model_hash=msg.model_hash[:64],
        rejected=_frozen({str(k)[:32]: max(0, v) for k, v in list(msg.rejected.items())[:32]}),
        links=_frozen(_parse_links(msg.links)),
        relaying=_relayed_for(msg),
    )


def _observed(times: RoundTimes, msg: Telemetry) -> RoundTimes:
    seconds = msg.phase_seconds.get("total")
    return times.observe(seconds) if isinstance(seconds, (int, float)) and seconds >= 0 else times


def _relayed_for(msg: Telemetry) -> frozenset[int]:
    """Peers whose frames this node relayed in the round: its link to each carried a detour."""
    peers = set()
    for raw in msg.events:
        if isinstance(raw, dict) and raw.get("kind") == NoteKind.RELAY:
            peer = raw.get("peer")
            if isinstance(peer, int) and not isinstance(peer, bool) and 0 <= peer <= 1023 and peer != msg.node:
                peers.add(peer)
    return frozenset(peers)


def _round_degraded_count(state: FleetState, round_no: int) -> int:
    summary = state.rounds.get(round_no)
    return 0 if summary is None else summary.degraded_nodes


def _merge_round(state: FleetState, msg: Telemetry, now: float, kinds: list[Kind]) -> FleetState:
    rounds = dict(state.rounds)
    counters = state.counters
    summary = rounds.get(msg.round)
    if summary is None:
        if len(rounds) >= state.max_rounds and msg.round < min(rounds):
            late = replace(counters, late_telemetry=counters.late_telemetry + 1)
            return replace(state, counters=_add_totals(late, msg, new_degraded=False))
        summary = RoundSummary(msg.round, msg.epoch, msg.algorithm[:32], now, state.version)
        counters = replace(counters, rounds=counters.rounds + 1)
    new_degraded = msg.degraded and summary.degraded_nodes == 0
    rounds[msg.round] = _summary_with(summary, msg, kinds, state.version + 1)
    while len(rounds) > state.max_rounds:
        del rounds[min(rounds)]
    counters = _add_totals(counters, msg, new_degraded)
    return replace(state, rounds=_frozen(rounds), counters=counters)


def _summary_with(s: RoundSummary, msg: Telemetry, kinds: list[Kind], version: int) -> RoundSummary:
    total = _phase(msg, "total")
    new_kinds = tuple(k for k in dict.fromkeys(kinds) if k not in s.event_kinds)
    return replace(
        s,
        version=version,
        reports=s.reports + 1,
        members=max(s.members, msg.members),
        loss_sum=s.loss_sum + (msg.loss if msg.loss is not None else 0.0),
        loss_count=s.loss_count + (msg.loss is not None),
        accuracy_sum=s.accuracy_sum + (msg.accuracy if msg.accuracy is not None else 0.0),
        accuracy_count=s.accuracy_count + (msg.accuracy is not None),
        round_seconds=max(s.round_seconds, total),
        node_seconds=(*s.node_seconds, total)[-1024:],
        bytes_sent=s.bytes_sent + msg.bytes_sent,
        reroutes=s.reroutes + msg.reroutes,
        timeouts=s.timeouts + msg.timeouts,
        nacks=s.nacks + msg.nacks,
        pulls=s.pulls + msg.pulls,
        degraded_nodes=s.degraded_nodes + msg.degraded,
        missing_chunks=s.missing_chunks + msg.missing_chunks,
        contributors=max(s.contributors, msg.contributors),
        event_kinds=(*s.event_kinds, *new_kinds)[:16],
        model_hashes=(*s.model_hashes, msg.model_hash[:64])[-1024:],
        local_steps=max(s.local_steps, msg.local_steps),
        samples=s.samples + msg.samples,
        compute_seconds=max(s.compute_seconds, _phase(msg, "compute")),
        sync_seconds=max(s.sync_seconds, _phase(msg, "allreduce")),
    )


def _phase(msg: Telemetry, name: str) -> float:
    value = msg.phase_seconds.get(name, 0.0)
    return float(value) if isinstance(value, (int, float)) else 0.0


def _add_totals(c: Counters, msg: Telemetry, new_degraded: bool) -> Counters:
    return replace(
        c,
        bytes_sent=c.bytes_sent + msg.bytes_sent,
        reroutes=c.reroutes + msg.reroutes,
        timeouts=c.timeouts + msg.timeouts,
        degraded_rounds=c.degraded_rounds + new_degraded,
    )


def _silence(state: FleetState, node: NodeInfo, latest: int | None, now: float) -> Silence:
    if node.status == "offline" or node.last_seen is None or node.last_round is None:
        return ""
    if latest is None or latest <= node.last_round or node.exited:
        return ""  # nobody moved on: a finished or paused job is not a hung fleet
    came_back = node.returned_at is not None and node.returned_at > node.last_seen
    if came_back and (state.view is None or node.node not in state.view.members):
        return ""  # back after a crash, not yet readmitted: nothing to report yet
    quiet = now - max(node.last_seen, node.returned_at or node.last_seen)
    if quiet > state.hung_after:
        return "hung"
    if quiet > state.suspect_after:
        return "suspected"
    return ""


def derive_links(state: FleetState) -> dict[tuple[int, int], LinkInfo]:
    """Links of the current tree (tree + backup) and any other link reported as not ok.

    A link's state is the worst report of its two ends (from each end's latest round);
    a link to an offline node is failed, whatever was last reported.
    """
    view = state.view
    kinds = dict(_link_kinds(view)) if view and view.members else {}
    reports: dict[tuple[int, int], str] = {}
    for node in state.nodes.values():
        for peer, seen in node.links.items():
            key = (min(node.node, peer), max(node.node, peer))
            if _LINK_SEVERITY.get(seen, 0) > _LINK_SEVERITY.get(reports.get(key, "unknown"), 0):
                reports[key] = seen
    for node in state.nodes.values():
        for peer in node.relaying:  # a detour through this link: the backup route in use
            key = (min(node.node, peer), max(node.node, peer))
            if _LINK_SEVERITY.get(reports.get(key, "unknown"), 0) < _LINK_SEVERITY["rerouted"]:
                reports[key] = "rerouted"
    for key, seen in reports.items():
        if key not in kinds and seen != "ok":
            kinds[key] = "extra"
    links: dict[tuple[int, int], LinkInfo] = {}
    for (a, b), kind in sorted(kinds.items()):
        seen = reports.get((a, b), "unknown")
        if any(_is_offline(state, n) for n in (a, b)):
            seen = "failed"
        links[(a, b)] = LinkInfo(a, b, kind, seen)  # type: ignore[arg-type]
    return links


# A view's tree, by what shapes it: members, arity, root and sites (views are not hashable).
_TreeKey = tuple[tuple[int, ...], int, int, tuple[str, ...]]
_TREES: dict[_TreeKey, tuple[Tree, Mapping[tuple[int, int], LinkKind]]] = {}
_MAX_TREES = 16


def _view_tree(view: View) -> Tree:
    """The tree the agents build from this view: rooted at its coordinator, site-aware."""
    return _tree_and_kinds(view)[0]


def _link_kinds(view: View) -> Mapping[tuple[int, int], LinkKind]:
    return _tree_and_kinds(view)[1]


def _tree_and_kinds(view: View) -> tuple[Tree, Mapping[tuple[int, int], LinkKind]]:
    key = (tuple(view.members), view.arity, view_root(view), tuple(view.sites))
    cached = _TREES.get(key)
    if cached is None:
        tree = view_tree(view)
        kinds: dict[tuple[int, int], LinkKind] = dict.fromkeys(tree.backup_links(), "backup")
        kinds.update(dict.fromkeys(tree.tree_links(), "tree"))
        if len(_TREES) >= _MAX_TREES:
            _TREES.clear()
        cached = _TREES[key] = (tree, _frozen(kinds))
    return cached
    return _frozen(kinds)


def _is_offline(state: FleetState, node: int) -> bool:
    info = state.nodes.get(node)
    return info is not None and info.status == "offline"


def _link_changes(
    old: Mapping[tuple[int, int], LinkInfo],
    new: Mapping[tuple[int, int], LinkInfo],
    round_no: int | None,
    offline: frozenset[int],
) -> list[Draft]:
    drafts: list[Draft] = []
    for key, link in new.items():
        before = old.get(key)
        previous = before.state if before is not None else "unknown"
        if link.state == previous or link.state == "unknown":
            continue
        if link.state == "failed" and (link.a in offline or link.b in offline):
            continue  # the node's crash/offline event already says it
        if link.state == "ok" and previous == "unknown":
            continue  # a link seen for the first time, working: not news
        detail = f"{link.kind} link {link.a}-{link.b}: {previous} -> {link.state}"
        drafts.append(Draft(_LINK_EVENT[link.state], link.a, link.b, round_no, detail))
    return drafts


def node_sites(state: FleetState) -> dict[int, str]:
    """Each known node's site: its status's, else the current view's; nodes without one are
    left out (a fleet without sites: {})."""
    view = state.view
    sites = dict(zip(view.members, view.sites, strict=True)) if view and view.sites else {}
    for node, info in state.nodes.items():
        if info.site:
            sites[node] = info.site
    return {n: s for n, s in sites.items() if s}
