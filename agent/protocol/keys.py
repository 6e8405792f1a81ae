"""The members' device keys inside a job: ours to sign with, everybody's to check with.

One context object, ``MemberKeys``, travels from the runtime (which builds it from the device's
enrolment or the job's per-node key files) into the core and the protocol. It is pure: ``sign``
is a callable over our private key, ``public`` the ring the job pinned (node id -> raw 32-byte
Ed25519 public key). This module is the only one in agent/protocol that imports
``cryptography`` (Ed25519 through a maintained library, no crypto of our own).

Trust comes from enrolment: the ring is what the operator signed into the JobSpec
(``member_keys``), or what make-credentials wrote for a fleet without enrolment, never a key
a message brings along.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: an idle device daemon keeps cryptography out of memory
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

KEY_BYTES = 32
SIGNATURE_BYTES = 64


@dataclass(frozen=True)
class MemberKeys:
    """Our node's signing function and the job's public keys by node id (raw bytes)."""

    own_node: int
    sign: Callable[[bytes], bytes]
    public: Mapping[int, bytes]
    # The ring parsed once: a verification per status, per round and member, adds up.
    _parsed: dict[int, Ed25519PublicKey] = field(default_factory=dict, init=False, repr=False, compare=False)

    def knows(self, node: int) -> bool:
        return node in self.public

    def verify(self, node: int, data: bytes, signature: bytes) -> bool:
        """Whether ``signature`` is ``node``'s over ``data`` (False for a node without a key)."""
        from cryptography.exceptions import InvalidSignature

        key = self._key(node)
        if key is None or len(signature) != SIGNATURE_BYTES:
            return False
        try:
            key.verify(signature, data)
        except InvalidSignature:
            return False
        return True

    def _key(self, node: int) -> Ed25519PublicKey | None:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        key = self._parsed.get(node)
        if key is None and node in self.public:
            try:
                key = self._parsed[node] = Ed25519PublicKey.from_public_bytes(self.public[node])
            except ValueError:
                return None
        return key

    @classmethod
    def of_private(cls, own_node: int, private: bytes, public: Mapping[int, bytes]) -> MemberKeys:
        """Keys signing with the raw 32-byte Ed25519 private key ``private``."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        key = Ed25519PrivateKey.from_private_bytes(private)
        return cls(own_node, key.sign, dict(public))


# -- raw keys as text (config files, the JobSpec) ----------------------------------------------

def new_private_key() -> bytes:
    """A fresh raw 32-byte Ed25519 private key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.generate().private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                                      serialization.NoEncryption())


def public_of(private: bytes) -> bytes:
    """The raw public key of a raw private key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.from_private_bytes(private).public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_text(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def key_bytes(text: str) -> bytes | None:
    """32 raw bytes from base64 text; None when it is not one."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) == KEY_BYTES else None


def ring_of(texts: Mapping[str, str]) -> dict[int, bytes]:
    """A ring as JSON holds it (node id as text -> base64 public key); ValueError names the
    first entry that is not one."""
    ring: dict[int, bytes] = {}
    for node, text in texts.items():
        raw = key_bytes(text) if isinstance(text, str) else None
        if not str(node).isdigit() or not 0 <= int(node) <= 1023 or raw is None:
            raise ValueError(f"member key {str(node)[:8]!r}: not a node id with a base64 Ed25519 public key")
        ring[int(node)] = raw
    return ring


def ring_text(ring: Mapping[int, bytes]) -> dict[str, str]:
    return {str(node): key_text(raw) for node, raw in sorted(ring.items())}
