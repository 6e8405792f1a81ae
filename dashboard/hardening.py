"""What every response gets and every request must pass: the Host allow-list (against DNS
rebinding: a foreign page whose name resolves to this dashboard must not read the fleet) and
headers that forbid framing the page (clickjacking of the fault controls)."""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
SECURITY_HEADERS = (
    (b"x-frame-options", b"DENY"),
    (b"content-security-policy", b"frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
)
WS_POLICY_VIOLATION = 1008


def host_name(host_header: str) -> str:
    """The name part of a Host header: "[::1]:8080" -> "::1", "Fleet.example:80" -> "fleet.example"."""
    text = host_header.strip().lower()
    if text.startswith("["):
        return text[1:].partition("]")[0]
    name, _, port = text.rpartition(":")
    return name if name and port.isdigit() else text


def host_allowed(host_header: str | None, bind_host: str, allowed: tuple[str, ...]) -> bool:
    """A request may go on if its Host names this dashboard: the bind address, a local name,
    an IP address (a rebinding attack needs a domain name), or a configured name ("*": any)."""
    if "*" in allowed:
        return True
    if not host_header:
        return False  # HTTP/1.1 requires Host; only hand-made requests leave it out
    name = host_name(host_header)
    if name in LOCAL_NAMES or name == bind_host.lower() or name in {a.lower() for a in allowed}:
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HardeningMiddleware:
    """Refuses requests with a foreign Host (HTTP 400, WebSocket closed before accept) and
    adds anti-framing headers to every HTTP response."""

    def __init__(self, app: ASGIApp, bind_host: str, allowed_hosts: tuple[str, ...],
                 on_refused: Callable[[str], None]) -> None:
        self.app = app
        self.bind_host = bind_host
        self.allowed_hosts = allowed_hosts
        self.on_refused = on_refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        host = headers.get(b"host", b"").decode("latin-1")
        if not host_allowed(host, self.bind_host, self.allowed_hosts):
            self.on_refused("host_not_allowed")
            await _refuse(scope, send, host)
            return
        if scope["type"] == "websocket":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)


async def _refuse(scope: Scope, send: Send, host: str) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": WS_POLICY_VIOLATION, "reason": "host not allowed"})
        return
    body = (f"host {host[:100]!r} is not allowed: start the dashboard with --allow-host NAME "
            f"to serve it under that name\n").encode()
    await send({"type": "http.response.start", "status": 400,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode()), *SECURITY_HEADERS]})
    await send({"type": "http.response.body", "body": body})
