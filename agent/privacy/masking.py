"""Masked partial sums: pairwise masks that hide each member's unit and cancel in the fleet's sum.

As SecAgg (Bonawitz et al., CCS 2017) without its self-masks: for one job each member makes an
X25519 key pair and announces the public half signed with its device key (``MemberKeys``,
agent/protocol/keys.py: trust comes from the job's pinned ring, never from the announcement).
Any two members i < j agree on a shared secret; for round r each derives the pair's round seed
(HKDF-SHA256 over the secret, the job and the round) and from it a ChaCha20 stream of uint32
masks. Member i sends

    encode(x_i) + sum_{j > i} mask_ij(r) - sum_{j < i} mask_ji(r)   (mod 2^32)

``encode`` is fixed point: round(x * 2^FRACTION_BITS) as a two's-complement uint32. Every mask
is added by one member of its pair and subtracted by the other, so in the sum over all members
they cancel exactly and the decoded sum is the clear sum up to the encoding: each value is
off by at most 2^-(FRACTION_BITS+1), the sum of n values by n times that. Any subset short
of the whole fleet (one child's unit, an inner node's subtree) keeps the masks of its pairs
with members outside it: uniformly random to whoever holds it.

A member missing from a round (crashed, silent, routed around) leaves its pairs' masks in the
survivors' sum. Each survivor reveals its round seed with the missing member (``RecoveryShare``),
and only that round's: the pair secret and other rounds' seeds stay hidden, the survivors' own
units stay masked by their pairs with each other. The aggregator subtracts the missing
members' masks (``unmask``). Without SecAgg's self-mask (secret-shared with Shamir), a unit of
the missing member that did reach somebody after all is unmasked by the revealed seeds: the
round's rule must be that a member declared missing is missing (docs/PRIVACY.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

U32 = npt.NDArray[np.uint32]
F32 = npt.NDArray[np.float32]
FRACTION_BITS = 16  # 2^-16 ~ 1.5e-5 resolution; sums up to +-32,768 fit
_ANNOUNCE = b"edgegrove-mask-key/1|"
_SEED = b"edgegrove-mask-seed/1|"


class Signer(Protocol):
    """What masking needs of the device keys: agent/protocol/keys.py's ``MemberKeys``."""

    @property
    def own_node(self) -> int: ...

    def sign(self, data: bytes, /) -> bytes: ...

    def verify(self, node: int, data: bytes, signature: bytes) -> bool: ...


class MaskingError(ValueError):
    """A masked sum cannot be unmasked (a recovery share is missing or for another round)."""


@dataclass(frozen=True)
class MaskKeyAnnouncement:
    """A member's X25519 public key for one job, signed with its device key."""

    job: str
    node: int
    public: bytes  # raw 32 bytes
    signature: bytes

    def signed_bytes(self) -> bytes:
        return _announced(self.job, self.node, self.public)


def _announced(job: str, node: int, public: bytes) -> bytes:
    return _ANNOUNCE + job.encode() + b"|" + node.to_bytes(2, "big") + public


@dataclass(frozen=True)
class RecoveryShare:
    """``survivor``'s round seed with ``missing`` for ``round``: what cancels their pair's mask."""

    round: int
    survivor: int
    missing: int
    seed: bytes


class MaskingMember:
    """One member's masking keys for a job: its X25519 key and the pair secrets it agreed."""

    def __init__(self, job: str, keys: Signer, private: X25519PrivateKey) -> None:
        self.job = job
        self.keys = keys
        self.node = keys.own_node
        self._private = private
        self._secrets: dict[int, bytes] = {}

    @classmethod
    def fresh(cls, job: str, keys: Signer) -> MaskingMember:
        return cls(job, keys, X25519PrivateKey.generate())

    def announcement(self) -> MaskKeyAnnouncement:
        public = self._private.public_key().public_bytes(serialization.Encoding.Raw,
                                                         serialization.PublicFormat.Raw)
        return MaskKeyAnnouncement(self.job, self.node, public,
                                   self.keys.sign(_announced(self.job, self.node, public)))

    def agree(self, announcement: MaskKeyAnnouncement) -> bool:
        """Take a peer's announced key if its device key signed it for this job (False: refused)."""
        peer = announcement.node
        if (announcement.job != self.job or peer == self.node
                or not self.keys.verify(peer, announcement.signed_bytes(), announcement.signature)):
            return False
        shared = self._private.exchange(X25519PublicKey.from_public_bytes(announcement.public))
        low, high = sorted((self.node, peer))
        info = b"edgegrove-mask-pair/1|" + self.job.encode() + b"|" + low.to_bytes(2, "big") + high.to_bytes(2, "big")
        self._secrets[peer] = HKDF(hashes.SHA256(), 32, salt=None, info=info).derive(shared)
        return True

    @property
    def peers(self) -> frozenset[int]:
        return frozenset(self._secrets)

    def round_seed(self, peer: int, round: int) -> bytes:
        info = _SEED + self.job.encode() + b"|" + round.to_bytes(8, "big")
        return HKDF(hashes.SHA256(), 32, salt=None, info=info).derive(self._secrets[peer])

    def mask(self, values: F32, round: int) -> U32:
        """This member's masked unit of ``round`` (masks with every peer it agreed with)."""
        masked = encode(values)
        for peer in sorted(self._secrets):
            stream = mask_stream(self.round_seed(peer, round), masked.size)
            masked = masked + stream if self.node < peer else masked - stream  # uint32: mod 2^32
        return masked

    def recovery_shares(self, missing: Iterable[int], round: int) -> list[RecoveryShare]:
        """The round seeds with the members missing from ``round``, to cancel their masks."""
        return [RecoveryShare(round, self.node, m, self.round_seed(m, round))
                for m in sorted(missing) if m in self._secrets]


def mask_stream(seed: bytes, size: int) -> U32:
    """``size`` uint32 masks from a 32-byte seed: ChaCha20's keystream (zero nonce: a seed is
    used for one round and one pair only)."""
    encryptor = Cipher(algorithms.ChaCha20(seed, bytes(16)), mode=None).encryptor()
    return np.frombuffer(encryptor.update(bytes(4 * size)), dtype="<u4").astype(np.uint32)


def encode(values: F32) -> U32:
    """Fixed point, two's complement mod 2^32 (values beyond +-2^15 saturate)."""
    limit = float(2 ** (31 - FRACTION_BITS)) - 1.0
    scaled = np.rint(np.clip(values.astype(np.float64), -limit, limit) * 2.0 ** FRACTION_BITS)
    return scaled.astype(np.int64).astype(np.uint32)


def decode(total: U32) -> F32:
    """A (masked-and-cancelled) sum of encoded values back to floats."""
    return np.asarray(total.view(np.int32).astype(np.float64) / 2.0 ** FRACTION_BITS, dtype=np.float32)


def add(units: Iterable[U32]) -> U32:
    """The sum mod 2^32 of masked units (what every inner node forwards)."""
    total: U32 | None = None
    for unit in units:
        total = unit.copy() if total is None else total + unit
    if total is None:
        raise MaskingError("no unit to add")
    return total


def unmask(total: U32, survivors: Iterable[int], missing: Iterable[int], round: int,
           shares: Mapping[tuple[int, int], RecoveryShare]) -> U32:
    """The survivors' masked sum with the missing members' pair masks taken out: each survivor
    s added +mask(s, m) when s < m and -mask(s, m) otherwise; ``shares`` by (survivor, missing)."""
    out = total.copy()
    for s in sorted(survivors):
        for m in sorted(missing):
            share = shares.get((s, m))
            if share is None or share.round != round:
                raise MaskingError(f"round {round}: no recovery share of member {s} for missing member {m}")
            stream = mask_stream(share.seed, out.size)
            out = out - stream if s < m else out + stream
    return out
