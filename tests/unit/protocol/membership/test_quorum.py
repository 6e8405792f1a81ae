"""Quorum and where a view applies from (agent/protocol/membership/quorum.py), without a
Membership around them."""

from __future__ import annotations

from agent.protocol.membership.quorum import (
    LEAD_ROUNDS,
    MASS_DOWN_HOLD,
    MassDownHold,
    first_round,
    front,
    has_quorum,
    keeps_quorum,
)
from agent.protocol.messages import View

FOUR = View(epoch=1, members=[0, 1, 2, 3], arity=2, coordinator=0, from_round=0)


def test_a_view_keeps_the_quorum_with_more_than_half_or_half_with_the_lowest() -> None:
    assert keeps_quorum([0, 1, 2, 3], [0, 1, 2])
    assert keeps_quorum([0, 1, 2, 3], [0, 1])  # the tie goes to the side of the lowest member
    assert not keeps_quorum([0, 1, 2, 3], [2, 3])
    assert not keeps_quorum([0, 1, 2, 3], [0])


def test_the_quorum_holds_against_every_view_given() -> None:
    shrunk = View(epoch=2, members=[0, 1, 2], arity=2, coordinator=0, from_round=5)
    assert has_quorum([0, 1], [FOUR, None])
    assert not has_quorum([1, 2], [shrunk, FOUR])  # a majority of the newest, half without 0 of the other


def test_half_the_view_down_at_once_is_held_then_let_go() -> None:
    hold = MassDownHold()
    assert not hold.holds(FOUR.members, {3}, 0.0)  # one crash is a crash
    assert hold.holds(FOUR.members, {2, 3}, 1.0) and hold.ends(1.0) == 1.0 + MASS_DOWN_HOLD
    assert not hold.holds(FOUR.members, {2, 3}, 1.0 + MASS_DOWN_HOLD)
    assert not hold.holds(FOUR.members, set(), 20.0) and hold.ends(20.0) is None


def test_a_view_applies_two_rounds_ahead_the_next_without_its_root_and_sooner_when_it_only_adds() -> None:
    grown = [0, 1, 2, 3, 4]
    assert front(7, 0, FOUR, root_finishes_first=True) == 7  # we are the root: nobody is past us
    assert front(7, 1, FOUR, root_finishes_first=True) == 8
    assert front(7, 0, FOUR, root_finishes_first=False) == 8
    assert first_round(7, [1, 2, 3], {0}, FOUR, FOUR, 8) == 8  # the root is gone
    assert first_round(7, [0, 1, 2], {3}, FOUR, FOUR, 8) == 7 + LEAD_ROUNDS
    assert first_round(7, grown, set(), FOUR, FOUR, 8) == 9  # only adds: right after the front
