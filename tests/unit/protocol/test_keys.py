"""agent/protocol/keys.py: the members' device keys, signing and checking."""

from __future__ import annotations

import pytest

from agent.protocol.keys import (
    MemberKeys,
    key_bytes,
    key_text,
    new_private_key,
    public_of,
    ring_of,
    ring_text,
)


def _fleet(n: int) -> tuple[dict[int, bytes], dict[int, bytes]]:
    private = {i: new_private_key() for i in range(n)}
    return private, {i: public_of(k) for i, k in private.items()}


def test_a_member_verifies_what_another_signed_and_nothing_else() -> None:
    private, ring = _fleet(3)
    alice, bob = (MemberKeys.of_private(i, private[i], ring) for i in (0, 1))
    signature = alice.sign(b"status")
    assert bob.verify(0, b"status", signature)
    assert not bob.verify(0, b"statuS", signature)  # another message
    assert not bob.verify(2, b"status", signature)  # another member's key
    assert not bob.verify(7, b"status", signature)  # a node without a key
    assert not bob.verify(0, b"status", signature[:-1])  # a truncated signature


def test_a_ring_round_trips_through_its_text_and_refuses_junk() -> None:
    _, ring = _fleet(2)
    assert ring_of(ring_text(ring)) == ring
    with pytest.raises(ValueError, match="member key"):
        ring_of({"x": key_text(ring[0])})
    with pytest.raises(ValueError, match="member key"):
        ring_of({"0": "not base64"})
    assert key_bytes(key_text(b"\0" * 31)) is None
