"""StateFetch: a state pull nobody answers is given up, then tried again with backoff (and a
note each time), never left silent: the "catching up" stall of a node back from a cut."""

from __future__ import annotations

import numpy as np

from agent.core.actions import Publish
from agent.core.outbox import CoreOutbox
from agent.core.report import Counters
from agent.core.state_fetch import (
    ANNOUNCED_ROUNDS,
    REPLAY_ROUNDS,
    RETRY_BASE_S,
    RETRY_MAX_S,
    StateFetch,
    site_first,
)
from agent.core.suspicion import SuspicionBook
from agent.protocol.answer_budget import asked_indices
from agent.protocol.membership import Membership
from agent.protocol.messages import StateDigest, Status, View
from agent.protocol.notes import NoteKind
from agent.protocol.state_transfer import serve_model_pull, state_digest
from agent.protocol.wire import Frame, Kind


def _pulls(actions: list[object]) -> list[int]:
    return [a.dst for a in actions if isinstance(a, Publish) and isinstance(a.message, Frame)
            and a.message.kind is Kind.MODEL_PULL and a.dst is not None]


def _run_until_idle(fetch: StateFetch, now: float, until: float, joining: bool) -> tuple[float, list[int]]:
    asked: list[int] = []
    while (wake := fetch.next_timer()) is not None and wake <= until:
        now = max(now, wake)
        asked += _pulls(fetch.tick(now, 10, joining=joining))
    return now, asked


def _fetcher(members: tuple[int, ...] = (0, 1, 2, 3)) -> tuple[CoreOutbox, StateFetch]:
    """Node 3 of a fleet of ``members`` coordinated by 0, every member online at round 10."""
    membership = Membership(3, 2, View(epoch=1, members=list(members), arity=2, coordinator=0, from_round=0))
    for n in members:
        membership.on_status(Status(n, "online", 10), 0.0)
    outbox = CoreOutbox(3, Counters(), SuspicionBook(3, 0))
    return outbox, StateFetch(3, 1, membership, outbox, timeout=0.5, size=1000, chunk_values=100)


def test_a_state_pull_nobody_answers_is_tried_again_with_backoff_and_a_note_each_time() -> None:
    outbox, fetch = _fetcher()
    assert sorted(_pulls(fetch.fetch(12, [0, 1, 2], 0.0, 10))) == [0, 1]
    now, asked = _run_until_idle(fetch, 0.0, 30.0, joining=False)
    gave_up = [n for n in outbox.notes if n.kind is NoteKind.STATE_PULL_FAILED]
    again = [n for n in outbox.notes if n.kind is NoteKind.STATE_PULL and n.detail.startswith("again")]
    assert len(gave_up) >= 3 and len(again) >= 2, outbox.notes  # never silent for good
    assert "trying again in 1 s" in gave_up[0].detail and "trying again in 2 s" in gave_up[1].detail
    assert asked, "the retries ask peers again"
    assert fetch.next_timer() is not None  # still pending: no answer ever came
    # The backoff stops growing, so a healed link is tried within RETRY_MAX_S at worst.
    _run_until_idle(fetch, now, now + 600.0, joining=False)
    delays = [float(n.detail.rsplit("in ", 1)[1].split(" s")[0]) for n in outbox.notes
              if n.kind is NoteKind.STATE_PULL_FAILED]
    assert delays[0] == RETRY_BASE_S and max(delays) == RETRY_MAX_S


def test_a_retry_no_longer_needed_is_dropped() -> None:
    _, fetch = _fetcher()
    fetch.fetch(10, [0, 1], 0.0, 10)  # a state of our own round: we are not behind
    while fetch.transfer is not None:
        wake = fetch.next_timer()
        assert wake is not None
        fetch.tick(wake, 10)
    assert fetch.retry is not None
    assert fetch.tick(fetch.retry[0], 10) == [] and fetch.retry is None and fetch.next_timer() is None


def _each_answers(actions: list[object], states: dict[int, np.ndarray], round: int) -> list[Frame]:
    """Each asked peer's MODEL frames of its own state."""
    frames: list[Frame] = []
    for a in actions:
        if isinstance(a, Publish) and isinstance(a.message, Frame) and a.message.kind is Kind.MODEL_PULL:
            assert a.dst is not None
            pull = Frame(Kind.MODEL_PULL, 1, a.message.round, 3, 0, 1)
            pull = pull.with_indices(a.message.indices()) if a.message.indices() else pull
            frames += [s.frame for s in serve_model_pull(pull, a.dst, 1, states[a.dst], round, 100)]
    return frames


def test_a_peer_whose_state_disagreed_with_the_coordinators_is_asked_last_in_the_next_resyncs() -> None:
    # Two members drifted by the same fault, each asked the other for a stripe: its stripe
    # disagreed with the coordinator's every time, and the pair never agreed (a broker restart).
    _, fetch = _fetcher((0, 1, 2, 3, 4))
    fetch.membership.on_status(Status(1, "offline", 10), 0.0)
    fleets, drifted = np.zeros(1000, np.float32), np.ones(1000, np.float32)
    states = {0: fleets, 2: drifted, 4: fleets}
    asked = fetch.resync("drift", set(), 0.0, 10, 0.0)
    assert sorted(_pulls(asked)) == [0, 2]  # the usual pair
    for frame in _each_answers(asked, states, 11):
        fetch.on_frame(frame, 0.1, 10)
    assert fetch.disputed == {2: 10}
    fetch.transfer = None
    assert sorted(_pulls(fetch.resync("drift again", set(), 0.2, 11, 0.2))) == [0, 4]
    fetch.forget_before(10 + REPLAY_ROUNDS)
    assert fetch.disputed == {}


def _joiner() -> tuple[StateFetch, CoreOutbox]:
    """Node 3 fetching the state of round 12 from node 1 alone (whose word is all there is),
    in a fleet coordinated by node 0."""
    membership = Membership(3, 2, View(epoch=1, members=[0, 1, 2, 3], arity=2, coordinator=0, from_round=0))
    for n in range(4):
        membership.on_status(Status(n, "online", 10), 0.0)
    outbox = CoreOutbox(3, Counters(), SuspicionBook(3, 0))
    return StateFetch(3, 1, membership, outbox, timeout=0.5, size=1000, chunk_values=100), outbox


def _answer(fetch: StateFetch, state: np.ndarray, now: float) -> list[object]:
    """Node 1 answers the pull with ``state``, its header hash consistent with it."""
    transfer = fetch.transfer
    assert transfer is not None
    request = Frame(Kind.MODEL_PULL, 1, 12, 3, 0, 1)
    return [a for send in serve_model_pull(request, 1, 1, state, 12, 100)
            for a in fetch.on_frame(send.frame, now, 10)]


def test_a_state_whose_digest_the_coordinator_announced_is_installed_once_it_is_announced() -> None:
    fetch, outbox = _joiner()
    honest = np.arange(1000, dtype=np.float32)
    fetch.fetch(12, [1], 0.0, 10)
    _answer(fetch, honest, 0.1)
    assert fetch.take(12) is None and fetch.held is not None  # nobody announced round 12 yet
    fetch.announced(StateDigest(0, 12, state_digest(honest)), 0.2, 10)
    got = fetch.take(12)
    assert got is not None and got[0] == 12 and np.array_equal(got[1], honest)
    assert outbox.counters.rejected[NoteKind.STATE_UNVOUCHED] == 0


def test_a_self_consistent_forged_state_unlike_the_coordinators_digest_is_refused_and_counted() -> None:
    fetch, outbox = _joiner()
    honest = np.arange(1000, dtype=np.float32)
    forged = honest.copy()
    forged[500:] = 0.0
    fetch.announced(StateDigest(0, 12, state_digest(honest)), 0.0, 10)  # the coordinator's, retained
    fetch.announced(StateDigest(1, 12, state_digest(forged)), 0.0, 10)  # the forger's own word
    fetch.fetch(12, [1], 0.0, 10)
    actions = _answer(fetch, forged, 0.1)
    assert fetch.take(12) is None and fetch.held is None
    assert outbox.counters.rejected[NoteKind.STATE_UNVOUCHED] == 1
    assert fetch.transfer is not None and fetch.transfer.result is None  # it goes on: asks again
    assert _pulls(actions) or fetch.next_timer() is not None


def test_a_state_nobody_announces_is_refused_after_the_timeout() -> None:
    fetch, outbox = _joiner()
    fetch.fetch(12, [1], 0.0, 10)
    _answer(fetch, np.arange(1000, dtype=np.float32), 0.1)
    assert fetch.next_timer() == 0.1 + 0.5
    fetch.tick(0.59, 10)
    assert fetch.held is not None  # not yet
    fetch.tick(0.6, 10)
    assert fetch.held is None and fetch.take(12) is None
    assert outbox.counters.rejected[NoteKind.STATE_UNVOUCHED] == 1


def test_announcements_kept_per_member_are_bounded() -> None:
    fetch, _ = _joiner()
    for r in range(1000):
        fetch.announced(StateDigest(3, r, "0" * 32), 0.0, 10)
    assert len(fetch.digests[3]) == ANNOUNCED_ROUNDS and max(fetch.digests[3]) == 999


def test_a_fetch_from_the_coordinator_alone_asks_it_for_everything() -> None:
    # ps-async: only the server's (the coordinator's) state is the fleet's; its word and its
    # announced digest install it.
    membership = Membership(3, 2, View(epoch=1, members=[0, 1, 2, 3], arity=2, coordinator=0, from_round=0))
    for n in (0, 1, 2, 3):
        membership.on_status(Status(n, "online", 10), 0.0)
    outbox = CoreOutbox(3, Counters(), SuspicionBook(3, 0))
    fetch = StateFetch(3, 1, membership, outbox, timeout=0.5, size=1000, chunk_values=100, from_coordinator=True)
    actions = fetch.fetch(12, [1, 0, 2], 0.0, 10)
    assert _pulls(actions) == [0]
    pull = next(a.message for a in actions if isinstance(a, Publish) and isinstance(a.message, Frame))
    assert asked_indices(pull) == []  # all of it, padded to pay for it
    state = np.arange(1000, dtype=np.float32)
    for send in serve_model_pull(pull, 0, 1, state, 12, 100):
        fetch.on_frame(send.frame, 0.1, 10)
    fetch.announced(StateDigest(0, 12, state_digest(state)), 0.2, 10)
    got = fetch.take(12)
    assert got is not None and np.array_equal(got[1], state)


def test_a_state_is_pulled_from_the_lower_members_of_our_site_first() -> None:
    membership = Membership(7, 2, View(epoch=1, members=list(range(9)), arity=2, coordinator=0, from_round=0))
    for n in range(9):
        membership.on_status(Status(n, "online", 10, site="s0" if n < 4 else "s1"), 0.0)
    holders = [0, 1, 2, 3, 4, 5, 6, 8]
    assert site_first(7, "s1", holders, membership)[:3] == [4, 5, 0]  # two of ours, then the rest
    assert site_first(5, "s1", holders, membership)[:2] == [4, 0]  # the next: half from across
    assert site_first(4, "s1", holders, membership)[:2] == [0, 1]  # the site's lowest: across
    assert site_first(7, "", holders, membership) == holders  # no sites
    assert sorted(site_first(7, "s1", holders, membership)) == holders  # nobody left out or twice
