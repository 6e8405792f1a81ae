"""Whether a round may start: not while a member its algorithm cannot finish a round without
is down (a tree's root; every member of a ring), bounded by the wait, and never once a newer
view says where the fleet goes on."""

from __future__ import annotations

import pytest

from agent.core.gate import RoundGate
from agent.protocol.membership import Membership
from agent.protocol.messages import Status, View
from agent.protocol.rounds import indispensable

VIEW = View(epoch=1, members=[0, 1, 2, 3], arity=2, coordinator=0, from_round=0)


def _gate(algorithm: str) -> tuple[RoundGate, Membership]:
    membership = Membership(1, 2, VIEW)
    for n in VIEW.members:
        membership.on_status(Status(n, "online", 5), 0.0)
    return RoundGate(1, membership, root_wait=2.0, algorithm=algorithm), membership


def test_a_ring_needs_every_member_the_others_their_root() -> None:
    assert indispensable("ring", (0, 1, 2, 3), 0) == {0, 1, 2, 3}
    for algorithm in ("ft-tree", "tree", "rps", "ps-sync", "ps-async"):
        assert indispensable(algorithm, (0, 1, 2, 3), 0) == {0}


@pytest.mark.parametrize(("algorithm", "holds"), [("ring", True), ("ft-tree", False), ("ps-sync", False)])
def test_a_member_down_holds_a_ring_round_until_the_wait_ends(algorithm: str, holds: bool) -> None:
    gate, membership = _gate(algorithm)
    assert not gate.dead_root_blocks(VIEW, 1.0)
    membership.on_status(Status(2, "offline", 5), 1.0)  # its Will
    assert gate.dead_root_blocks(VIEW, 1.0) is holds
    assert gate.dead_root_blocks(VIEW, 2.9) is holds
    assert not gate.dead_root_blocks(VIEW, 3.0)  # bounded: the round goes on (and is skipped)


def test_a_newer_view_lets_the_ring_round_before_it_run_at_once() -> None:
    gate, membership = _gate("ring")
    membership.on_status(Status(2, "offline", 5), 1.0)
    assert gate.dead_root_blocks(VIEW, 1.0)
    membership.on_view(View(epoch=2, members=[0, 1, 3], arity=2, coordinator=0, from_round=7))
    # Round 6 still has node 2 in its ring: it runs now and ends at once, as on every member.
    assert not gate.dead_root_blocks(VIEW, 1.1)
    assert not gate.dead_root_blocks(membership.views.view_for(7), 1.1)
