"""State transfer of a joiner, a drifted or a lagging node: pull, serve, retry on another peer."""

from __future__ import annotations

import numpy as np

from agent.core import AgentCore, CoreConfig, SendState
from agent.core.events import FrameArrived, GradientReady, StatusSeen, ViewSeen
from agent.protocol.allreduce import (
    Action,
    AllreduceConfig,
    Note,
    RoundResult,
    RoundStats,
    Send,
    frame_size,
)
from agent.protocol.answer_budget import AMPLIFICATION, asked_indices, padded
from agent.protocol.messages import Status, View
from agent.protocol.state_transfer import (
    StateTransfer,
    Vouch,
    resync_reason,
    serve_model_pull,
    state_digest,
    state_frame_bytes,
    state_hash,
    vouch,
)
from agent.protocol.wire import DType, Frame, Kind


def sends(actions: list[Action]) -> list[Send]:
    return [a for a in actions if isinstance(a, Send)]


STATE = np.arange(10, dtype=np.float32)  # 3 chunks of 4 values: stripes [0, 2] and [1]


def pulls(actions: list[Action]) -> dict[int, Frame]:
    return {s.dst: s.frame for s in sends(actions) if s.frame.kind == Kind.MODEL_PULL}


def answer(request: Frame, peer: int, state: np.ndarray = STATE, round: int = 12) -> list[Frame]:
    return [s.frame for s in serve_model_pull(request, peer, 9, state, round, 4)]


def feed(transfer: StateTransfer, frames: list[Frame], now: float) -> list[Action]:
    return [a for f in frames for a in transfer.on_frame(f, now)]


def kinds(actions: list[Action]) -> list[str]:
    return [a.kind for a in actions if isinstance(a, Note)]


def test_a_state_comes_in_two_stripes_from_two_peers_that_vouch_for_its_hash() -> None:
    transfer = StateTransfer(node=5, job=9, round=12, peers=[1, 2, 3], timeout=0.5, now=0.0, size=10, chunk_values=4)
    asked = pulls(transfer.start(0.0))
    assert {p: f.indices() for p, f in asked.items()} == {1: [0, 2], 2: [1]}
    assert all(f.round == 12 for f in asked.values())
    assert kinds(feed(transfer, answer(asked[1], 1), 0.1)) == [] and transfer.result is None
    assert kinds(feed(transfer, answer(asked[2], 2), 0.2)) == ["state_received"]
    assert transfer.result is not None
    round_, got, digest = transfer.result
    assert round_ == 12 and got.tobytes() == STATE.tobytes() and digest == state_hash(STATE)
    assert transfer.next_timer() is None


def test_a_silent_stripe_is_asked_of_a_peer_not_asked_yet() -> None:
    transfer = StateTransfer(5, 9, 12, [1, 2, 3], 0.5, 0.0, size=10, chunk_values=4)
    asked = pulls(transfer.start(0.0))
    feed(transfer, answer(asked[1], 1), 0.1)
    assert transfer.on_timer(0.3) == []
    retry = transfer.on_timer(0.6)
    assert ("timeout", 2) in [(a.kind, a.peer) for a in retry if isinstance(a, Note)]
    again = pulls(retry)
    assert list(again) == [3] and again[3].indices() == [1]  # only the silent stripe
    feed(transfer, answer(again[3], 3), 0.7)
    assert transfer.result is not None and transfer.result[1].tobytes() == STATE.tobytes()


def test_with_every_peer_asked_a_timeout_waits_for_them_to_reach_the_round() -> None:
    """Peers still behind the round answer as they reach it: asking again would only move
    our pull further away."""
    transfer = StateTransfer(5, 9, 12, [1, 2], 0.5, 0.0, size=10, chunk_values=4)
    asked = pulls(transfer.start(0.0))
    assert pulls(transfer.on_timer(0.6)) == {}
    feed(transfer, answer(asked[1], 1) + answer(asked[2], 2), 0.9)
    assert transfer.result is not None and transfer.result[0] == 12


def test_a_forged_stripe_is_never_installed_and_the_next_round_is_asked_of_other_peers() -> None:
    """Node 2 answers its stripe with values of its own: the assembled state hashes to
    nothing both peers vouched for, so it is refused, and round 13 is asked of the next pair
    (3 and 1), which the liar cannot spoil."""
    transfer = StateTransfer(5, 9, 12, [1, 2, 3], 0.5, 0.0, size=10, chunk_values=4)
    asked = pulls(transfer.start(0.0))
    forged = np.full(10, 3e38, np.float32)
    out = feed(transfer, answer(asked[1], 1) + answer(asked[2], 2, forged), 0.1)
    assert "state_rejected" in kinds(out) and transfer.result is None
    retry = pulls(out)
    assert {p: (f.round, f.indices()) for p, f in retry.items()} == {3: (13, [0, 2]), 1: (13, [1])}
    assert transfer.on_frame(answer(asked[2], 2, forged)[0], 0.15) == []  # round 12 is burnt
    good = np.arange(10, 20, dtype=np.float32)
    feed(transfer, [f for p, req in retry.items() for f in answer(req, p, good, round=13)], 0.2)
    assert transfer.result is not None and transfer.result[1].tobytes() == good.tobytes()


def test_frames_from_a_peer_not_asked_for_them_are_refused() -> None:
    transfer = StateTransfer(5, 9, 12, [1, 2], 0.5, 0.0, size=10, chunk_values=4)
    asked = pulls(transfer.start(0.0))
    # Node 3 was never asked; node 1 sends a chunk of node 2's stripe.
    wrong_stripe = Frame(Kind.MODEL, 9, 12, 1, 1, 3).with_values(np.zeros(4, np.float32))
    uninvited = [*answer(asked[1], 3), wrong_stripe]
    assert kinds(feed(transfer, uninvited, 0.1)) == ["state_unasked"] * 3
    assert transfer.parts == {}


def test_stripes_of_different_rounds_meet_at_the_newer_one() -> None:
    transfer = StateTransfer(5, 9, 12, [1, 2], 1.0, 0.0, size=10, chunk_values=4)
    asked = pulls(transfer.start(0.0))
    newer = np.ones(10, np.float32)
    out = feed(transfer, answer(asked[2], 2, newer, round=13), 0.1)  # node 2 was already past 12
    follow = pulls(out)
    assert list(follow) == [1] and follow[1].round == 13 and follow[1].indices() == [0, 2]
    feed(transfer, answer(asked[1], 1), 0.2)  # round 12's stripe: the round we left
    assert transfer.result is None
    feed(transfer, answer(follow[1], 1, newer, round=13), 0.3)
    assert transfer.result is not None and transfer.result[0] == 13


def test_a_state_older_than_asked_for_is_a_late_answer_and_ignored() -> None:
    """A node that fell behind asks for round 20; chunks of round 15 (an earlier resync's
    late answer) must not be taken for the fleet's state."""
    transfer = StateTransfer(5, 9, 20, [1], 1.0, 0.0)
    transfer.start(0.0)
    late = Frame(Kind.MODEL, 9, 15, 1, 0, 1).with_values(np.zeros(3, np.float32))
    assert transfer.on_frame(late, 0.1) == [] and transfer.result is None
    fresh = Frame(Kind.MODEL, 9, 21, 1, 0, 1, model_hash=state_hash(np.ones(3, np.float32)))
    transfer.on_frame(fresh.with_values(np.ones(3, np.float32)), 0.2)
    assert transfer.result is not None and transfer.result[0] == 21  # a newer state is fine


def test_a_state_of_the_wrong_size_or_inexact_dtype_is_dropped() -> None:
    transfer = StateTransfer(5, 9, 2, [1, 3], 1.0, 0.0, size=4, chunk_values=4)
    asked = pulls(transfer.start(0.0))
    assert list(asked) == [1] and asked[1].indices() == []  # one chunk: one stripe, one peer
    half = Frame(Kind.MODEL, 9, 2, 1, 0, 1).with_values(np.ones(4, np.float32), DType.F16)
    assert transfer.on_frame(half, 0.1) == []  # float16 is not an exact copy
    short = answer(asked[1], 1, np.ones(3, np.float32), round=2)
    out = feed(transfer, short, 0.2)
    assert kinds(out)[0] == "state_rejected" and list(pulls(out)) == [3]  # the next peer, next round
    assert transfer.result is None


def test_with_one_peer_its_word_is_all_there_is() -> None:
    transfer = StateTransfer(5, 9, 12, [1], 0.5, 0.0, size=10, chunk_values=4)
    asked = pulls(transfer.start(0.0))
    assert asked_indices(asked[1]) == []
    feed(transfer, answer(asked[1], 1), 0.1)
    assert transfer.result is not None


def test_a_server_gives_one_puller_a_whole_state_when_alone_else_a_stripe() -> None:
    """Was a test of serve_share (gone: the budget is each chunk once per puller and round),
    kept as its facts on the core that serves: the only other member gets everything, one of
    several a stripe (10 of 19 chunks)."""
    for members, count in (([1, 2], 19), ([0, 1, 2, 3, 4, 5, 6], 10)):
        core = AgentCore(CoreConfig(node=1, rounds=50, allreduce=AllreduceConfig(chunk_size=8),
                                    state_size=19 * 4, state_chunk_values=4), 3)
        core.handle(ViewSeen(View(1, members, 2, members[0], 0)), 0.0)
        for peer in members:
            core.handle(StatusSeen(Status(peer, "online", incarnation=3 if peer == 1 else 0)), 0.0)
        core.handle(GradientReady(0, 1.0, np.ones(37, np.float32), 0), 0.01)
        pull = padded(Frame(Kind.MODEL_PULL, core.parts.config.allreduce.job, 0, 2, 0, 1), 19 * 100)
        served = [a for a in core.handle(FrameArrived(pull), 0.02) if isinstance(a, SendState)]
        assert len(served) == 1 and served[0].chunks is not None and len(served[0].chunks) == count


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


def test_after_a_dispute_the_same_round_is_asked_of_a_fresh_pair_while_there_is_one() -> None:
    """After the fleet's last round there is no next round to ask for: a dispute must be
    settled by other peers' copies of the same state."""
    transfer = StateTransfer(5, 9, 12, [1, 2, 3, 4], 0.5, 0.0, size=10, chunk_values=4)
    asked = pulls(transfer.start(0.0))
    out = feed(transfer, answer(asked[1], 1) + answer(asked[2], 2, np.zeros(10, np.float32)), 0.1)
    retry = pulls(out)
    assert {p: f.round for p, f in retry.items()} == {3: 12, 4: 12}
    assert kinds(feed(transfer, answer(asked[2], 2), 0.15)) == ["state_unasked"]  # its stripe was dropped
    feed(transfer, [f for p, req in retry.items() for f in answer(req, p)], 0.2)
    assert transfer.result is not None and transfer.result[1].tobytes() == STATE.tobytes()


def test_a_drifted_member_in_a_dispute_takes_the_anchors_word() -> None:
    """After a fault that made every member but the coordinator (1) drift at once, no two
    peers agree: a drift resync asks the anchor for the rest of the state and takes its
    word alone. Without ``anchor_decides`` the dispute goes to the peers not asked yet."""
    transfer = StateTransfer(5, 9, 12, [1, 2, 3], 0.5, 0.0, size=10, chunk_values=4, anchor=1, anchor_decides=True)
    asked = pulls(transfer.start(0.0))
    out = feed(transfer, answer(asked[1], 1) + answer(asked[2], 2, np.zeros(10, np.float32)), 0.1)
    assert "state_rejected" in kinds(out)
    # The anchor is asked for its whole state; within its round it sends what it has not yet.
    assert {p: (f.round, asked_indices(f)) for p, f in pulls(out).items()} == {1: (12, [])}
    assert kinds(feed(transfer, answer(asked[2], 2), 0.15)) == ["state_unasked"]  # the liar's stripe
    feed(transfer, answer(Frame(Kind.MODEL_PULL, 9, 12, 5).with_indices([1]), 1), 0.2)
    assert transfer.result is not None and transfer.result[1].tobytes() == STATE.tobytes()
    plain = StateTransfer(5, 9, 12, [1, 2, 3], 0.5, 0.0, size=10, chunk_values=4, anchor=1)
    asked = pulls(plain.start(0.0))
    out = feed(plain, answer(asked[1], 1) + answer(asked[2], 2, np.zeros(10, np.float32)), 0.1)
    assert {p: f.indices() for p, f in pulls(out).items()} == {3: [1]}


def test_an_anchor_that_does_not_give_the_rest_leaves_it_to_the_peers_not_asked_yet() -> None:
    """The anchor's last rounds were clean: it serves one stripe only, the rest never comes.
    After the timeout the rest is asked of a peer not asked yet, whose copy settles it."""
    transfer = StateTransfer(5, 9, 12, [1, 2, 3], 0.5, 0.0, size=10, chunk_values=4, anchor=1, anchor_decides=True)
    asked = pulls(transfer.start(0.0))
    feed(transfer, answer(asked[1], 1) + answer(asked[2], 2, np.zeros(10, np.float32)), 0.1)
    assert pulls(transfer.on_timer(0.4)) == {}
    retry = pulls(transfer.on_timer(0.7))
    assert {p: (f.round, f.indices()) for p, f in retry.items()} == {3: (12, [1])}
    feed(transfer, answer(retry[3], 3), 0.8)
    assert transfer.result is not None and transfer.result[1].tobytes() == STATE.tobytes()


def test_the_anchors_word_alone_needs_a_dispute_first() -> None:
    """With peers agreeing, a drift resync is two peers' stripes like any other transfer."""
    transfer = StateTransfer(5, 9, 12, [1, 2, 3], 0.5, 0.0, size=10, chunk_values=4, anchor=1, anchor_decides=True)
    asked = pulls(transfer.start(0.0))
    feed(transfer, answer(asked[1], 1), 0.1)
    assert transfer.result is None  # one stripe: the anchor's half is no state
    feed(transfer, answer(asked[2], 2), 0.2)
    assert transfer.result is not None and transfer.result[1].tobytes() == STATE.tobytes()


def test_in_a_dispute_the_anchor_past_the_round_sends_a_newer_state_that_is_taken_alone() -> None:
    """Asked for its whole state after a dispute, the anchor had gone on a round: all of
    round 13's state comes from it and is taken without asking the drifted peers again.
    (Asked for the rest only, the rest was of 13 and the other stripe of 12: the stripes
    chased each other round after round on a loaded host.)"""
    transfer = StateTransfer(5, 9, 12, [1, 2, 3], 0.5, 0.0, size=10, chunk_values=4, anchor=1, anchor_decides=True)
    asked = pulls(transfer.start(0.0))
    out = feed(transfer, answer(asked[1], 1) + answer(asked[2], 2, np.zeros(10, np.float32)), 0.1)
    newer = STATE + 1
    out = feed(transfer, answer(pulls(out)[1], 1, newer, round=13), 0.2)
    assert pulls(out) == {}  # nobody else asked for round 13's other stripe
    assert transfer.result is not None and transfer.result[0] == 13
    assert transfer.result[1].tobytes() == newer.tobytes()


def test_a_drift_resync_asks_the_anchor_in_every_pair() -> None:
    """The anchor (the coordinator, the fleet's reference) listed last still gets a stripe of
    a drifted member's first pair, and of the next round's pair after a dispute the round's
    peers could not settle. Other transfers (joiners) rotate through the peers."""
    transfer = StateTransfer(5, 9, 12, [2, 3, 1], 0.5, 0.0, size=10, chunk_values=4, anchor=1, anchor_decides=True)
    assert set(pulls(transfer.start(0.0))) == {1, 2} and transfer.peer == 2
    retry = pulls(transfer.reject("the stripes do not hash to what their peers vouched for", 0.1, [1, 2]))
    assert {p: f.round for p, f in retry.items()} == {1: 13, 3: 13}
    joiner = StateTransfer(5, 9, 12, [2, 3, 1], 0.5, 0.0, size=10, chunk_values=4, anchor=1)
    assert set(pulls(joiner.start(0.0))) == {2, 3}


def test_the_state_hash_is_not_a_crc_four_changed_bytes_with_the_crc_kept_are_caught() -> None:
    """A CRC is linear: 4 bytes chosen after a change restore it (issue 38 installed such a
    state). The state's hash is BLAKE2b: the same edit changes it."""
    import zlib

    honest = np.arange(64, dtype=np.float32)
    forged = honest.copy()
    forged[3] = 1e6
    raw = bytearray(forged.tobytes())
    # Restore the CRC32 by choosing the last 4 bytes (CRC's linearity: solve bit by bit).
    target = zlib.crc32(honest.tobytes())
    raw[-4:] = _crc_patch(bytes(raw[:-4]), target)
    patched = np.frombuffer(bytes(raw), np.float32)
    assert zlib.crc32(patched.tobytes()) == target and not np.array_equal(patched, honest)
    assert state_hash(patched) != state_hash(honest)
    assert state_hash(honest) == state_hash(honest.copy())


def _crc_patch(prefix: bytes, target: int) -> bytes:
    """4 bytes that make crc32(prefix + them) == target (the standard CRC32 forcing trick)."""
    import zlib

    # crc32 of prefix + x is affine in x over GF(2): solve the 32x32 system.
    base = zlib.crc32(prefix + b"\0\0\0\0")
    columns = [zlib.crc32(prefix + (1 << i).to_bytes(4, "little")) ^ base for i in range(32)]
    want = target ^ base
    rows = [(columns[i], 1 << i) for i in range(32)]
    basis: list[tuple[int, int]] = []
    for vec, comb in rows:
        for bvec, bcomb in basis:
            if vec ^ bvec < vec:
                vec, comb = vec ^ bvec, comb ^ bcomb
        if vec:
            basis.append((vec, comb))
            basis.sort(reverse=True)
    comb = 0
    for bvec, bcomb in basis:
        if want ^ bvec < want:
            want, comb = want ^ bvec, comb ^ bcomb
    assert want == 0
    return comb.to_bytes(4, "little")


def test_a_stripe_with_the_honest_hash_but_wrong_values_is_dropped_not_a_crash() -> None:
    """Issue 38: the anchor's dispute path raised IndexError when every chunk named the
    anchor's hash and only the values were wrong. The liar's chunks are dropped and asked
    of a peer not asked yet."""
    transfer = StateTransfer(5, 9, 12, [1, 2, 3], 0.5, 0.0, size=10, chunk_values=4, anchor=1)
    asked = pulls(transfer.start(0.0))
    lie = [f.with_values(np.full(4 if f.chunk_index < 2 else 2, 7.0, np.float32)) for f in answer(asked[2], 2)]
    assert all(f.model_hash == state_hash(STATE) for f in lie)
    out = feed(transfer, answer(asked[1], 1) + lie, 0.1)
    assert "state_rejected" in kinds(out) and transfer.result is None
    retry = pulls(out)
    assert {p: f.indices() for p, f in retry.items()} == {3: [1]}
    feed(transfer, answer(retry[3], 3), 0.2)
    assert transfer.result is not None and transfer.result[1].tobytes() == STATE.tobytes()


def test_a_state_labelled_far_past_the_fleets_round_is_refused_and_a_near_one_taken() -> None:
    """Issue 38: one MODEL frame labelled 10^6 rounds ahead had the joiner ask everybody for
    a round nobody reaches."""
    transfer = StateTransfer(5, 9, 12, [1, 2, 3], 0.5, 0.0, size=10, chunk_values=4)
    asked = pulls(transfer.start(0.0))
    far = answer(asked[2], 2, round=12 + 10**6)
    assert kinds(feed(transfer, far, 0.1)) == ["state_beyond_fleet"] * len(far)
    assert transfer.target == 12
    # A peer a few rounds on (it went on while we asked) is followed as before.
    out = feed(transfer, answer(asked[1], 1, round=14), 0.2)
    assert transfer.target == 14 and pulls(out)


def test_a_round_known_long_ago_takes_the_state_of_the_round_the_fleet_ran_to_since() -> None:
    """A member restarted from a checkpoint of round 4 written 0.8 s ago asks for round 4;
    the fleet ran to round 28 in between (30 rounds a second)."""
    stale = StateTransfer(5, 9, 4, [1, 2, 3], 0.5, 10.0, size=10, chunk_values=4)
    asked = pulls(stale.start(10.0))
    assert kinds(feed(stale, answer(asked[1], 1, round=28), 10.02)) == ["state_beyond_fleet"] * 2
    known = StateTransfer(5, 9, 4, [1, 2, 3], 0.5, 10.0, size=10, chunk_values=4, since=9.2)
    asked = pulls(known.start(10.0))
    feed(known, answer(asked[1], 1, round=28), 10.02)
    assert known.target == 28
    feed(known, answer(asked[2], 2, round=28), 10.03)
    assert known.result is not None and known.result[0] == 28
    # Still bounded: 100 rounds a second since then, plus the slack.
    far = StateTransfer(5, 9, 4, [1, 2, 3], 0.5, 10.0, size=10, chunk_values=4, since=9.2)
    asked = pulls(far.start(10.0))
    assert kinds(feed(far, answer(asked[1], 1, round=4 + 8 + 100), 10.02)) == ["state_beyond_fleet"] * 2


def colliding_states() -> tuple[np.ndarray, np.ndarray]:
    """Two states with one 32-bit state hash, found as a forger would (a birthday search:
    ~2^16 hashes of small states)."""
    seen: dict[int, np.ndarray] = {}
    for i in range(1, 1 << 22):
        state = np.array([i, 1, 2, 3], dtype=np.float32)
        h = state_hash(state)
        if h in seen:
            return seen[h], state
        seen[h] = state
    raise AssertionError("no 32-bit collision in 2^22 states")


def test_the_full_digest_tells_apart_two_states_the_header_hash_cannot() -> None:
    honest, forged = colliding_states()
    assert state_hash(honest) == state_hash(forged) and not np.array_equal(honest, forged)
    assert len(state_digest(honest)) == 32 and state_digest(honest) != state_digest(forged)
    announced = {0: state_digest(honest)}  # the coordinator's, for the round
    assert vouch(state_digest(honest), announced, [0, 1, 3], coordinator=0) is Vouch.VOUCHED
    assert vouch(state_digest(forged), announced, [0, 1, 3], coordinator=0) is Vouch.DISPUTED


def test_a_majority_of_the_view_vouches_one_device_never_does() -> None:
    good, bad = state_digest(STATE), state_digest(STATE + 1)
    members = [0, 1, 2, 3]  # the joiner left out
    # No coordinator to ask (it is the joiner, or gone): three of four announced it.
    assert vouch(good, {1: good, 2: good, 3: good}, members, coordinator=None) is Vouch.VOUCHED
    # The forger announces its forgery on its own topic: alone it is no majority.
    assert vouch(bad, {3: bad}, members, coordinator=None) is Vouch.UNANNOUNCED
    assert vouch(bad, {3: bad, 2: bad}, members, coordinator=None) is Vouch.UNANNOUNCED  # half is not more
    assert vouch(bad, {0: good, 1: good, 2: good, 3: bad}, members, coordinator=None) is Vouch.DISPUTED
    # The coordinator's word decides against a lone forger, and waits for nobody else.
    assert vouch(bad, {0: good, 3: bad}, members, coordinator=0) is Vouch.DISPUTED
    assert vouch(good, {0: good, 3: bad}, members, coordinator=0) is Vouch.VOUCHED
    # Announcements by nodes outside the view count for nothing.
    assert vouch(bad, {7: bad, 8: bad, 9: bad}, members, coordinator=None) is Vouch.UNANNOUNCED


def test_a_pull_pays_for_the_state_it_asks_for() -> None:
    """Issue 54: a server answers a pull with at most AMPLIFICATION x its bytes; the puller
    pads each pull to a third of the MODEL frames it asks for, a stripe or the whole state."""
    transfer = StateTransfer(5, 9, 12, [1, 2], 0.5, 0.0, size=10, chunk_values=4)
    for peer, pull in pulls(transfer.start(0.0)).items():
        answer_bytes = sum(frame_size(f) for f in answer(pull, peer))
        assert answer_bytes == sum(state_frame_bytes(10, 4, j) for j in asked_indices(pull))
        assert answer_bytes <= AMPLIFICATION * frame_size(pull)
    alone = StateTransfer(5, 9, 12, [1], 0.5, 0.0, size=10, chunk_values=4)
    whole = pulls(alone.start(0.0))[1]
    assert sum(frame_size(f) for f in answer(whole, 1)) <= AMPLIFICATION * frame_size(whole)
