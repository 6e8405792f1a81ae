"""Serving our state to pullers (agent/core/state_server.py), without a core around it."""

from __future__ import annotations

from collections import Counter

import numpy as np

from agent.core.actions import SendState
from agent.core.state_server import StateServer
from agent.protocol.allreduce import frame_size
from agent.protocol.answer_budget import AMPLIFICATION, padded
from agent.protocol.membership import Membership
from agent.protocol.messages import Status, View
from agent.protocol.state_transfer import state_frame_bytes, state_hash
from agent.protocol.wire import Frame, Kind

JOB = 7


def _membership(members: list[int]) -> Membership:
    membership = Membership(1, 2, View(1, members, 2, members[0], 0))
    for peer in members:
        membership.on_status(Status(peer, "online"), 0.0)
    return membership


def _server(size: int | None = 40, rejected: Counter[str] | None = None) -> StateServer:
    return StateServer(1, JOB, size, 4, rejected if rejected is not None else Counter())


def _pull(sender: int, round: int, chunks: list[int] | None = None, paid: bool = True) -> Frame:
    """A MODEL_PULL, padded (``paid``) as a puller pays for a whole state of 40 values."""
    frame = Frame(Kind.MODEL_PULL, JOB, round, sender, 0, 1)
    frame = frame.with_indices(chunks) if chunks is not None else frame
    return padded(frame, sum(state_frame_bytes(40, 4, j) for j in range(10))) if paid else frame


def test_a_pull_of_a_round_ahead_waits_until_we_are_there() -> None:
    server, membership = _server(), _membership([0, 1, 2, 3])
    server.asked(_pull(2, 5, [0]))
    assert server.due(4, membership, can_serve=True, lingering=False) == []
    assert server.due(5, membership, can_serve=True, lingering=False) == [SendState(_pull(2, 5, [0]), 5, (0,))]
    assert server.due(5, membership, can_serve=True, lingering=False) == []  # answered once


def test_without_a_state_of_our_own_pulls_wait_until_we_hold_one() -> None:
    # A site back from a cut pulls from its own members, who join with it.
    server, membership = _server(), _membership([0, 1, 2, 3])
    server.asked(_pull(2, 0, [0]))
    assert server.due(0, membership, can_serve=False, lingering=False) == []
    assert server.due(0, membership, can_serve=True, lingering=False) == [SendState(_pull(2, 0, [0]), 0, (0,))]


def test_one_puller_gets_one_stripe_a_round_the_whole_state_when_others_pull_too_or_when_lingering() -> None:
    rejected: Counter[str] = Counter()
    server, membership = _server(rejected=rejected), _membership([0, 1, 2, 3])
    server.asked(_pull(2, 0))  # everything: 10 chunks of 4 values
    assert [a.chunks for a in server.due(0, membership, can_serve=True, lingering=False)] == [(0, 1, 2, 3, 4)]
    server.asked(_pull(2, 0))
    assert server.due(0, membership, can_serve=True, lingering=False) == []
    assert rejected == {"model_pull_budget": 1}
    server.asked(_pull(3, 0, [9]))
    server.asked(_pull(2, 0))
    served = {a.request.sender: a.chunks for a in server.due(0, membership, can_serve=True, lingering=False)}
    assert served == {3: (9,), 2: (5, 6, 7, 8, 9)}  # another member pulls: the rest for 2
    lingering = _server()
    lingering.asked(_pull(2, 0))
    assert [a.chunks for a in lingering.due(0, membership, can_serve=True, lingering=True)] == [tuple(range(10))]


def test_a_puller_with_one_other_source_gets_everything_from_us() -> None:
    server = _server()
    server.asked(_pull(2, 0))
    assert [a.chunks for a in server.due(0, _membership([1, 2]), can_serve=True, lingering=False)] == [
        tuple(range(10))]


def test_without_a_state_size_each_puller_gets_the_whole_state_once_a_round() -> None:
    rejected: Counter[str] = Counter()
    server, membership = _server(size=None, rejected=rejected), _membership([0, 1, 2, 3])
    for _ in range(3):
        server.asked(_pull(2, 0))
    assert [a.chunks for a in server.due(0, membership, can_serve=True, lingering=False)] == [None]
    server.asked(_pull(2, 0))
    assert server.due(0, membership, can_serve=True, lingering=False) == []
    assert rejected == {"model_pull_repeat": 1}
    server.forget_before(2)
    server.asked(_pull(2, 2))
    assert [a.chunks for a in server.due(2, membership, can_serve=True, lingering=False)] == [None]


def test_the_frames_carry_the_asked_chunks_of_the_given_state_and_its_hash() -> None:
    server = _server()
    state = np.arange(40, dtype=np.float32)
    sends = server.frames(SendState(_pull(2, 3), 3, (1, 4)), state)
    assert [(s.dst, s.frame.kind, s.frame.round, s.frame.chunk_index) for s in sends] == [
        (2, Kind.MODEL, 3, 1), (2, Kind.MODEL, 3, 4)]
    assert all(s.frame.model_hash == state_hash(state) for s in sends)
    assert sends[1].frame.values().tolist() == [16.0, 17.0, 18.0, 19.0]


def test_a_pull_of_a_round_we_left_behind_gets_one_probe_of_ours_a_round() -> None:
    server = _server()
    pull = Frame(Kind.PULL, JOB, 3, 2, 0, 1)
    probe = server.hint(pull, 9, running=True)
    assert probe is not None and (probe.kind, probe.round, probe.target, probe.sender) == (Kind.PROBE, 9, 2, 1)
    assert server.hint(pull, 9, running=True) is None
    assert server.hint(pull, 10, running=False) is None  # between rounds: nothing to say yet
    assert server.hint(_pull(2, 3), 10, running=True) is None  # only a round's pull


def test_the_sole_holder_of_the_fleets_state_sends_it_whole_to_one_puller() -> None:
    # ps-async: the workers' models lag the server's, so the server (the coordinator) is a
    # joiner's only source. A worker keeps the stripe limit.
    membership = Membership(1, 2, View(1, [1, 2, 3, 4], 2, 1, 0))
    for peer in (1, 2, 3, 4):
        membership.on_status(Status(peer, "online"), 0.0)
    server = StateServer(1, JOB, 40, 4, Counter(), sole_source=True)
    server.asked(_pull(2, 0))
    assert [a.chunks for a in server.due(0, membership, can_serve=True, lingering=False)] == [tuple(range(10))]
    worker = StateServer(1, JOB, 40, 4, Counter(), sole_source=True)
    worker.asked(_pull(2, 0))
    assert [a.chunks for a in worker.due(0, _membership([0, 1, 2, 3]), can_serve=True, lingering=False)] == [
        (0, 1, 2, 3, 4)]


def test_a_pull_is_answered_with_at_most_three_times_its_bytes() -> None:
    """Issue 54: a ~60-byte MODEL_PULL got a 1 MB chunk (~7,000x by bytes). An unpadded
    pull of the whole state gets what its bytes pay for, no more, the rest counted; over any
    number of pulls the answers stay within AMPLIFICATION x the pulls' bytes."""
    rejected: Counter[str] = Counter()
    server, membership = _server(rejected=rejected), _membership([1, 2])  # our puller's only source
    asked = 0
    for round in range(3):
        pull = _pull(2, round, paid=False)
        asked += frame_size(pull)
        server.asked(pull)
        for action in server.due(round, membership, can_serve=True, lingering=False):
            assert action.chunks is not None and len(action.chunks) < 10
    assert rejected["pull_unpaid"] == 3
    assert 0 < server.budget.answered[2] <= AMPLIFICATION * asked
    paid = _pull(2, 3)
    server.asked(paid)
    assert [len(a.chunks or ()) for a in server.due(3, membership, can_serve=True, lingering=False)] == [10]
    assert server.budget.amplification(2) <= AMPLIFICATION
