"""Signed envelopes without the cryptography: their shape, the verdict on one, the key ids.

The device daemon imports this, never agent.jobs.signing: the Ed25519 check runs in a short
child process (agent.jobs.verify), so the ~10 MB the ``cryptography`` library maps into a
process stay out of a daemon that idles for weeks and trains beside a 128 MB budget. What it
needs to know about keys (their 32 raw bytes, their ids) is base64 and sha256 only.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from agent.jobs.document import Frozen, first_error
from agent.jobs.states import RejectReason
from agent.validate import one_line

D = TypeVar("D", bound=BaseModel)
KEY_BYTES = 32


class Envelope(Frozen):
    payload: str
    key_id: str
    signature: str


class Refused(ValueError):
    """A signed message that is not accepted; ``reason`` says why, the message in one line."""

    def __init__(self, reason: RejectReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Refused) and (self.reason, str(self)) == (other.reason, str(other))

    def __hash__(self) -> int:
        return hash((self.reason, str(self)))


@dataclass(frozen=True)
class Verified:
    """The signature checked against a trusted key: this is the payload it covers."""

    payload: str


Verdict = Verified | Refused


class KeyProblem(ValueError):
    """A key (text or file) that cannot be used; the message says which and why."""


def raw_key(text: str) -> bytes | None:
    """32 bytes from base64 text, or None."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) == KEY_BYTES else None


def raw_public_key(text: str) -> bytes:
    """An operator public key as device.toml gives it: base64 text or a file holding it."""
    raw = raw_key(text)
    if raw is not None:
        return raw
    try:
        content = Path(text.strip()).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyProblem(f"operator key {text.strip()[:60]!r} is neither a base64 Ed25519 public key "
                         f"nor a readable file: {exc}") from None
    raw = raw_key(content)
    if raw is None:
        raise KeyProblem(f"operator key file {text.strip()} does not hold a base64 Ed25519 public "
                         "key (32 bytes): use operator.pub from `edgegrove job keygen`")
    return raw


def key_id_of(raw: bytes) -> str:
    """The id an envelope names its key by: the first 16 hex digits of the raw key's sha256."""
    return hashlib.sha256(raw).hexdigest()[:16]


def parse_envelope(raw: bytes) -> Envelope:
    try:
        return Envelope.model_validate_json(raw)
    except ValidationError as exc:
        raise Refused(RejectReason.INVALID_DOCUMENT, f"not a signed envelope: {first_error(exc)}") from None


def open_verified(verdict: Verdict, kind: type[D]) -> D:
    """The verified payload parsed as ``kind``; Refused (the verdict's, or invalid_document)."""
    if isinstance(verdict, Refused):
        raise verdict
    try:
        return kind.model_validate(json.loads(verdict.payload))
    except (ValidationError, ValueError) as exc:
        what = first_error(exc) if isinstance(exc, ValidationError) else one_line(str(exc))
        raise Refused(RejectReason.INVALID_DOCUMENT, f"signed {kind.__name__} is invalid: {what}") from None

