"""Ed25519 signatures of job documents and controls (``cryptography``, no crypto of our own).

A signed message is an envelope ``{payload, key_id, signature}``: ``payload`` is the document's
canonical JSON as a string, ``signature`` the base64 Ed25519 signature of its UTF-8 bytes and
``key_id`` names the public key (the first 16 hex digits of the raw key's sha256). A device
verifies against the operator keys it was provisioned with and then parses the payload; any
failure is a RejectReason (unknown_key, bad_signature, invalid_document), never an exception
the caller has to guess at.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import BaseModel

from agent.jobs.document import canonical_json
from agent.jobs.envelope import (
    Envelope,
    KeyProblem,
    Refused,
    Verdict,
    Verified,
    key_id_of,
    open_verified,
    parse_envelope,
    raw_key,
)
from agent.jobs.states import RejectReason
from agent.validate import one_line

__all__ = ["Envelope", "KeyProblem", "KeyRing", "Refused", "canonical_json", "envelope_bytes",
           "generate_key", "key_id", "load_private_key", "open_signed", "parse_public_key",
           "private_key_text", "public_key_text", "sign", "verify", "verify_bytes"]

D = TypeVar("D", bound=BaseModel)
_RAW = serialization.Encoding.Raw
_RAW_PUB = serialization.PublicFormat.Raw
_RAW_PRIV = serialization.PrivateFormat.Raw


# -- keys --------------------------------------------------------------------------------------

def generate_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def public_key_text(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """The raw 32-byte public key in base64: what a device.toml's operator_keys lists."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return base64.b64encode(public.public_bytes(_RAW, _RAW_PUB)).decode()


def private_key_text(key: Ed25519PrivateKey) -> str:
    """The raw 32-byte private key in base64 (keep it in a 0600 file)."""
    raw = key.private_bytes(_RAW, _RAW_PRIV, serialization.NoEncryption())
    return base64.b64encode(raw).decode()


def key_id(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return key_id_of(public.public_bytes(_RAW, _RAW_PUB))


def parse_public_key(text: str) -> Ed25519PublicKey:
    """A base64 raw public key, or the path of a file holding one (or a PEM public key)."""
    text = text.strip()
    if raw_key(text) is None and not text.startswith("-----BEGIN"):
        path = Path(text)
        try:
            text = path.read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise KeyProblem(f"operator key {text[:60]!r} is neither a base64 Ed25519 public key "
                             f"nor a readable file: {exc}") from None
    if text.startswith("-----BEGIN"):
        try:
            loaded = serialization.load_pem_public_key(text.encode())
        except ValueError as exc:
            raise KeyProblem(f"operator key is not a PEM public key: {exc}") from None
        if not isinstance(loaded, Ed25519PublicKey):
            raise KeyProblem("operator key is not an Ed25519 key")
        return loaded
    raw = raw_key(text)
    if raw is None:
        raise KeyProblem("operator key is not a base64 Ed25519 public key (32 bytes)")
    return Ed25519PublicKey.from_public_bytes(raw)


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """The operator's private key from a file: base64 raw (``private_key_text``) or PEM."""
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyProblem(f"signing key {path} cannot be read: {exc}") from None
    if text.startswith("-----BEGIN"):
        try:
            loaded = serialization.load_pem_private_key(text.encode(), password=None)
        except (ValueError, TypeError) as exc:
            raise KeyProblem(f"signing key {path} is not an unencrypted PEM private key: {exc}") from None
        if not isinstance(loaded, Ed25519PrivateKey):
            raise KeyProblem(f"signing key {path} is not an Ed25519 key")
        return loaded
    raw = _b64(text, f"signing key {path}")
    if len(raw) != 32:
        raise KeyProblem(f"signing key {path} has {len(raw)} bytes, an Ed25519 private key has 32")
    return Ed25519PrivateKey.from_private_bytes(raw)


def _b64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise KeyProblem(f"{what} is not base64 (nor a readable file)") from None


@dataclass(frozen=True)
class KeyRing:
    """The operator public keys a device trusts, by key id."""

    keys: dict[str, Ed25519PublicKey]

    @classmethod
    def of(cls, keys: Iterable[Ed25519PublicKey]) -> KeyRing:
        return cls({key_id(k): k for k in keys})

    @classmethod
    def parse(cls, texts: Iterable[str]) -> KeyRing:
        return cls.of(parse_public_key(t) for t in texts)


# -- envelopes ----------------------------------------------------------------------------------

def sign(document: BaseModel, key: Ed25519PrivateKey) -> Envelope:
    payload = canonical_json(document)
    signature = key.sign(payload.encode())
    return Envelope(payload=payload, key_id=key_id(key), signature=base64.b64encode(signature).decode())


def envelope_bytes(envelope: Envelope) -> bytes:
    return canonical_json(envelope).encode()


def verify(envelope: Envelope, keyring: KeyRing) -> str:
    """The payload, once its signature checks against the key it names (Refused if not)."""
    public = keyring.keys.get(envelope.key_id)
    if public is None:
        raise Refused(RejectReason.UNKNOWN_KEY, f"signed with key {one_line(envelope.key_id)[:32]!r}, "
                      "which is not among this device's operator keys")
    try:
        signature = base64.b64decode(envelope.signature, validate=True)
        public.verify(signature, envelope.payload.encode())
    except (binascii.Error, ValueError, InvalidSignature):
        raise Refused(RejectReason.BAD_SIGNATURE,
                      f"the signature does not match the document for key {envelope.key_id}") from None
    return envelope.payload


def verify_bytes(raw: bytes, keyring: KeyRing) -> Verdict:
    """The verdict on a signed message as it came off the wire."""
    try:
        return Verified(verify(parse_envelope(raw), keyring))
    except Refused as refusal:
        return refusal


def open_signed(raw: bytes, keyring: KeyRing, kind: type[D]) -> D:
    """Parse an envelope from the wire, verify it and parse its payload as ``kind``."""
    return open_verified(verify_bytes(raw, keyring), kind)
