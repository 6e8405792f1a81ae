"""The FastAPI app: REST + WebSocket over the FleetStore, the static page, fault controls."""

from __future__ import annotations

import asyncio
import contextlib
import html
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from importlib import resources
from typing import Annotated, Any

from fastapi import FastAPI, HTTPException, Query, Request, WebSocket, WebSocketDisconnect
from fastapi import Path as PathParam
from fastapi.responses import FileResponse, HTMLResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from agent.protocol.messages import Control, MessageError
from dashboard.access import Access, Refusal, add_access
from dashboard.accounts import load_accounts
from dashboard.agent_logs import MAX_NODE, LogUnavailable, tail_log
from dashboard.device_logs import PAGE as LOG_PAGE
from dashboard.device_logs import LogLevel, LogQuery
from dashboard.directory_models import DeviceModel, JobModel, devices_model, jobs_model
from dashboard.guards import check_control, origin_allowed
from dashboard.hardening import HardeningMiddleware
from dashboard.kinds import page_module
from dashboard.listener import BrokerUnavailable, MqttListener
from dashboard.metrics import BrokerLink, fleet_registry
from dashboard.models import (
    BrokerModel,
    ConfigModel,
    ControlRequest,
    ControlResponse,
    DeviceLogPageModel,
    EventModel,
    FleetModel,
    HealthModel,
    IncidentModel,
    LogTailModel,
    NodeSeriesModel,
    RoundModel,
    SnapshotMessage,
    device_log_model,
    event_model,
    fleet_model,
    incident_model,
    node_series_model,
    round_model,
)
from dashboard.replay import RecordedRun, RoundSnapshot, load_run, replay_into, snapshot_at
from dashboard.sessions import SESSION_COOKIE, Sessions
from dashboard.settings import DashboardSettings
from dashboard.state import FleetState, RunInfo, rounds_since
from dashboard.store import FleetStore

STATIC_DIR = resources.files("dashboard") / "static"
KINDS_MODULE = page_module()  # /kinds.js: the page's kinds, from the enums
SERIES_PAGE = 5000  # a node's rounds per /api/nodes/{node}/series page
FIRST_EVENTS = 5000  # events in a page's first snapshot; earlier ones by /api/events?before=
HEARTBEAT_SECONDS = 2.0  # a snapshot at least this often, so silence ages move on the page
WS_GOING_AWAY, WS_POLICY_VIOLATION, WS_TRY_AGAIN_LATER = 1001, 1008, 1013

Publisher = Callable[[str, bytes], None]


class Dashboard:
    """What the routes share: settings, the store, the listener (if a broker was given)."""

    def __init__(self, settings: DashboardSettings, publisher: Publisher | None = None) -> None:
        self.settings = settings
        recorded = load_run(settings.replay) if settings.replay is not None else None
        fleet_size = settings.fleet_size or (recorded.fleet_size if recorded else None)
        total_rounds = settings.total_rounds or (recorded.total_rounds if recorded else None)
        initial = FleetState(
            max_rounds=settings.max_rounds,
            max_events=settings.max_events,
            suspect_after=settings.suspect_after,
            hung_after=settings.hung_after,
            run=RunInfo(fleet_size=fleet_size, total_rounds=total_rounds),
        )
        self.wall_offset = recorded.started_at if recorded else time.time() - time.monotonic()
        # A replay is of its run's job, whatever --job says.
        self.job = recorded.job if recorded is not None and recorded.job else settings.job
        self.store = FleetStore(settings.topics, initial, time.monotonic, settings.event_log,
                                self.wall_offset, settings.max_history, settings.max_node_points)
        self.snapshots: dict[int, RoundSnapshot] = {}
        self.replayed_until = self._replay(recorded)
        self.listener: MqttListener | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.websockets = 0
        # Requests refused here (control API, WebSocket), by reason: shown with the counters.
        self.refused: Counter[str] = Counter()
        # Named accounts (--accounts): who may read, who may act.
        self.sessions = (Sessions(load_accounts(settings.accounts_file), time.monotonic)
                         if settings.accounts_file is not None else None)
        self.access = Access(settings, self.sessions, self.refused)
        self.sent_versions: dict[int, int] = {}  # per open socket: the state version it has
        self._fed = self._ingested = 0  # simulator records handed over / reduced
        self.closing = False
        self._publisher = publisher

    def _replay(self, recorded: RecordedRun | None) -> float | None:
        if recorded is None:
            return None
        self.snapshots = replay_into(self.store, recorded)
        return float(recorded.records[-1]["t"]) if recorded.records else 0.0

    def now(self) -> float:
        """The dashboard's clock; a replay stands still at the run's last record."""
        return self.replayed_until if self.replayed_until is not None else time.monotonic()

    def feed(self, record: Mapping[str, Any]) -> None:
        """A simulator record, from any thread: reduced on the server's event loop."""
        loop = self.loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed under our feet
                loop.call_soon_threadsafe(self._ingest, dict(record))
                self._fed += 1

    def _ingest(self, record: Mapping[str, Any]) -> None:
        self.store.ingest_record(record)
        self._ingested += 1

    def close_sockets(self) -> None:
        """From any thread: end every WebSocket (1001, going away), so a stopping server
        does not wait for pages that would keep their sockets open forever."""
        loop = self.loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._close_sockets)

    def _close_sockets(self) -> None:
        self.closing = True
        self.store.wake_all()

    def flushed(self) -> bool:
        """Every record fed is reduced and every open page has the resulting state: the
        server may stop without a page missing the run's end (it would reconnect forever)."""
        version = self.store.state.version
        return self._ingested >= self._fed and all(
            sent >= version for sent in tuple(self.sent_versions.values()))

    def publish(self, topic: str, payload: bytes) -> None:
        if self._publisher is not None:
            self._publisher(topic, payload)
        elif self.listener is not None:
            self.listener.publish(topic, payload)
        else:
            raise BrokerUnavailable("the dashboard was started without a broker")

    def broker_link(self) -> BrokerLink:
        broker = self.broker()
        return BrokerLink(broker.url, broker.connected, broker.connects)

    def broker(self) -> BrokerModel:
        listener = self.listener
        return BrokerModel(
            url=self.settings.broker_url,
            connected=listener is not None and listener.connected,
            last_error="" if listener is None else listener.last_error,
            connects=0 if listener is None else listener.connects,
        )

    def fleet(self, at_round: int | None = None) -> FleetModel:
        """The fleet now, or (a replay) as it was when ``at_round`` was the latest round."""
        state, now = self.store.state, self.now()
        if at_round is not None:
            snapshot = snapshot_at(self.snapshots, at_round)
            if snapshot is None:
                raise LookupError(f"no state at round {at_round}: the slider is for replays, "
                                  f"from round {min(self.snapshots, default=0)}")
            state, now = snapshot.state, snapshot.time
        return fleet_model(state, self.job, self.broker(), self.settings.controls_enabled, now,
                           self.wall_offset, self.refused, self.store.first_round,
                           self.store.history_dropped)

    def events(self, since: int | None, before: int | None = None, limit: int | None = None
               ) -> list[EventModel]:
        return [event_model(e, self.wall_offset) for e in self.store.events_page(since, before, limit)]


def create_app(settings: DashboardSettings, publisher: Publisher | None = None) -> FastAPI:
    """The app for one job. ``publisher`` replaces the MQTT publish of controls (tests)."""
    dash = Dashboard(settings, publisher)
    app = FastAPI(
        title="Edgegrove dashboard",
        description="The live state of one Edgegrove training job: fleet, tree, rounds, events.",
        version="0.1.0",
        lifespan=_lifespan(dash),
        # FastAPI's own /docs and /redoc load their scripts from a CDN: blank offline.
        docs_url=None,
        redoc_url=None,
    )
    add_access(app, dash.access)  # before the hardening: the Host check comes first
    app.add_middleware(HardeningMiddleware, bind_host=settings.host,
                       allowed_hosts=settings.allowed_hosts,
                       on_refused=lambda reason: dash.refused.update([reason]))
    app.state.dashboard = dash
    _add_health_routes(app, dash)
    _add_history_routes(app, dash)
    _add_node_routes(app, dash)
    _add_websocket(app, dash)
    _add_control(app, dash)
    _add_directory_routes(app, dash)
    _add_device_log_routes(app, dash)
    _add_page(app)
    return app


def _lifespan(dash: Dashboard) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The listener follows the broker while the app serves (not in a replay)."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        dash.loop = asyncio.get_running_loop()
        if dash.settings.broker_url is not None and dash.settings.replay is None:
            dash.listener = MqttListener(dash.settings, dash.store)
            await dash.listener.start()
        try:
            yield
        finally:
            if dash.listener is not None:
                await dash.listener.stop()
            dash.store.close()

    return lifespan


def _add_page(app: FastAPI) -> None:
    """The page, its files, and the API described as one plain page."""
    app.mount("/static", StaticFiles(directory=str(STATIC_DIR)), name="static")

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(str(STATIC_DIR / "index.html"))

    @app.get("/kinds.js", include_in_schema=False)
    async def kinds() -> Response:
        return Response(KINDS_MODULE, media_type="text/javascript")

    @app.get("/docs", include_in_schema=False, response_class=HTMLResponse)
    async def docs() -> str:
        return api_docs_page(app.openapi())


# The query parameters that page a history: /api/rounds, /api/events, a node's series.
Since = Annotated[int | None, Query(description="only those numbered above this (a round by its "
                                     "number, an event by its seq)")]
Before = Annotated[int | None, Query(description="only those numbered below this")]
Limit = Annotated[int | None, Query(ge=1, description="at most this many: the first after `since`, "
                                   "or the last before `before`")]
NodeId = Annotated[int, PathParam(ge=0, le=MAX_NODE, description="the node id")]


def _add_health_routes(app: FastAPI, dash: Dashboard) -> None:
    registry = fleet_registry(lambda: dash.store.state, dash.job, dash.broker_link, lambda: dash.store.directory,
                              dash.store.device_logs)

    @app.get("/healthz", response_model=HealthModel, tags=["health"])
    async def healthz() -> HealthModel:
        return HealthModel(ok=True, broker_connected=dash.broker().connected,
                           version=dash.store.state.version)

    @app.get("/metrics", tags=["health"], response_class=PlainTextResponse)
    async def metrics() -> PlainTextResponse:
        """The fleet and each node in Prometheus text format (rounds, round time, degraded
        rounds, reroutes, suspicions, rejected frames, bytes, RSS, CPU, online)."""
        return PlainTextResponse(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/api/config", response_model=ConfigModel, tags=["fleet"])
    async def config() -> ConfigModel:
        return ConfigModel(job=dash.job, controls_enabled=dash.settings.controls_enabled,
                           push_interval=dash.settings.push_interval)


def _add_history_routes(app: FastAPI, dash: Dashboard) -> None:
    @app.get("/api/fleet", response_model=FleetModel, tags=["fleet"],
             responses={404: {"description": "no state at that round (not a replay, or before its first)"}})
    async def fleet(
        at_round: Annotated[int | None, Query(
            alias="round", description="a replay: the fleet as it was at this round")] = None,
    ) -> FleetModel:
        try:
            return dash.fleet(at_round)
        except LookupError as exc:
            raise HTTPException(status_code=404, detail=str(exc)) from None

    @app.get("/api/rounds", response_model=list[RoundModel], tags=["fleet"])
    async def rounds(since: Since = None, before: Before = None, limit: Limit = None) -> list[RoundModel]:
        """Every round of the run by number, oldest first (the whole history; page it with
        since/before/limit)."""
        return [round_model(r) for r in dash.store.rounds_page(since, before, limit)]

    @app.get("/api/events", response_model=list[EventModel], tags=["fleet"])
    async def events(since: Since = None, before: Before = None, limit: Limit = None) -> list[EventModel]:
        """Every event of the run by seq (the whole history; page it with since/before/limit)."""
        return dash.events(since, before, limit)

    @app.get("/api/incidents", response_model=list[IncidentModel], tags=["fleet"])
    async def incidents() -> list[IncidentModel]:
        """Fault windows and incidents (inject -> detect -> heal), oldest first."""
        return [incident_model(i, dash.wall_offset) for i in dash.store.state.incidents]


def _add_directory_routes(app: FastAPI, dash: Dashboard) -> None:
    @app.get("/api/devices", response_model=list[DeviceModel], tags=["devices and jobs"])
    async def devices() -> list[DeviceModel]:
        """Every device whose retained record the broker holds (edgegrove/devices/<device>)."""
        return devices_model(dash.store.directory, dash.wall_offset)

    @app.get("/api/jobs", response_model=list[JobModel], tags=["devices and jobs"])
    async def jobs() -> list[JobModel]:
        """Every job the broker holds a document or an execution of: running first, then newest."""
        return jobs_model(dash.store.directory)


def _add_device_log_routes(app: FastAPI, dash: Dashboard) -> None:
    @app.get("/api/logs", response_model=DeviceLogPageModel, tags=["devices and jobs"])
    async def device_logs(
        since: Since = None,
        device: Annotated[str | None, Query(max_length=63, description="only this device's lines")] = None,
        level: Annotated[str, Query(pattern="^(warning|error|critical)$",
                                    description="only lines of this level and above")] = "warning",
        q: Annotated[str, Query(max_length=200, description="only lines containing this (any case)")] = "",
        limit: Annotated[int, Query(ge=1, le=LOG_PAGE)] = LOG_PAGE,
    ) -> DeviceLogPageModel:
        """The devices' warnings and errors (edgegrove/devices/<device>/log), oldest first, each
        at the round its device was in: the first ``limit`` after ``since``, else the last."""
        book = dash.store.device_logs
        query = LogQuery(since, device, LogLevel.named(level), q, limit)
        return DeviceLogPageModel(lines=[device_log_model(line, dash.wall_offset) for line in book.page(query)],
                                  last_seq=book.next_seq - 1, devices=sorted(book.devices),
                                  unreadable=book.unreadable)


def _add_node_routes(app: FastAPI, dash: Dashboard) -> None:
    @app.get("/api/nodes/{node}/log", response_model=LogTailModel, tags=["fleet"],
             responses={404: {"description": "no run directory, or no log for that node in it"}})
    async def node_log(
        node: NodeId,
        lines: Annotated[int, Query(ge=1, le=5000, description="how many last lines")] = 200,
    ) -> LogTailModel:
        """The tail of the node's agent log in the run directory (agents/agent-N.log)."""
        try:
            tail = await asyncio.to_thread(tail_log, dash.settings.logs_run_dir, node, lines)
        except LogUnavailable as exc:
            raise HTTPException(status_code=404, detail=str(exc)) from None
        return LogTailModel(node=tail.node, path=tail.path, size=tail.size,
                            lines=list(tail.lines), truncated=tail.truncated)

    @app.get("/api/nodes/{node}/series", response_model=NodeSeriesModel, tags=["fleet"],
             responses={404: {"description": "no node with that id has reported a round"}})
    async def node_series(
        node: NodeId, since: Since = None, before: Before = None,
        limit: Annotated[int | None, Query(ge=1, le=SERIES_PAGE, description="at most this many: the "
                                           "first after `since`, or the last before `before`")] = SERIES_PAGE,
    ) -> NodeSeriesModel:
        """One node's own rounds, oldest first: its round time, its process's CPU and
        memory, the bytes it sent and received (page it with since/before/limit)."""
        book = dash.store.node_series
        if node not in book:
            raise HTTPException(status_code=404, detail=f"node {node} has reported no round")
        return node_series_model(node, book.page(node, since, before, limit))


def _add_control(app: FastAPI, dash: Dashboard) -> None:
    @app.post(
        "/api/control",
        response_model=ControlResponse,
        tags=["control"],
        responses={403: {"description": "controls disabled, a missing or wrong token and no operator "
                                        "logged in, or a viewer (who only reads)"},
                   503: {"description": "not connected to the broker"}},
    )
    async def control(request: ControlRequest, http: Request) -> ControlResponse:
        """A fault command, from an operator (a logged-in account or the control token);
        the job's event log records who sent it."""
        actor = dash.access.operator_of(http)
        if isinstance(actor, Refusal):
            dash.refused[actor.reason] += 1
            raise HTTPException(status_code=403, detail=actor.detail)
        state = dash.store.state
        try:
            message = Control(**request.model_dump())
            message.validate()
            check_control(message, state)
        except (MessageError, ValueError) as exc:
            dash.refused["control_invalid"] += 1
            raise HTTPException(status_code=422, detail=str(exc)) from None
        topic = dash.settings.topics.control
        after = state.controls[-1].seq if state.controls else 0
        try:
            dash.publish(topic, message.encode())
        except BrokerUnavailable as exc:
            raise HTTPException(status_code=503, detail=str(exc)) from None
        dash.store.operator_command(message, actor.name)
        return ControlResponse(published=True, topic=topic, after=after)


def _add_websocket(app: FastAPI, dash: Dashboard) -> None:
    @app.websocket("/ws")
    async def ws(socket: WebSocket) -> None:
        origin, host = socket.headers.get("origin"), socket.headers.get("host", "")
        if not origin_allowed(origin, host, dash.settings.allowed_origins):
            # Closing before accept refuses the handshake (HTTP 403).
            dash.refused["websocket_origin"] += 1
            await socket.close(code=WS_POLICY_VIOLATION, reason="origin not allowed")
            return
        if not dash.access.may_read(dash.access.actor(None, socket.cookies.get(SESSION_COOKIE), origin, host)):
            dash.refused["login_needed"] += 1
            await socket.close(code=WS_POLICY_VIOLATION, reason="log in first")
            return
        if dash.websockets >= dash.settings.max_websockets:
            dash.refused["websocket_full"] += 1
            await socket.close(code=WS_TRY_AGAIN_LATER, reason="too many connections")
            return
        dash.websockets += 1
        changed = dash.store.subscribe()
        try:
            await socket.accept()
            await _push_snapshots(socket, dash, changed)
        except (WebSocketDisconnect, RuntimeError, OSError):
            pass  # the browser went away (or the server is stopping)
        finally:
            dash.store.unsubscribe(changed)
            dash.sent_versions.pop(id(socket), None)
            dash.websockets -= 1


async def _push_snapshots(socket: WebSocket, dash: Dashboard, changed: asyncio.Event) -> None:
    """Full history first, then deltas: at most one message per push_interval."""
    sent_version: int | None = None
    sent_seq: int | None = None
    while not dash.closing:
        changed.clear()
        state = dash.store.state
        changed_rounds = [r for r in rounds_since(state, None)
                          if sent_version is None or r.version > sent_version]
        message = SnapshotMessage(
            full=sent_version is None,
            fleet=dash.fleet(),
            rounds=[round_model(r) for r in changed_rounds],
            # A first snapshot carries the latest events; the page loads earlier ones by REST.
            events=dash.events(sent_seq, limit=FIRST_EVENTS if sent_seq is None else None),
        )
        await socket.send_text(message.model_dump_json())
        sent_version, sent_seq = state.version, state.next_seq - 1
        dash.sent_versions[id(socket)] = sent_version
        await asyncio.sleep(dash.settings.push_interval)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), HEARTBEAT_SECONDS)
    await socket.close(code=WS_GOING_AWAY)


def api_docs_page(schema: Mapping[str, Any]) -> str:
    """The API's routes as one plain page, from the OpenAPI schema (served, no CDN)."""
    rows = []
    for path, operations in schema.get("paths", {}).items():
        for method, op in operations.items():
            params = ", ".join(p.get("name", "") for p in op.get("parameters", []))
            text = op.get("description") or op.get("summary", "")
            rows.append(f"<tr><td><code>{html.escape(method.upper())}</code></td>"
                        f"<td><code>{html.escape(path)}</code></td><td>{html.escape(params)}</td>"
                        f"<td>{html.escape(text)}</td></tr>")
    title = html.escape(str(schema.get("info", {}).get("title", "API")))
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{title}</title>"
            "<link rel=stylesheet href=/static/style.css></head><body><main class=card>"
            f"<h1>{title}</h1><p>The full schema: <a href=/openapi.json>/openapi.json</a> "
            "(load it into any OpenAPI viewer).</p><table class=nodes><thead><tr><th>method</th>"
            f"<th>path</th><th>parameters</th><th>what</th></tr></thead><tbody>{''.join(rows)}"
            "</tbody></table></main></body></html>")
