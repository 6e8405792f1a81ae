"""Who is asking: a named operator's session (a cookie after login), or the control token.

A session id is 32 random bytes, kept in memory only (a restarted dashboard asks everyone to
log in again) and valid for ``lifetime`` seconds after login. The token of
``--control-token`` stays for a simulation on one's own machine: it acts as the operator
named ``token``.
"""

from __future__ import annotations

import enum
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from dashboard.accounts import Account, Role, verify_password

SESSION_COOKIE = "edgegrove_session"
SESSION_SECONDS = 12 * 3600.0
MAX_SESSIONS = 1024
TOKEN_ACTOR = "token"


class Via(enum.StrEnum):
    SESSION = "session"
    TOKEN = "token"


@dataclass(frozen=True)
class Actor:
    name: str
    role: Role
    via: Via


@dataclass(frozen=True)
class _Session:
    actor: Actor
    expires: float


class Sessions:
    """The accounts of the file, and the sessions of those who logged in."""

    def __init__(self, accounts: Mapping[str, Account], clock: Callable[[], float],
                 lifetime: float = SESSION_SECONDS) -> None:
        self.accounts = dict(accounts)
        self._clock = clock
        self._lifetime = lifetime
        self._sessions: dict[str, _Session] = {}

    def check(self, name: str, password: str) -> Account | None:
        """The account, if the password is its own (scrypt: tens of milliseconds; safe to run
        in a worker thread, it only reads the accounts)."""
        account = self.accounts.get(name)
        if account is None or not verify_password(account.password_hash, password):
            return None
        return account

    def login(self, name: str, password: str) -> tuple[str, Actor] | None:
        """A new session id and who it is, or None (no such account, or a wrong password)."""
        account = self.check(name, password)
        return None if account is None else self.open(account)

    def open(self, account: Account) -> tuple[str, Actor]:
        """A new session of an account whose password was checked."""
        now = self._clock()
        self._sessions = {k: s for k, s in self._sessions.items() if s.expires > now}
        while len(self._sessions) >= MAX_SESSIONS:
            del self._sessions[next(iter(self._sessions))]  # the oldest login goes
        session_id = secrets.token_urlsafe(32)
        actor = Actor(account.name, account.role, Via.SESSION)
        self._sessions[session_id] = _Session(actor, now + self._lifetime)
        return session_id, actor

    def actor(self, session_id: str | None) -> Actor | None:
        session = self._sessions.get(session_id or "")
        if session is None or session.expires <= self._clock():
            return None
        return session.actor

    def logout(self, session_id: str | None) -> None:
        self._sessions.pop(session_id or "", None)


def token_actor(token: str | None, authorization: str | None) -> Actor | None:
    """The bearer token's operator, if the request carries the dashboard's token."""
    scheme, _, given = (authorization or "").partition(" ")
    if not token or scheme.lower() != "bearer" or not secrets.compare_digest(given.encode(), token.encode()):
        return None
    return Actor(TOKEN_ACTOR, Role.OPERATOR, Via.TOKEN)
