"""Login, logout and who one is; the gate in front of the API when the dashboard has accounts.

With ``--accounts FILE`` every API route and the WebSocket need a logged-in account (or the
control token); /healthz and /metrics stay open to the monitoring that scrapes them. A viewer
reads; only an operator (or the token) may send commands. The session cookie is HttpOnly and
SameSite=Strict, and a request that carries it from a browser must come from the dashboard's
own origin (or an allowed one), like the WebSocket: a foreign page cannot act with it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from dashboard.accounts import Role
from dashboard.guards import origin_allowed
from dashboard.sessions import SESSION_COOKIE, Actor, Sessions, token_actor
from dashboard.settings import DashboardSettings

# Reachable without an account: the login itself, who one is, and what monitoring scrapes.
OPEN_PATHS = frozenset({"/api/login", "/api/logout", "/api/me", "/healthz", "/metrics"})


class LoginRequest(BaseModel):
    name: str = Field(max_length=64)
    password: str = Field(max_length=1024)


class MeModel(BaseModel):
    accounts: bool = Field(description="the dashboard has named accounts: reading needs a login")
    name: str | None = Field(description="who is asking (`token` for the control token), or null")
    role: Role | None
    via: str | None = Field(description="session (a login) or token (the control token)")


@dataclass(frozen=True)
class Refusal:
    reason: str  # the counter it goes to
    detail: str  # what the client is told


class Access:
    """The settings' token and accounts, and the counter refusals go to."""

    def __init__(self, settings: DashboardSettings, sessions: Sessions | None, refused: Counter[str]) -> None:
        self.settings, self.sessions, self.refused = settings, sessions, refused

    def actor(self, authorization: str | None, session_id: str | None, origin: str | None,
              host: str) -> Actor | None:
        """The token's operator, else the session's account (from an allowed origin only)."""
        by_token = token_actor(self.settings.control_token, authorization)
        if by_token is not None or self.sessions is None:
            return by_token
        if not origin_allowed(origin, host, self.settings.allowed_origins):
            return None
        return self.sessions.actor(session_id)

    def may_read(self, actor: Actor | None) -> bool:
        return self.sessions is None or actor is not None

    def operator_of(self, request: Request) -> Actor | Refusal:
        """Who sends this command, or why it is refused."""
        if not self.settings.controls_enabled:
            return Refusal("control_disabled", "fault controls are disabled: start the dashboard with "
                                               "--control-token or --accounts")
        actor = self.request_actor(request)
        if actor is None:
            return Refusal("control_token", "missing or wrong control token, and no operator logged in")
        if not actor.role.may_act:
            return Refusal("control_role", f"{actor.name} is a {actor.role.value}: a viewer only reads")
        return actor

    def request_actor(self, request: Request) -> Actor | None:
        return self.actor(request.headers.get("authorization"), request.cookies.get(SESSION_COOKIE),
                          request.headers.get("origin"), request.headers.get("host", ""))


def add_access(app: FastAPI, access: Access) -> None:
    """/api/login, /api/logout, /api/me, and the gate in front of every other API route."""
    _add_gate(app, access)

    @app.post("/api/login", response_model=MeModel, tags=["operators"],
              responses={401: {"description": "no such account, or a wrong password"},
                         404: {"description": "the dashboard has no accounts"}})
    async def login(body: LoginRequest, request: Request, response: Response) -> MeModel:
        """Log in with a named account: sets the session cookie."""
        sessions = _sessions_of(access)
        if not origin_allowed(request.headers.get("origin"), request.headers.get("host", ""),
                              access.settings.allowed_origins):
            access.refused["login_origin"] += 1
            raise HTTPException(status_code=403, detail="login from a foreign page")
        # scrypt takes tens of milliseconds: off the event loop, which serves every page.
        account = await asyncio.to_thread(sessions.check, body.name, body.password)
        if account is None:
            access.refused["login_failed"] += 1
            raise HTTPException(status_code=401, detail="wrong account name or password")
        session_id, actor = sessions.open(account)
        response.set_cookie(SESSION_COOKIE, session_id, httponly=True, samesite="strict", path="/",
                            secure=request.url.scheme == "https")
        return _me(access, actor)

    @app.post("/api/logout", response_model=MeModel, tags=["operators"])
    async def logout(request: Request, response: Response) -> MeModel:
        if access.sessions is not None:
            access.sessions.logout(request.cookies.get(SESSION_COOKIE))
        response.delete_cookie(SESSION_COOKIE, path="/")
        return _me(access, None)

    @app.get("/api/me", response_model=MeModel, tags=["operators"])
    async def me(request: Request) -> MeModel:
        """Who this request is (a logged-in account, the control token, or nobody)."""
        return _me(access, access.request_actor(request))


def _add_gate(app: FastAPI, access: Access) -> None:
    @app.middleware("http")
    async def gate(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        path = request.url.path
        if (access.sessions is None or path in OPEN_PATHS or not path.startswith("/api/")
                or access.may_read(access.request_actor(request))):
            return await call_next(request)
        access.refused["login_needed"] += 1
        return JSONResponse({"detail": "log in first (POST /api/login)"}, status_code=401)


def _sessions_of(access: Access) -> Sessions:
    if access.sessions is None:
        raise HTTPException(status_code=404, detail="this dashboard has no accounts (start it with --accounts FILE)")
    return access.sessions


def _me(access: Access, actor: Actor | None) -> MeModel:
    return MeModel(accounts=access.sessions is not None, name=actor.name if actor else None,
                   role=actor.role if actor else None, via=actor.via.value if actor else None)
