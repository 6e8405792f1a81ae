"""The dashboard's named operator accounts: a JSON file of names, roles and scrypt hashes
(`edgegrove accounts`, `edgegrove dashboard --accounts FILE`).

    {"accounts": [{"name": "ana", "role": "operator", "password": "scrypt$16384$8$1$<salt>$<hash>"}]}

A viewer reads the fleet; an operator may also inject faults and control jobs. Passwords are
kept only as salted scrypt hashes (stdlib ``hashlib.scrypt``), compared in constant time. The
file holds no secret a reader could log in with, but it is written 0600 all the same.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import json
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

SCHEME = "scrypt"
# RFC 7914's interactive parameters: ~16 MB and tens of milliseconds per login.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 1 << 14, 8, 1
SALT_BYTES, HASH_BYTES = 16, 32
MIN_PASSWORD = 8
_NAME_RE = re.compile(r"[a-z][a-z0-9._-]{0,31}")


class Role(enum.StrEnum):
    VIEWER = "viewer"  # reads the fleet, its devices, jobs and logs
    OPERATOR = "operator"  # and injects faults, controls jobs

    @property
    def may_act(self) -> bool:
        return self is Role.OPERATOR


@dataclass(frozen=True)
class Account:
    name: str
    role: Role
    password_hash: str


def validate_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ValueError(f"account name {name!r} is not valid: use 1-32 of a-z, 0-9, '.', '_' or '-', "
                         "starting with a letter")
    return name


def hash_password(password: str, salt: bytes | None = None) -> str:
    if len(password) < MIN_PASSWORD:
        raise ValueError(f"a password needs at least {MIN_PASSWORD} characters")
    salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
    digest = _scrypt(password, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)
    return "$".join((SCHEME, str(SCRYPT_N), str(SCRYPT_R), str(SCRYPT_P), _b64(salt), _b64(digest)))


def verify_password(stored: str, password: str) -> bool:
    """The password matches the stored hash (a malformed hash matches nothing)."""
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != SCHEME:
            return False
        expected = base64.b64decode(digest, validate=True)
        given = _scrypt(password, base64.b64decode(salt, validate=True), int(n), int(r), int(p))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(given, expected)


def load_accounts(path: Path) -> dict[str, Account]:
    """Every account of the file; ValueError says what is wrong with it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"cannot read the accounts file {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON: {exc.msg} (line {exc.lineno})") from None
    entries = data.get("accounts") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f'{path}: expected {{"accounts": [{{"name", "role", "password"}}, ...]}}')
    accounts: dict[str, Account] = {}
    for entry in entries:
        account = _account_of(entry, path)
        if account.name in accounts:
            raise ValueError(f"{path}: account {account.name!r} is listed twice")
        accounts[account.name] = account
    return accounts


def save_accounts(path: Path, accounts: Mapping[str, Account]) -> None:
    """Written whole (a temp file beside it, then a rename), readable by its owner only."""
    text = json.dumps({"accounts": [{"name": a.name, "role": a.role.value, "password": a.password_hash}
                                    for a in sorted(accounts.values(), key=lambda a: a.name)]}, indent=2)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def with_account(accounts: Mapping[str, Account], name: str, role: Role, password: str) -> dict[str, Account]:
    """The accounts with ``name`` added (or its role and password replaced)."""
    return {**accounts, validate_name(name): Account(name, role, hash_password(password))}


def _account_of(entry: object, path: Path) -> Account:
    if not isinstance(entry, dict) or not {"name", "role", "password"} <= entry.keys():
        raise ValueError(f'{path}: each account needs "name", "role" and "password"')
    try:
        role = Role(entry["role"])
    except ValueError:
        raise ValueError(f"{path}: account {entry['name']!r} has role {entry['role']!r}: "
                         f"use one of {', '.join(r.value for r in Role)}") from None
    if not isinstance(entry["password"], str) or not entry["password"].startswith(f"{SCHEME}$"):
        raise ValueError(f"{path}: account {entry['name']!r}: the password must be a {SCHEME} hash "
                         "(`edgegrove accounts add` writes one), never the password itself")
    return Account(validate_name(entry["name"]), role, entry["password"])


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, maxmem=64 << 20, dklen=HASH_BYTES)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
