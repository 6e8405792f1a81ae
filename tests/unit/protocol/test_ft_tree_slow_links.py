"""Slow links (issue 19): a unit's timers cover the bytes queued ahead of it, a draining link is
never resent into or routed around, a silent peer is still found, and a fleet whose every link
is slow (6 MB/s each way, the thesis model in float32) neither degrades nor resends."""

from __future__ import annotations

import numpy as np
import pytest

from agent.protocol.allreduce import AllreduceConfig, RoundContext, Send, frame_size
from agent.protocol.ft_tree import FtTreeRound
from agent.protocol.topology import Tree
from agent.protocol.wire import DType, Flag, Frame, Kind
from simulate.virtual_fleet import FleetConfig, VirtualFleet, run_fleet

CHUNK = 262_144  # 1 MB frames in float32, the default
FLOOR = 2e6
CFG = AllreduceConfig(chunk_size=CHUNK, round_deadline=5.0, link_rate_floor=FLOOR)
TREE = Tree((0, 1, 2), 2)
MODEL = 407_050


def leaf(cfg: AllreduceConfig = CFG, chunks: int = 2) -> FtTreeRound:
    grad = np.ones(cfg.chunk_size * chunks, np.float32)
    return FtTreeRound(RoundContext(cfg, TREE, 1, 0, grad, 0, cfg.new_links(), 0.0))


def data_sent(actions: list) -> list[Frame]:  # type: ignore[type-arg]
    return [a.frame for a in actions if isinstance(a, Send) and a.frame.kind == Kind.DATA]


def ack(j: int) -> Frame:
    return Frame(Kind.ACK, 0, 0, 0, j, 2, Flag.NONE, origin=0, target=1, contributors=frozenset({1}))


def test_the_first_unit_waits_for_its_own_transmission_before_anything_fires() -> None:
    m = leaf()
    sent = data_sent(m.start(0.0))
    assert [f.chunk_index for f in sent] == [0, 1]
    first = frame_size(sent[0])
    due = m.next_timer()
    assert due is not None
    # Nothing heard yet: the peer counts as silent only after one RTO plus chunk 0's drain.
    assert due == pytest.approx(CFG.initial_timeout + first / FLOOR)
    assert m.on_timer(due - 1e-6) == []


def test_acks_of_earlier_units_keep_a_draining_link_alive() -> None:
    m = leaf()
    sent = data_sent(m.start(0.0))
    # Chunk 0's ACK at 0.9 s (a slow, shared link): chunk 1 is not resent, its timers run
    # from that ACK and cover its own transmission at the measured rate.
    out = m.on_frame(ack(0), 0.9)
    assert data_sent(out) == [] and m.stats.retransmits == 0
    rate = m.scope.links.peers[0].rate
    assert rate == pytest.approx(frame_size(sent[0]) / 0.9)
    due = m.next_timer()
    assert due is not None
    assert due >= 0.9 + frame_size(sent[1]) / rate
    actions = m.on_timer(due - 1e-6)
    assert data_sent(actions) == [] and m.stats.timeouts == 0 and m.stats.reroutes == 0


def test_a_resend_on_a_live_link_backs_off_exponentially() -> None:
    m = leaf()
    m.start(0.0)
    m.on_frame(ack(0), 0.6)  # the peer lives: chunk 1 may be resent, later
    unit = m.courier.pending[(False, 1, frozenset({1}))]
    drain = m.courier.drain(unit)  # chunk 1 alone is unACKed: the same before and after a resend
    waits, heard = [], 0.6
    for _ in range(2):
        due = m.next_timer()
        assert due is not None
        assert [f.chunk_index for f in data_sent(m.on_timer(due))] == [1]
        waits.append(due - heard - drain)
        # The peer answers a probe: alive, so the unit may be resent again, after twice as long.
        m.on_frame(Frame(Kind.PROBE, 0, 0, 0, 0, 2, Flag.REPLY, origin=0, target=1), due)
        heard = due
    assert m.courier.drain(unit) == pytest.approx(drain)
    assert waits[1] == pytest.approx(2 * waits[0])
    assert m.stats.retransmits == 2 and m.stats.reroutes == 0


def test_a_silent_peer_is_still_declared_dead_after_one_timeout_plus_the_drain() -> None:
    small = AllreduceConfig(chunk_size=64, round_deadline=5.0, link_rate_floor=FLOOR)
    m = leaf(small, chunks=1)
    m.start(0.0)
    due = m.next_timer()
    assert due is not None and due < small.initial_timeout * 1.01  # small units: about one RTO
    notes = m.on_timer(due)
    assert any(getattr(a, "kind", "") == "link_dead" for a in notes)


def test_large_units_are_acked_at_once() -> None:
    root = FtTreeRound(RoundContext(CFG, TREE, 0, 0, np.ones(2 * CHUNK, np.float32), 0, CFG.new_links(), 0.0))
    root.start(0.0)
    unit = Frame(Kind.DATA, 0, 0, 1, 0, 2, Flag.NONE, contributors=frozenset({1})).with_values(
        np.ones(CHUNK, np.float32))
    acks = [a.frame for a in root.on_frame(unit, 0.1) if isinstance(a, Send) and a.frame.kind == Kind.ACK]
    assert len(acks) == 1 and acks[0].target == 1


@pytest.mark.parametrize(("rate", "dtype"), [(6e6, DType.F32), (2e6, DType.I8)])
def test_a_fleet_on_slow_links_neither_degrades_nor_resends(rate: float, dtype: DType) -> None:
    cfg = AllreduceConfig(round_deadline=5.0, wire_dtype=dtype)
    records = run_fleet(7, 6, length=MODEL, allreduce=cfg, bandwidth=rate, ingress_bandwidth=rate,
                        latency=0.001, compute_time=0.05, max_time=1e3)
    assert [r.round for r in records] == list(range(6)), "the fleet halted"
    results = [res for r in records for res in r.results.values()]
    assert not any(r.degraded for r in records)
    assert sum(res.stats.retransmits + res.stats.reroutes + res.stats.timeouts for res in results) == 0
    # Every round moves the model once down and once up each of the 6 tree links.
    itemsize = {DType.F32: 4, DType.I8: 1}[dtype]
    data_bytes = MODEL * itemsize
    for r in records:
        sent = sum(res.stats.bytes_sent for res in r.results.values())
        assert sent <= 1.1 * 12 * data_bytes, r.round


@pytest.mark.parametrize("slow", [(3, 1), (1, 0)], ids=["leaf", "inner"])
def test_one_device_on_a_slow_uplink_among_fast_links_is_never_taken_for_silent(slow: tuple[int, int]) -> None:
    """One device's uplink at 2 MB/s (a Pi on weak Wi-Fi), every other link and downlink fast:
    its units reach its parent 0.5 s a MB apart. Counted at the parent's own fast downlink,
    the parent took it and its sibling for silent, and the root the parent, every round."""
    fleet = VirtualFleet(FleetConfig(nodes=7, rounds=10, length=MODEL, allreduce=AllreduceConfig(round_deadline=5.0),
                                     latency=0.0005, compute_time=0.03, ingress_bandwidth=500e6, max_time=1e3))
    fleet.bus.set_link(*slow, bandwidth=2e6)
    records = fleet.run()
    assert [r.round for r in records] == list(range(10)), "the fleet halted"
    taken = [(r.round, n, x.peer) for r in records for n, notes in r.notes.items() for x in notes
             if x.kind in ("silent", "suspected")]
    assert taken == []
    assert all(sorted(r.results) == list(range(7)) and not r.degraded for r in records)


def test_the_wait_for_contributions_follows_a_slow_fleets_clean_rounds() -> None:
    # With a 4 s deadline the root's base wait is 2 s, but on 6 MB/s links its clean rounds
    # take ~2.1 s (the previous broadcast reaches the leaves late, so their data comes late):
    # the base wait alone cut the late contributions off, every round from round 2, degraded.
    # The chunk size and broadcast stay as configured (the coordinator would cut the chunks
    # smaller on this downlink: tests/unit/simulate/test_virtual_fleet.py).
    cfg = AllreduceConfig(round_deadline=4.0)
    records = run_fleet(7, 8, length=MODEL, allreduce=cfg, bandwidth=6e6, ingress_bandwidth=6e6,
                        latency=0.001, compute_time=0.05, max_time=1e3, adapt_chunks=False,
                        adapt_broadcast=False)
    assert [r.round for r in records] == list(range(8))
    assert [r.round for r in records if r.degraded] == []
    assert all(res.contributors == (frozenset(range(7)),) * 2 for r in records for res in r.results.values())
