"""Run the dashboard: in the foreground (the CLI) or in a thread (the simulator, tests)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import uvicorn
from fastapi import FastAPI

from dashboard.app import Dashboard, create_app
from dashboard.records import SIMULATOR_ONLY
from dashboard.settings import DashboardSettings

STARTUP_TIMEOUT = 20.0
FLUSH_TIMEOUT = 3.0  # at most this long for open pages to get the last state before stopping


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind first, so that ``port=0`` gets a free port we know before uvicorn starts."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port} ({exc}); choose another --port") from None
    sock.set_inheritable(True)
    return sock


def url_of(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


class AnnouncingServer(uvicorn.Server):
    """A uvicorn server that calls ``on_started`` once it listens and its app started."""

    def __init__(self, config: uvicorn.Config, on_started: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self.on_started = on_started

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.on_started is not None and not self.should_exit:
            self.on_started()


def make_server(settings: DashboardSettings, on_started: Callable[[], None] | None = None
                ) -> uvicorn.Server:
    config = uvicorn.Config(
        create_app(settings),
        log_level="warning",
        timeout_graceful_shutdown=2,
        ws_ping_interval=10,
        lifespan="on",
    )
    return AnnouncingServer(config, on_started)


@dataclass
class DashboardHandle:
    """A dashboard serving in a background thread. ``stop()`` is idempotent."""

    url: str
    port: int
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def dashboard(self) -> Dashboard:
        app = self.server.config.app
        assert isinstance(app, FastAPI)
        dash: Dashboard = app.state.dashboard
        return dash

    def feed(self, record: Mapping[str, Any]) -> None:
        """Hand the dashboard one simulator record (thread-safe). Status, view and telemetry
        are left out: the dashboard hears those on the broker itself."""
        if record.get("type") in SIMULATOR_ONLY:
            self.dashboard.feed(record)

    def stop(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + FLUSH_TIMEOUT
        while self.thread.is_alive() and not self.dashboard.flushed() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.dashboard.close_sockets()
        self.server.should_exit = True
        self.thread.join(timeout)

    def __enter__(self) -> DashboardHandle:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def run_in_thread(settings: DashboardSettings) -> DashboardHandle:
    """Start serving (``settings.port`` may be 0) and return once the server accepts requests."""
    sock = bind_socket(settings.host, settings.port)
    port = sock.getsockname()[1]
    server = make_server(settings)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="edgegrove-dashboard", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the dashboard server stopped during startup (see its log)")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the dashboard did not start within {STARTUP_TIMEOUT:.0f} s")
        time.sleep(0.05)
    return DashboardHandle(url_of(settings.host, port), port, server, thread)
