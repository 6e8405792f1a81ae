"""The views a node keeps (agent/protocol/membership/views.py): the one applying to each round,
which is news, how far an epoch may jump, and yielding our own void views."""

from __future__ import annotations

from agent.protocol.membership.views import (
    KEPT_VIEWS,
    MAX_AWAY_EPOCH_STEP,
    MAX_EPOCH_STEP,
    ViewBook,
)
from agent.protocol.messages import View


def _view(epoch: int, members: list[int], from_round: int, coordinator: int = 0) -> View:
    return View(epoch=epoch, members=members, arity=2, coordinator=coordinator, from_round=from_round)


def test_each_round_uses_the_newest_view_applying_to_it_else_the_newest() -> None:
    book = ViewBook(_view(1, [0, 1, 2], 0))
    book.take(_view(2, [0, 1], 5), seen=1)
    assert book.view_for(4) == _view(1, [0, 1, 2], 0) and book.members_for(5) == (0, 1)
    early = ViewBook(_view(3, [0, 1], 9))
    assert early.view_for(2) == _view(3, [0, 1], 9)  # none applies yet: never wait for one
    assert ViewBook().latest is None and ViewBook().view_for(0) is None and ViewBook().members_for(0) == ()


def test_a_view_is_news_by_epoch_and_of_one_epoch_the_lower_coordinators() -> None:
    book = ViewBook(_view(4, [0, 1, 2], 0, coordinator=1))
    assert book.is_news(_view(5, [0, 1], 2)) and not book.is_news(_view(3, [0, 1], 2))
    assert book.is_news(_view(4, [0, 1], 2, coordinator=0)) and not book.is_news(_view(4, [1, 2], 2, coordinator=2))
    assert not book.epoch_jumps(_view(4 + MAX_EPOCH_STEP, [0], 2), away=False)
    assert book.epoch_jumps(_view(5 + MAX_EPOCH_STEP, [0], 2), away=False)
    assert not book.epoch_jumps(_view(4 + MAX_AWAY_EPOCH_STEP, [0], 2), away=True)


def test_taking_a_view_says_when_it_dropped_whom_and_keeps_the_last_few() -> None:
    book = ViewBook(_view(1, [0, 1, 2], 0))
    book.take(_view(2, [0, 1], 3), seen=7)
    assert book.removed_at == {2: 7} and book.taken_at == 7
    for epoch in range(3, 3 + KEPT_VIEWS):
        book.take(_view(epoch, [0, 1], epoch), seen=epoch)
    assert len(book.kept) == KEPT_VIEWS and book.newest.epoch == 2 + KEPT_VIEWS


def test_our_own_views_from_the_fleets_epoch_on_are_void() -> None:
    book = ViewBook(_view(1, [0, 1, 2], 0))
    book.take(_view(2, [0, 1, 2], 2, coordinator=0), seen=1)
    book.take(_view(3, [0, 1, 2], 4, coordinator=0), seen=2)
    book.yield_own(_view(2, [1, 2], 4, coordinator=1), node=0)
    assert [v.epoch for v in book.kept] == [1]
