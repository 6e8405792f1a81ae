"""Pydantic response models (they make /docs accurate) and their construction from FleetState."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, Field

from agent.protocol.messages import View
from agent.protocol.topology import Tree
from dashboard.device_logs import DeviceLogLine
from dashboard.incidents import Incident
from dashboard.kinds import IncidentKind, Kind
from dashboard.node_series import SeriesPage
from dashboard.state import (
    BridgeInfo,
    ControlOutcome,
    FleetEvent,
    FleetState,
    LinkInfo,
    NodeInfo,
    RoundSummary,
    model_mismatch,
    node_sites,
    rejected_frames,
)

_BAD_LINK = ("suspected", "rerouted", "failed")
_NODE_FAULTS = frozenset({IncidentKind.CRASH, IncidentKind.HANG, IncidentKind.LOSS, IncidentKind.LATENCY,
                          IncidentKind.BANDWIDTH, IncidentKind.ISOLATE})


class ViewModel(BaseModel):
    epoch: int
    members: list[int]
    arity: int
    coordinator: int
    from_round: int
    chunk_values: int = Field(0, description="values per chunk in its rounds; 0: the agents' configured chunk_size")
    broadcast: str = Field("", description="how the result reaches the members in its rounds (fanout, tree); empty: the agents' configured broadcast")
    fingerprint: str = Field("", description="the fleet's model (the coordinator's): 16 hex; empty: not said")
    model: str = Field("", description="the fleet's model's name")
    params: int = Field(0, description="the fleet's model's parameter count")


NodeState = Literal["online", "joining", "rejoining", "suspected", "hung", "evicted", "offline", "unknown"]


class NodeModel(BaseModel):
    node: int
    state: NodeState = Field(
        description="evicted: connected (or silent) but out of the current view, routed around until it rejoins")
    status: str = Field(description="last status message: online, joining, offline or unknown")
    incarnation: int
    pid: int
    in_view: bool
    parent: int | None = Field(description="tree parent in the current view (None: root/outside)")
    depth: int | None
    backup: int | None
    last_round: int | None
    seconds_silent: float | None = Field(description="seconds since its last telemetry")
    loss: float | None
    accuracy: float | None
    degraded: bool
    model_hash: str
    bytes_sent: int
    bytes_received: int
    reroutes: int
    restarts: int = Field(description="times the agent came back as a new incarnation")
    cpu_percent: float | None = Field(None, description="its process's CPU in its latest round, "
                                      "percent of one core (null: never said)")
    rss_bytes: int | None = Field(None, description="its process's resident memory (null: never said)")
    rejected: dict[str, int] = Field(description="frames this agent rejected, by reason")
    at_fault: bool = Field(description="the node is the likely cause of its links' trouble")
    faults: list[IncidentKind] = Field(description="kinds of the active incidents that target it")
    fingerprint: str = Field("", description="its model's fingerprint, as its status says")
    model: str = Field("", description="its model's name")
    params: int = Field(0, description="its model's parameter count")
    model_mismatch: bool = Field(False, description="it runs another model than the fleet's view names (refused)")
    exited: bool = Field(False, description="it left because the run is over; shown in its last live state")
    relaying: list[int] = Field(default_factory=list,
                                description="peers whose frames it relayed in its latest round")
    labels: list[int] = Field(default_factory=list,
                              description="training samples per label in its shard (index = label)")
    site: str = Field("", description="its site (its status's, else the view's); empty: none")


class LinkModel(BaseModel):
    a: int
    b: int
    kind: Literal["tree", "backup", "extra"]
    state: Literal["ok", "suspected", "failed", "rerouted", "unknown"]
    blame: Literal["", "link", "node"] = Field(
        description="link: this link is at fault; node: one of its ends is (see NodeModel)")


class BridgeModel(BaseModel):
    state: Literal["up", "down", "unknown"] = Field(
        description="connected to the core broker or not (unknown: nobody said yet)")
    source: Literal["", "broker", "simulator"] = Field(
        description="who said the state: the broker's bridge notification, or the simulator's "
                    "uplink (cut or not), when no notification was heard")
    since: float | None = Field(description="Unix time of its last change of state")
    downs: int = Field(description="times it went down")
    bytes_up: int | None = Field(description="bytes to the core through its uplink (null: not counted)")
    bytes_down: int | None = Field(description="bytes from the core through its uplink")
    rate_up: float | None = Field(description="bytes/s to the core, over the last second or more")
    rate_down: float | None = Field(description="bytes/s from the core")
    sampled_at: float | None = Field(description="Unix time of the byte counts")


class SiteModel(BaseModel):
    name: str
    nodes: list[int] = Field(description="the nodes at this site")
    bridge: BridgeModel | None = Field(description="its bridge to the core (null: never reported)")


class IncidentModel(BaseModel):
    id: int
    kind: IncidentKind
    targets: list[int]
    title: str
    source: Literal["injected", "detected", "operator"] = Field(
        description="injected: by the simulator's scenario; operator: with the dashboard's "
                    "controls; detected: seen by the fleet, announced by nobody")
    active: bool
    start_round: int | None
    end_round: int | None
    detected_round: int | None
    recovered_round: int | None = Field(
        description="the round its targets were back in the view with the fleet's model hash "
                    "(None: no recovery seen yet)")
    healed_round: int | None = Field(None, description="the round the fault was undone (heal, restart, resume)")
    start_time: float = Field(description="Unix time it opened")
    end_time: float | None
    evidence: list[str]


class ControlOutcomeModel(BaseModel):
    seq: int
    time: float
    action: str
    node: int
    peer: int | None
    applied: bool
    outcome: str


class OperatorActionModel(BaseModel):
    seq: int
    time: float = Field(description="Unix time the dashboard sent it (or the simulator answered)")
    round: int | None = Field(description="the fleet's round when it was sent")
    action: str
    targets: list[int] = Field(description="the node, or the link's two ends")
    incident: IncidentKind | None = Field(description="the kind of fault it makes or undoes")
    undoes: bool
    outcome: str = Field(description="what the simulator said it did (empty: no answer)")
    by: str = Field(default="", description="who sent it: the operator's account (`token`: the control token)")


class RunModel(BaseModel):
    phase: Literal["live", "ending", "finished"]
    fleet_size: int | None
    replay_hint: str
    replay_of: str


class CountersModel(BaseModel):
    messages: dict[str, int]
    malformed: dict[str, int] = Field(description="messages ignored, by reason")
    malformed_total: int
    rejected_frames: dict[str, int] = Field(
        description="frames the agents rejected, by reason (sum of each agent's latest totals)")
    rejected_total: int
    refused_requests: dict[str, int] = Field(
        default_factory=dict,
        description="requests the dashboard itself refused, by reason (control API, WebSocket)")
    refused_requests_total: int = 0
    rounds: int
    latest_round: int | None
    first_round: int | None = Field(
        default=None, description="the run's first round the server holds: /api/rounds serves "
        "every round from it (the page is pushed only the latest rounds and loads earlier ones)")
    bytes_sent: int
    reroutes: int
    timeouts: int
    degraded_rounds: int
    late_telemetry: int
    events: int
    events_dropped: int = Field(
        default=0, description="the run's earliest events the server no longer holds "
        "(past --max-history); 0 when /api/events serves every event")


class BrokerModel(BaseModel):
    url: str | None
    connected: bool
    last_error: str
    connects: int


class FleetModel(BaseModel):
    job: str
    version: int
    controls_enabled: bool
    broker: BrokerModel
    view: ViewModel | None
    nodes: list[NodeModel]
    links: list[LinkModel]
    counters: CountersModel
    fleet_round: int | None = Field(description="the round the fleet is in (latest + 1)")
    incidents: list[IncidentModel]
    controls: list[ControlOutcomeModel]
    operator_actions: list[OperatorActionModel] = Field(
        default_factory=list, description="the operator's commands from the dashboard's controls")
    run: RunModel
    sites: list[SiteModel] = Field(default_factory=list,
                                   description="the fleet's sites and their bridges (empty: no sites)")


class RoundModel(BaseModel):
    round: int
    epoch: int
    algorithm: str
    version: int
    reports: int
    members: int
    loss: float | None
    accuracy: float | None
    round_seconds: float = Field(description="the slowest agent's round time, seconds")
    round_seconds_median: float = Field(description="the median agent's round time, seconds")
    bytes_sent: int
    reroutes: int
    timeouts: int
    nacks: int
    pulls: int
    degraded: bool
    degraded_nodes: int
    missing_chunks: int
    contributors: int
    event_kinds: list[Kind]
    local_steps: int = Field(1, description="optimizer steps each agent took before the round's average")
    samples: int = Field(0, description="training samples behind the round's reports (0: not said)")
    compute_seconds: float = Field(0.0, description="the slowest agent's local steps, seconds")
    sync_seconds: float = Field(0.0, description="the slowest agent's allreduce, seconds")
    bytes_per_sample: float | None = Field(None, description="bytes the agents sent per sample trained")


class EventModel(BaseModel):
    seq: int
    time: float = Field(description="Unix time (seconds) when the dashboard saw it")
    kind: Kind = Field(description="an agent's note (NoteKind) or the dashboard's own event (EventKind)")
    node: int | None
    peer: int | None
    round: int | None
    detail: str
    by: str = Field(default="", description="who sent it: the operator's account (`token` for the "
                    "control token) of a command from the dashboard, else empty")


class NodePointModel(BaseModel):
    round: int
    round_seconds: float | None = Field(description="the node's round time, seconds")
    cpu_percent: float | None = Field(description="its process's CPU, percent of one core "
                                      "since its previous report (null: not said)")
    rss_bytes: int | None = Field(description="its process's resident memory (null: not said)")
    bytes_sent: int = Field(description="bytes it sent in the round")
    bytes_received: int = Field(description="bytes it received in the round")


class NodeSeriesModel(BaseModel):
    node: int
    first_round: int | None = Field(description="the node's first round the server keeps")
    last_round: int | None = Field(description="its latest round")
    dropped: int = Field(description="older rounds no longer kept (past --max-node-points)")
    points: list[NodePointModel] = Field(description="the rounds asked for, oldest first")


class LogTailModel(BaseModel):
    node: int
    path: str = Field(description="the log file, relative to the run directory")
    size: int = Field(description="the whole file's size in bytes")
    lines: list[str] = Field(description="its last lines, oldest first")
    truncated: bool = Field(description="earlier lines exist that are not shown")


class HealthModel(BaseModel):
    ok: bool
    broker_connected: bool
    version: int


class ConfigModel(BaseModel):
    job: str
    controls_enabled: bool
    push_interval: float


class ControlRequest(BaseModel):
    action: Literal["cut", "heal", "crash", "restart", "hang", "resume", "loss", "latency",
                    "isolate", "rejoin", "broker_restart"] = Field(
        description="broker_restart: the simulator stops its own broker and starts it again "
                    "`value` seconds later (`node` is not used)")
    node: int = Field(ge=0, le=1023)
    peer: int | None = Field(default=None, ge=0, le=1023)
    value: float | None = None
    one_way: bool = False


class ControlResponse(BaseModel):
    published: bool
    topic: str
    after: int = Field(description="the simulator's outcome of this command will have seq > after")


class SnapshotMessage(BaseModel):
    """What the WebSocket sends: the fleet, plus rounds and events changed since the last one."""

    type: Literal["snapshot"] = "snapshot"
    full: bool = Field(description="True: rounds/events are the whole history, not a delta")
    fleet: FleetModel
    rounds: list[RoundModel]
    events: list[EventModel]


def node_state(info: NodeInfo, outside_view: bool) -> NodeState:
    """The state the page shows: a node the fleet took out of its view (suspected silent, or
    its connection flapping) while it is not offline is *evicted* until it rejoins."""
    if outside_view and info.status == "online":
        return "evicted"
    return info.display  # joining: "joining", or "rejoining" after an earlier life


def node_model(info: NodeInfo, tree: Tree | None, now: float, blamed: frozenset[int],
               faults: list[IncidentKind], view: View | None = None, site: str = "") -> NodeModel:
    in_view = tree is not None and info.node in tree
    return NodeModel(
        node=info.node,
        state=node_state(info, tree is not None and not in_view),
        status=info.status,
        incarnation=info.incarnation,
        pid=info.pid,
        in_view=in_view,
        parent=tree.parent(info.node) if tree is not None and in_view else None,
        depth=tree.depth(info.node) if tree is not None and in_view else None,
        backup=tree.backup(info.node) if tree is not None and in_view else None,
        last_round=info.last_round,
        seconds_silent=None if info.last_seen is None else round(max(0.0, now - info.last_seen), 2),
        loss=info.loss,
        accuracy=info.accuracy,
        degraded=info.degraded,
        model_hash=info.model_hash,
        bytes_sent=info.bytes_sent,
        bytes_received=info.bytes_received,
        reroutes=info.reroutes,
        restarts=info.restarts,
        cpu_percent=info.cpu_percent,
        rss_bytes=info.rss_bytes or None,
        rejected=dict(info.rejected),
        at_fault=info.node in blamed,
        faults=faults,
        fingerprint=info.fingerprint,
        model=info.model,
        params=info.params,
        model_mismatch=model_mismatch(view, info),
        labels=list(info.labels),
        exited=info.exited,
        relaying=sorted(info.relaying),
        site=site,
    )


def link_model(link: LinkInfo, blamed: frozenset[int]) -> LinkModel:
    blame: Literal["", "link", "node"] = ""
    if link.state in _BAD_LINK:
        blame = "node" if {link.a, link.b} & blamed else "link"
    return LinkModel(a=link.a, b=link.b, kind=link.kind, state=link.state, blame=blame)


def blamed_nodes(state: FleetState) -> frozenset[int]:
    """Nodes at fault: the targets of active node faults, and a node whose links are the bad
    ones (five per cent loss at one node makes every link it uses look bad, but the links of
    the other nodes only through it)."""
    blamed = {t for i in state.incidents if i.active and i.kind in _NODE_FAULTS for t in i.targets}
    degree: dict[int, int] = {}
    for link in state.links.values():
        # a backup route in use is the detour working, not a symptom of either end
        if link.state in _BAD_LINK and not (link.state == "rerouted" and link.kind == "backup"):
            for end in (link.a, link.b):
                degree[end] = degree.get(end, 0) + 1
    ranked = sorted(degree.values(), reverse=True)
    if ranked and ranked[0] >= 2 and (len(ranked) == 1 or ranked[0] > ranked[1]):
        blamed |= {n for n, d in degree.items() if d == ranked[0]}
    return frozenset(blamed)


def bridge_model(b: BridgeInfo, wall_offset: float) -> BridgeModel:
    def wall(t: float | None) -> float | None:
        return None if t is None else round(t + wall_offset, 3)

    def rate(r: float | None) -> float | None:
        return None if r is None else round(r, 1)

    return BridgeModel(state=b.state, source=b.source, since=wall(b.since), downs=b.downs,
                       bytes_up=b.bytes_up, bytes_down=b.bytes_down, rate_up=rate(b.rate_up),
                       rate_down=rate(b.rate_down), sampled_at=wall(b.sampled_at))


def site_models(state: FleetState, sites: Mapping[int, str], wall_offset: float) -> list[SiteModel]:
    """Every site a node or a bridge names, by name, with its nodes and its bridge."""
    names = sorted({*sites.values(), *state.bridges})
    bridges = state.bridges
    return [SiteModel(name=name, nodes=sorted(n for n, s in sites.items() if s == name),
                      bridge=bridge_model(bridges[name], wall_offset) if name in bridges else None)
            for name in names]


def incident_model(i: Incident, wall_offset: float) -> IncidentModel:
    return IncidentModel(
        id=i.id, kind=i.kind, targets=list(i.targets), title=i.title, source=i.source,
        active=i.active, start_round=i.start_round, end_round=i.end_round,
        detected_round=i.detected_round, recovered_round=i.recovered_round,
        healed_round=i.healed_round, start_time=round(i.start_time + wall_offset, 3),
        end_time=None if i.end_time is None else round(i.end_time + wall_offset, 3),
        evidence=list(i.evidence),
    )


def control_outcome_model(c: ControlOutcome, wall_offset: float) -> ControlOutcomeModel:
    return ControlOutcomeModel(seq=c.seq, time=round(c.time + wall_offset, 3), action=c.action,
                               node=c.node, peer=c.peer, applied=c.applied, outcome=c.outcome)


def counters_model(state: FleetState, refused: Mapping[str, int] | None = None) -> CountersModel:
    c = state.counters
    rejected = rejected_frames(state)
    refused = dict(refused or {})
    return CountersModel(
        refused_requests=refused,
        refused_requests_total=sum(refused.values()),
        messages=dict(c.messages),
        malformed=dict(c.malformed),
        malformed_total=sum(c.malformed.values()),
        rejected_frames=rejected,
        rejected_total=sum(rejected.values()),
        rounds=c.rounds,
        latest_round=state.latest_round,
        bytes_sent=c.bytes_sent,
        reroutes=c.reroutes,
        timeouts=c.timeouts,
        degraded_rounds=c.degraded_rounds,
        late_telemetry=c.late_telemetry,
        events=state.next_seq - 1,
    )


def fleet_model(
    state: FleetState, job: str, broker: BrokerModel, controls: bool, now: float,
    wall_offset: float = 0.0, refused: Mapping[str, int] | None = None,
    first_round: int | None = None, events_dropped: int = 0,
) -> FleetModel:
    tree = state.tree
    view = state.view
    blamed = blamed_nodes(state)
    active = [i for i in state.incidents if i.active]
    sites = node_sites(state)
    return FleetModel(
        job=job,
        version=state.version,
        controls_enabled=controls,
        broker=broker,
        view=None if view is None else ViewModel(
            epoch=view.epoch, members=list(view.members), arity=view.arity,
            coordinator=view.coordinator, from_round=view.from_round, chunk_values=view.chunk_values,
            broadcast=view.broadcast, fingerprint=view.fingerprint, model=view.model, params=view.params,
        ),
        nodes=[node_model(state.nodes[n], tree, now, blamed,
                          [i.kind for i in active if n in i.targets], view, sites.get(n, ""))
               for n in sorted(state.nodes)],
        links=[link_model(link, blamed) for link in state.links.values()],
        counters=counters_model(state, refused).model_copy(
            update={"first_round": first_round, "events_dropped": events_dropped}),
        fleet_round=state.fleet_round,
        incidents=[incident_model(i, wall_offset) for i in state.incidents],
        controls=[control_outcome_model(c, wall_offset) for c in state.controls],
        operator_actions=[OperatorActionModel(
            seq=a.seq, time=round(a.time + wall_offset, 3), round=a.round, action=a.action,
            targets=list(a.targets), incident=a.incident, undoes=a.undoes, outcome=a.outcome, by=a.by)
            for a in state.operator_actions],
        run=RunModel(phase=state.run.phase, fleet_size=state.run.fleet_size,
                     replay_hint=state.run.replay_hint, replay_of=state.run.replay_of),
        sites=site_models(state, sites, wall_offset),
    )


def round_model(s: RoundSummary) -> RoundModel:
    return RoundModel(
        round=s.round, epoch=s.epoch, algorithm=s.algorithm, version=s.version,
        reports=s.reports, members=s.members, loss=s.loss, accuracy=s.accuracy,
        round_seconds=s.round_seconds, round_seconds_median=s.median_seconds, bytes_sent=s.bytes_sent, reroutes=s.reroutes,
        timeouts=s.timeouts, nacks=s.nacks, pulls=s.pulls, degraded=s.degraded,
        degraded_nodes=s.degraded_nodes, missing_chunks=s.missing_chunks,
        contributors=s.contributors, event_kinds=list(s.event_kinds), local_steps=s.local_steps,
        samples=s.samples, compute_seconds=round(s.compute_seconds, 4), sync_seconds=round(s.sync_seconds, 4),
        bytes_per_sample=None if s.bytes_per_sample is None else round(s.bytes_per_sample, 1),
    )


def event_model(e: FleetEvent, wall_offset: float) -> EventModel:
    return EventModel(
        seq=e.seq, time=round(e.time + wall_offset, 3), kind=e.kind, node=e.node, peer=e.peer,
        round=e.round, detail=e.detail, by=e.by,
    )


def node_series_model(node: int, page: SeriesPage) -> NodeSeriesModel:
    return NodeSeriesModel(
        node=node, first_round=page.first_round, last_round=page.last_round, dropped=page.dropped,
        points=[NodePointModel(round=p.round, round_seconds=p.round_seconds, cpu_percent=p.cpu_percent,
                               rss_bytes=p.rss_bytes, bytes_sent=p.bytes_sent,
                               bytes_received=p.bytes_received) for p in page.points])


class DeviceLogLineModel(BaseModel):
    seq: int
    device: str
    level: str = Field(description="warning, error or critical")
    logger: str
    line: str
    time: float = Field(description="Unix time: the device's own clock, else when the dashboard heard it")
    heard_at: float = Field(description="Unix time when the dashboard heard it")
    job: str | None = Field(description="the job the device was in")
    node: int | None = Field(description="its node in that job")
    round: int | None = Field(description="the round the device was in when the line arrived")
    dropped: int = Field(description="lines the device dropped (its rate limit) just before this one")


class DeviceLogPageModel(BaseModel):
    lines: list[DeviceLogLineModel]
    last_seq: int = Field(description="the newest line's seq the dashboard holds (0: none); ask ?since= it")
    devices: list[str] = Field(description="every device a line was heard from")
    unreadable: int = Field(description="messages on a log topic that did not parse")


def device_log_model(line: DeviceLogLine, wall_offset: float) -> DeviceLogLineModel:
    heard = round(line.heard_at + wall_offset, 3)
    return DeviceLogLineModel(
        seq=line.seq, device=line.device, level=line.level.name.lower(), logger=line.logger, line=line.line,
        time=line.sent_at if line.sent_at is not None else heard, heard_at=heard, job=line.job,
        node=line.node, round=line.round, dropped=line.dropped)
