"""The FastAPI app: REST + WebSocket over the FleetStore, the static page, fault controls."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from importlib import resources
from typing import Annotated

from fastapi import FastAPI, Header, HTTPException, Query, WebSocket, WebSocketDisconnect
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from agent.protocol.messages import Control, MessageError
from dashboard.listener import BrokerUnavailable, MqttListener
from dashboard.models import (
    BrokerModel,
    ConfigModel,
    ControlRequest,
    ControlResponse,
    EventModel,
    FleetModel,
    HealthModel,
    RoundModel,
    SnapshotMessage,
    event_model,
    fleet_model,
    round_model,
)
from dashboard.settings import DashboardSettings
from dashboard.state import FleetState, events_since, rounds_since
from dashboard.store import FleetStore

STATIC_DIR = resources.files("dashboard") / "static"
HEARTBEAT_SECONDS = 2.0  # a snapshot at least this often, so silence ages move on the page

Publisher = Callable[[str, bytes], None]


class Dashboard:
    """What the routes share: settings, the store, the listener (if a broker was given)."""

    def __init__(self, settings: DashboardSettings, publisher: Publisher | None = None) -> None:
        self.settings = settings
        initial = FleetState(
            max_rounds=settings.max_rounds,
            max_events=settings.max_events,
            suspect_after=settings.suspect_after,
            hung_after=settings.hung_after,
        )
        self.wall_offset = time.time() - time.monotonic()
        self.store = FleetStore(settings.topics, initial, time.monotonic, settings.event_log,
                                self.wall_offset)
        self.listener: MqttListener | None = None
        self._publisher = publisher

    def publish(self, topic: str, payload: bytes) -> None:
        if self._publisher is not None:
            self._publisher(topic, payload)
        elif self.listener is not None:
            self.listener.publish(topic, payload)
        else:
            raise BrokerUnavailable("the dashboard was started without a broker")

    def broker(self) -> BrokerModel:
        listener = self.listener
        return BrokerModel(
            url=self.settings.broker_url,
            connected=listener is not None and listener.connected,
            last_error="" if listener is None else listener.last_error,
            connects=0 if listener is None else listener.connects,
        )

    def fleet(self) -> FleetModel:
        return fleet_model(
            self.store.state,
            self.settings.job,
            self.broker(),
            self.settings.controls_enabled,
            time.monotonic(),
        )

    def events(self, since: int | None) -> list[EventModel]:
        return [event_model(e, self.wall_offset) for e in events_since(self.store.state, since)]


def create_app(settings: DashboardSettings, publisher: Publisher | None = None) -> FastAPI:
    """The app for one job. ``publisher`` replaces the MQTT publish of controls (tests)."""
    dash = Dashboard(settings, publisher)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if settings.broker_url is not None:
            dash.listener = MqttListener(settings, dash.store)
            await dash.listener.start()
        try:
            yield
        finally:
            if dash.listener is not None:
                await dash.listener.stop()
            dash.store.close()

    app = FastAPI(
        title="Edgegrove dashboard",
        description="The live state of one Edgegrove training job: fleet, tree, rounds, events.",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.dashboard = dash
    _add_api_routes(app, dash)
    _add_websocket(app, dash)
    _add_control(app, dash)
    app.mount("/static", StaticFiles(directory=str(STATIC_DIR)), name="static")

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(str(STATIC_DIR / "index.html"))

    return app


def _add_api_routes(app: FastAPI, dash: Dashboard) -> None:
    @app.get("/healthz", response_model=HealthModel, tags=["health"])
    async def healthz() -> HealthModel:
        return HealthModel(ok=True, broker_connected=dash.broker().connected,
                           version=dash.store.state.version)

    @app.get("/api/config", response_model=ConfigModel, tags=["fleet"])
    async def config() -> ConfigModel:
        return ConfigModel(job=dash.settings.job, controls_enabled=dash.settings.controls_enabled,
                           push_interval=dash.settings.push_interval)

    @app.get("/api/fleet", response_model=FleetModel, tags=["fleet"])
    async def fleet() -> FleetModel:
        return dash.fleet()

    @app.get("/api/rounds", response_model=list[RoundModel], tags=["fleet"])
    async def rounds(
        since: Annotated[int | None, Query(description="only rounds numbered above this")] = None,
    ) -> list[RoundModel]:
        return [round_model(r) for r in rounds_since(dash.store.state, since)]

    @app.get("/api/events", response_model=list[EventModel], tags=["fleet"])
    async def events(
        since: Annotated[int | None, Query(description="only events with seq above this")] = None,
    ) -> list[EventModel]:
        return dash.events(since)


def _add_control(app: FastAPI, dash: Dashboard) -> None:
    @app.post(
        "/api/control",
        response_model=ControlResponse,
        tags=["control"],
        responses={403: {"description": "controls disabled, or missing/wrong token"},
                   503: {"description": "not connected to the broker"}},
    )
    async def control(
        request: ControlRequest,
        authorization: Annotated[str | None, Header()] = None,
    ) -> ControlResponse:
        _authorize(dash.settings.control_token, authorization)
        try:
            message = Control(**request.model_dump())
            message.validate()
        except (MessageError, ValueError) as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from None
        topic = dash.settings.topics.control
        try:
            dash.publish(topic, message.encode())
        except BrokerUnavailable as exc:
            raise HTTPException(status_code=503, detail=str(exc)) from None
        return ControlResponse(published=True, topic=topic)


def _authorize(token: str | None, authorization: str | None) -> None:
    if not token:
        raise HTTPException(
            status_code=403,
            detail="fault controls are disabled: start the dashboard with --control-token",
        )
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(given.encode(), token.encode()):
        raise HTTPException(status_code=403, detail="missing or wrong control token")


def _add_websocket(app: FastAPI, dash: Dashboard) -> None:
    @app.websocket("/ws")
    async def ws(socket: WebSocket) -> None:
        await socket.accept()
        changed = dash.store.subscribe()
        try:
            await _push_snapshots(socket, dash, changed)
        except (WebSocketDisconnect, RuntimeError, OSError):
            pass  # the browser went away (or the server is stopping)
        finally:
            dash.store.unsubscribe(changed)


async def _push_snapshots(socket: WebSocket, dash: Dashboard, changed: asyncio.Event) -> None:
    """Full history first, then deltas: at most one message per push_interval."""
    sent_version: int | None = None
    sent_seq: int | None = None
    while True:
        changed.clear()
        state = dash.store.state
        changed_rounds = [r for r in rounds_since(state, None)
                          if sent_version is None or r.version > sent_version]
        message = SnapshotMessage(
            full=sent_version is None,
            fleet=dash.fleet(),
            rounds=[round_model(r) for r in changed_rounds],
            events=dash.events(sent_seq),
        )
        await socket.send_text(message.model_dump_json())
        sent_version, sent_seq = state.version, state.next_seq - 1
        await asyncio.sleep(dash.settings.push_interval)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), HEARTBEAT_SECONDS)
