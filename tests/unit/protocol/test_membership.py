"""Membership (views from the lowest live id) and the state transfer of a (re)joining node."""

from __future__ import annotations

import numpy as np

from agent.protocol.allreduce import Note, Send
from agent.protocol.membership import Membership
from agent.protocol.messages import Status, View
from agent.protocol.state_transfer import StateTransfer, serve_model_pull, state_hash
from agent.protocol.wire import Frame, Kind

START = View(epoch=0, members=[0, 1, 2, 3], arity=2, coordinator=0, from_round=0)


def online(*ids: int) -> list[Status]:
    return [Status(i, "online") for i in ids]


def test_only_the_lowest_live_id_publishes_a_view_when_a_node_goes_offline() -> None:
    coordinator, other = Membership(0, 2, START), Membership(2, 2, START)
    for m in (coordinator, other):
        for s in online(0, 1, 2, 3):
            assert m.on_status(s) == []  # nothing changed
    coordinator.round_started(7)
    other.round_started(7)
    assert other.on_status(Status(3, "offline")) == []
    out = coordinator.on_status(Status(3, "offline"))
    assert [p.view for p in out] == [View(1, [0, 1, 2], 2, 0, 9)]
    assert other.on_view(out[0].view) and not other.on_view(out[0].view)
    assert other.members_for(8) == (0, 1, 2, 3) and other.members_for(9) == (0, 1, 2)


def test_the_next_lowest_takes_over_when_the_coordinator_dies() -> None:
    m = Membership(1, 2, START)
    for s in online(0, 1, 2, 3):
        m.on_status(s)
    m.round_started(4)
    out = m.on_status(Status(0, "offline"))
    assert out and out[0].view.members == [1, 2, 3] and out[0].view.coordinator == 1


def test_a_joiner_is_added_but_never_coordinates() -> None:
    joiner = Membership(0, 2, View(1, [1, 2, 3], 2, 1, 5))
    for s in (*online(1, 2, 3), Status(0, "joining", incarnation=1)):
        assert joiner.on_status(s) == []
    coordinator = Membership(1, 2, View(1, [1, 2, 3], 2, 1, 5))
    coordinator.round_started(10)
    out = coordinator.on_status(Status(0, "joining", incarnation=1))
    assert out[0].view.members == [0, 1, 2, 3] and out[0].view.from_round == 12


def test_a_stale_will_of_an_older_incarnation_is_ignored() -> None:
    m = Membership(1, 2, START)
    for s in online(0, 1, 2, 3):
        m.on_status(s)
    m.on_status(Status(3, "online", incarnation=2))
    assert m.on_status(Status(3, "offline", incarnation=1)) == []
    assert 3 in m.live()


def test_absent_statuses_do_not_shrink_the_view_at_start_up() -> None:
    m = Membership(0, 2, START)
    assert m.on_status(Status(0, "online")) == []  # others' statuses not in yet


def test_state_transfer_assembles_the_state_and_retries_on_another_peer() -> None:
    state = np.arange(10, dtype=np.float32)
    transfer = StateTransfer(node=5, job=9, round=12, peers=[1, 2], timeout=0.5, now=0.0, chunk_size=4)
    first = [a for a in transfer.start(0.0) if isinstance(a, Send)]
    assert first[0].dst == 1 and first[0].frame.kind == Kind.MODEL_PULL
    assert transfer.on_timer(0.2) == []
    retry = [a for a in transfer.on_timer(0.5) if isinstance(a, Send)]
    assert retry[0].dst == 2
    answer = serve_model_pull(retry[0].frame, 2, 9, state, 12, 4, params_hash=state_hash(state))
    assert [s.frame.chunk_index for s in answer] == [0, 1, 2]
    transfer.on_frame(answer[0].frame, 0.6)
    transfer.on_frame(answer[2].frame, 0.6)
    # peer 2 goes quiet: ask peer 1 for the missing chunk only
    again = [a for a in transfer.on_timer(1.1) if isinstance(a, Send)]
    assert again[0].dst == 1 and again[0].frame.indices() == [1]
    partial = serve_model_pull(again[0].frame, 1, 9, state, 12, 4)
    assert len(partial) == 1
    notes = transfer.on_frame(partial[0].frame, 1.2)
    assert isinstance(notes[0], Note) and transfer.result is not None
    round_, got, _ = transfer.result
    assert round_ == 12 and got.tobytes() == state.tobytes()
    assert transfer.next_timer() is None


def test_a_newer_state_restarts_the_assembly() -> None:
    transfer = StateTransfer(5, 9, 3, [1], 1.0, 0.0, chunk_size=2)
    old = Frame(Kind.MODEL, 9, 3, 1, 0, 2).with_values(np.zeros(2, np.float32))
    new = [Frame(Kind.MODEL, 9, 4, 1, j, 2).with_values(np.ones(2, np.float32)) for j in range(2)]
    transfer.on_frame(old, 0.1)
    transfer.on_frame(new[1], 0.2)
    assert transfer.result is None
    transfer.on_frame(old, 0.3)  # older than what we now assemble: ignored
    transfer.on_frame(new[0], 0.4)
    assert transfer.result is not None and transfer.result[0] == 4
    assert np.all(transfer.result[1] == 1)
