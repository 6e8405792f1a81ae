"""State transfer of a joiner, a drifted or a lagging node: pull, serve, retry on another peer."""

from __future__ import annotations

import numpy as np

from agent.protocol.allreduce import Action, Note, RoundResult, RoundStats, Send
from agent.protocol.state_transfer import StateTransfer, resync_reason, serve_model_pull, state_hash
from agent.protocol.wire import DType, Frame, Kind


def sends(actions: list[Action]) -> list[Send]:
    return [a for a in actions if isinstance(a, Send)]


def test_state_transfer_assembles_the_state_and_retries_on_another_peer() -> None:
    state = np.arange(10, dtype=np.float32)
    transfer = StateTransfer(node=5, job=9, round=12, peers=[1, 2], timeout=0.5, now=0.0)
    first = sends(transfer.start(0.0))
    assert first[0].dst == 1 and first[0].frame.kind == Kind.MODEL_PULL and first[0].frame.round == 12
    assert transfer.on_timer(0.2) == []
    retry = sends(transfer.on_timer(0.5))
    assert retry[0].dst == 2
    answer = serve_model_pull(retry[0].frame, 2, 9, state, 12, 4, params_hash=state_hash(state))
    assert [s.frame.chunk_index for s in answer] == [0, 1, 2]
    assert all(s.dst == 5 for s in answer)
    transfer.on_frame(answer[0].frame, 0.6)
    transfer.on_frame(answer[2].frame, 0.6)
    # peer 2 goes quiet: ask peer 1 for the missing chunk only
    again = sends(transfer.on_timer(1.1))
    assert again[0].dst == 1 and again[0].frame.indices() == [1]
    partial = serve_model_pull(again[0].frame, 1, 9, state, 12, 4, params_hash=state_hash(state))
    assert len(partial) == 1
    notes = transfer.on_frame(partial[0].frame, 1.2)
    assert isinstance(notes[0], Note) and transfer.result is not None
    round_, got, params_hash = transfer.result
    assert round_ == 12 and got.tobytes() == state.tobytes() and params_hash == state_hash(state)
    assert transfer.next_timer() is None


def test_a_newer_state_restarts_the_assembly() -> None:
    transfer = StateTransfer(5, 9, 3, [1], 1.0, 0.0)
    old = Frame(Kind.MODEL, 9, 3, 1, 0, 2).with_values(np.zeros(2, np.float32))
    new = [Frame(Kind.MODEL, 9, 4, 1, j, 2).with_values(np.ones(2, np.float32)) for j in range(2)]
    transfer.on_frame(old, 0.1)
    transfer.on_frame(new[1], 0.2)
    assert transfer.result is None
    transfer.on_frame(old, 0.3)  # older than what we now assemble: ignored
    transfer.on_frame(new[0], 0.4)
    assert transfer.result is not None and transfer.result[0] == 4
    assert np.all(transfer.result[1] == 1)


def test_a_state_older_than_asked_for_is_a_late_answer_and_ignored() -> None:
    """A node that fell behind asks for round 20; chunks of round 15 (an earlier resync's
    late answer) must not be taken for the fleet's state."""
    transfer = StateTransfer(5, 9, 20, [1], 1.0, 0.0)
    late = Frame(Kind.MODEL, 9, 15, 1, 0, 1).with_values(np.zeros(3, np.float32))
    assert transfer.on_frame(late, 0.1) == [] and transfer.result is None
    fresh = Frame(Kind.MODEL, 9, 21, 1, 0, 1).with_values(np.ones(3, np.float32))
    transfer.on_frame(fresh, 0.2)
    assert transfer.result is not None and transfer.result[0] == 21  # a newer state is fine


def test_a_state_of_the_wrong_size_or_inexact_dtype_is_dropped_and_asked_again() -> None:
    transfer = StateTransfer(5, 9, 2, [1, 3], 1.0, 0.0, size=4)
    transfer.start(0.0)
    half = Frame(Kind.MODEL, 9, 2, 1, 0, 1).with_values(np.ones(4, np.float32), DType.F16)
    assert transfer.on_frame(half, 0.1) == []  # float16 is not an exact copy
    short = Frame(Kind.MODEL, 9, 2, 1, 0, 1).with_values(np.ones(3, np.float32))
    notes = transfer.on_frame(short, 0.2)
    assert [n.kind for n in notes if isinstance(n, Note)] == ["state_rejected"]
    assert transfer.result is None
    retry = sends(transfer.on_timer(1.2))
    assert retry[0].dst == 3 and retry[0].frame.indices() == []  # all chunks, from the next peer
    good = serve_model_pull(retry[0].frame, 3, 9, np.arange(4, dtype=np.float64), 2, 4)
    transfer.on_frame(good[0].frame, 1.3)
    assert transfer.result is not None and transfer.result[1].dtype == np.float32
    assert transfer.result[1].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_serving_ignores_chunk_indices_out_of_range() -> None:
    request = Frame(Kind.MODEL_PULL, 9, 0, 5).with_indices([1, 7])
    out = serve_model_pull(request, 1, 9, np.zeros(6, np.float32), 0, 4)
    assert [s.frame.chunk_index for s in out] == [1] and out[0].frame.chunk_count == 2


def result(missing: tuple[int, ...] = (), root_hash: int | None = 7) -> RoundResult:
    return RoundResult(round=3, values=np.zeros(2, np.float32), contributors=(frozenset({0}),),
                       missing_chunks=missing, degraded=bool(missing), root_model_hash=root_hash,
                       stats=RoundStats(), link_states={})


def test_resync_after_a_local_fallback_or_a_hash_unlike_the_roots() -> None:
    assert resync_reason(result(), own_hash=7) is None
    assert resync_reason(result(root_hash=None), own_hash=7) is None  # the root itself
    fallback = resync_reason(result(missing=(0, 2)), own_hash=7)
    assert fallback is not None and "2 chunks" in fallback
    drift = resync_reason(result(root_hash=8), own_hash=7)
    assert drift is not None and "00000008" in drift
