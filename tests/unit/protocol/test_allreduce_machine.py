"""The FT-tree round machine fed by hand: dedupe, relays, timeouts, adaptive RTO, deadline."""

from __future__ import annotations

import numpy as np
import pytest

from agent.protocol.allreduce import AllreduceConfig, Note, RoundContext, RoundMachine, Send
from agent.protocol.ft_tree import FtTreeRound
from agent.protocol.rounds import new_round as _new_round
from agent.protocol.rto import LinkEstimators
from agent.protocol.topology import Tree
from agent.protocol.wire import Flag, Frame, Kind


def new_round(*args: object) -> RoundMachine:
    return _new_round(RoundContext(*args))  # type: ignore[arg-type]


CFG = AllreduceConfig(chunk_size=4, timeout_mode="fixed", fixed_timeout=0.1, round_deadline=2.0)
TREE = Tree((0, 1, 2), 2)


def data(sender: int, ids: set[int], value: float, *, kind: Kind = Kind.DATA, origin: int | None = None,
         target: int = 0xFFFF, round: int = 3, count: int = 1) -> Frame:
    frame = Frame(kind, 0, round, sender, 0, count, Flag.NONE, origin=sender if origin is None else origin,
                  target=target, contributors=frozenset(ids))
    return frame.with_values(np.full(4, value, np.float32))


def root(grad: float = 0.0) -> FtTreeRound:
    m = new_round(CFG, TREE, 0, 3, np.full(4, grad, np.float32), 0, CFG.new_links(), 0.0)
    assert isinstance(m, FtTreeRound)
    assert m.start(0.0) == []
    return m


def acks(actions: list) -> list[Frame]:  # type: ignore[type-arg]
    return [a.frame for a in actions if isinstance(a, Send) and a.frame.kind == Kind.ACK]


def test_a_resent_contribution_is_acked_again_but_counted_once() -> None:
    m = root(0.0)
    assert len(acks(m.on_frame(data(1, {1}, 3.0), 0.01))) == 1
    assert len(acks(m.on_frame(data(1, {1}, 3.0), 0.02))) == 1  # lost ACK, resend
    relayed = data(2, {1}, 3.0, kind=Kind.RELAY, origin=1, target=0)  # and once more by relay
    out = m.on_frame(relayed, 0.03)
    assert acks(out)[0].target == 1 and [a.dst for a in out if isinstance(a, Send)] == [2]
    assert m.result is None
    m.on_frame(data(2, {2}, 6.0), 0.04)
    assert m.result is not None
    assert m.result.values.tolist() == [3.0] * 4  # (0 + 3 + 6) / 3, node 1 counted once
    assert m.result.contributors == (frozenset({0, 1, 2}),) and not m.result.degraded


def test_a_partially_overlapping_set_is_refused() -> None:
    m = new_round(CFG, Tree((0, 1, 2, 3, 4), 2), 0, 3, np.zeros(4, np.float32), 0, CFG.new_links(), 0.0)
    m.start(0.0)
    m.on_frame(data(1, {1, 3}, 3.0), 0.01)
    m.on_frame(data(1, {3, 4}, 5.0), 0.02)  # 3 again, and 4 that the held unit lacks
    assert m.stats.overlaps == 1 and m.result is None


def test_a_set_that_holds_every_unit_it_overlaps_replaces_them_and_counts_each_once() -> None:
    """Node 1's child sent around it (its Will) what node 1 had ACKed; node 1, back, sends
    its subtree's mean with that child's share in it. Refused, the root waited for node 1
    until its wait ran out and ended the round degraded."""
    m = new_round(CFG, Tree((0, 1, 2, 3, 4), 2), 0, 3, np.zeros(4, np.float32), 0, CFG.new_links(), 0.0)
    m.start(0.0)
    m.on_frame(data(3, {3}, 4.0), 0.01)  # around its parent 1
    m.on_frame(data(1, {1, 3, 4}, 6.0), 0.02)  # the subtree's mean, 3 included
    assert m.stats.overlaps == 0 and m.result is None
    m.on_frame(data(2, {2}, 9.0), 0.03)
    assert m.result is not None and not m.result.degraded
    assert m.result.contributors == (frozenset({0, 1, 2, 3, 4}),)
    assert m.result.values == pytest.approx([(0 + 3 * 6.0 + 9.0) / 5] * 4)  # 3 counted once


def test_frames_that_make_no_sense_are_dropped_and_counted() -> None:
    m = root()
    m.on_frame(data(1, {1}, 1.0, round=4), 0.01)  # another round
    m.on_frame(data(1, {1}, 1.0, count=2), 0.01)  # wrong chunk count
    m.on_frame(data(1, {7}, 1.0), 0.01)  # a contributor outside our subtree
    assert m.stats.dropped == 3 and m.result is None


def test_no_ack_marks_the_link_dead_and_every_pending_chunk_moves_to_the_backup() -> None:
    cfg = AllreduceConfig(chunk_size=2, timeout_mode="fixed", fixed_timeout=0.1)
    leaf = new_round(cfg, TREE, 1, 0, np.arange(6, dtype=np.float32), 0, cfg.new_links(), 0.0)
    sent = leaf.start(0.0)
    assert [a.dst for a in sent if isinstance(a, Send)] == [0, 0, 0]
    assert leaf.next_timer() == pytest.approx(0.1)
    out = leaf.on_timer(0.1)
    kinds = [a.kind for a in out if isinstance(a, Note)]
    assert kinds.count("link_dead") == 1 and kinds.count("timeout") == 1
    relays = [a for a in out if isinstance(a, Send)]
    assert len(relays) == 3 and all(a.dst == 2 and a.frame.kind == Kind.RELAY and a.frame.target == 0
                                    for a in relays)
    assert leaf.result is None


def test_the_hard_deadline_falls_back_to_the_local_value() -> None:
    leaf = new_round(CFG, TREE, 2, 0, np.full(4, 7.0, np.float32), 0, CFG.new_links(), 0.0)
    leaf.start(0.0)
    t = 0.0
    while leaf.result is None:
        nxt = leaf.next_timer()
        assert nxt is not None and nxt > t
        t = nxt
        leaf.on_timer(t)
    assert t == pytest.approx(CFG.round_deadline)
    assert leaf.result.degraded and leaf.result.missing_chunks == (0,)
    assert leaf.result.values.tolist() == [7.0] * 4 and leaf.result.contributors == (frozenset({2}),)
    assert leaf.next_timer() is None


def test_adaptive_rto_follows_the_rtt_and_is_clamped() -> None:
    links = LinkEstimators(min_timeout=0.05, max_timeout=1.0, initial_timeout=0.5)
    assert links.rto(3) == 0.5
    for _ in range(20):
        links.observe(3, 0.002)
    assert links.rto(3) == 0.05
    for _ in range(20):
        links.observe(3, 5.0)
    assert links.rto(3) == 1.0
    fixed = AllreduceConfig(timeout_mode="fixed", fixed_timeout=0.25).new_links()
    fixed.observe(1, 0.001)
    assert fixed.rto(1) == 0.25


def test_acks_feed_the_link_estimators() -> None:
    cfg = AllreduceConfig(chunk_size=4)
    links = cfg.new_links()
    leaf = new_round(cfg, TREE, 1, 0, np.zeros(4, np.float32), 0, links, 0.0)
    frame = next(a for a in leaf.start(0.0) if isinstance(a, Send)).frame
    ack = Frame(Kind.ACK, 0, 0, 0, 0, 1, origin=0, target=1, contributors=frame.contributors)
    leaf.on_frame(ack, 0.004)
    assert links.peers[0].srtt == pytest.approx(0.004)


def test_config_rejects_nonsense() -> None:
    for bad in (dict(algorithm="mesh"), dict(chunk_size=0), dict(timeout_mode="sometimes"),
                dict(min_timeout=2.0, max_timeout=1.0), dict(round_deadline=0)):
        with pytest.raises(ValueError):
            AllreduceConfig(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        new_round(CFG, TREE, 9, 0, np.zeros(4), 0, CFG.new_links(), 0.0)


def test_a_contribution_far_beyond_any_honest_gradient_is_refused_and_counted() -> None:
    m = root(0.5)
    m.on_frame(data(1, {1}, 1e20), 0.01)  # a buggy or hostile peer (valid CRC, valid set)
    assert m.stats.implausible == 1  # type: ignore[attr-defined]
    m.on_frame(data(1, {1}, 3.0), 0.02)  # its honest resend is still welcome
    m.on_frame(data(2, {2}, 6.0), 0.03)
    assert m.result is not None and np.isfinite(m.result.values).all()
    assert m.result.values.tolist() == [3.1666667461395264] * 4


def _floods(actions: list) -> list[Frame]:  # type: ignore[type-arg]
    return [a.frame for a in actions if isinstance(a, Send) and a.frame.flags & Flag.FLOOD]


def test_a_flood_to_a_peer_we_reported_silent_waits_until_it_refutes() -> None:
    """Every member forwards a flooded unit (a whole vector each: 21 MB at 15 agents); to a
    frozen peer that only slowed the fleet while the verdict on it came. Alive with its
    links cut, the peer refutes the report, and the flood goes then."""
    leaf = new_round(CFG, TREE, 1, 0, np.arange(4, dtype=np.float32), 0, CFG.new_links(), 0.0)
    leaf.start(0.0)
    out = leaf.on_timer(0.1)  # no ACK and nothing else from 0: reported silent, relay via 2
    assert [a.peer for a in out if isinstance(a, Note) and a.kind == "silent"] == [0]
    seen: list = []  # type: ignore[type-arg]
    t = 0.1
    while (nxt := leaf.next_timer()) is not None and nxt < 1.0:
        t = nxt
        seen += leaf.on_timer(t)
    assert any(isinstance(a, Note) and a.kind == "reroute" and "flood" in a.detail for a in seen)
    assert _floods(seen) == []  # held: no member forwards anything yet
    floods = _floods(leaf.peer_spoke(0, t + 0.01))
    assert floods and all(f.target == 0 and f.kind == Kind.RELAY for f in floods)


def test_a_flood_held_for_a_silent_peer_goes_when_the_peer_is_heard() -> None:
    leaf = new_round(CFG, TREE, 1, 0, np.arange(4, dtype=np.float32), 0, CFG.new_links(), 0.0)
    leaf.start(0.0)
    leaf.on_timer(0.1)
    leaf.on_timer(0.1 + 0.2)  # the relay's timeout: the flood is next, held
    pull = Frame(Kind.PULL, 0, 3, 0, 0, 1, Flag.BROADCAST, origin=0, target=1)  # another round: alive all the same
    assert _floods(leaf.on_frame(pull, 0.35))
