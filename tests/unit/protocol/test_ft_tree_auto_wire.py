"""wire_dtype "auto" in the FT-tree: each unit going up in the format its link fits and its
children's units came in, the root's result quantized once in the narrowest of them, and the
same result bytes everywhere (broadcast, pulls, the fan-out again), so every member applies
the same values. In a fleet: fast links stay float32, one slow link narrows its own frames and
the result, and the results stay byte-identical."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from agent.protocol.allreduce import (
    AllreduceConfig,
    Broadcast,
    Fanout,
    RoundContext,
    Send,
    frame_size,
)
from agent.protocol.answer_budget import padded
from agent.protocol.ft_tree import FtTreeRound
from agent.protocol.rto import LinkEstimators
from agent.protocol.topology import Tree
from agent.protocol.wire import DType, Flag, Frame, Kind
from simulate.virtual_fleet import FleetConfig, VirtualFleet

MODEL = 407_050  # the thesis model: 2 chunks of the default size, 1.63 MB in float32
AUTO = AllreduceConfig(wire_auto=True, round_deadline=5.0)
AUTO_TREE = replace(AUTO, broadcast="tree")  # the relayed copies of the result, looked at one by one
TREE = Tree((0, 1, 2, 3, 4), 2)  # 0 root; 1 inner with leaves 3 and 4; 2 a leaf
rng = np.random.default_rng(0)
GRAD = rng.standard_normal(MODEL, dtype=np.float32)


def slow(links: LinkEstimators, peer: int, rate: float = 2e6) -> LinkEstimators:
    for _ in range(3):
        links.observe_drain(peer, 1_000_000, 1_000_000 / rate)
    return links


def fast(links: LinkEstimators, peer: int) -> LinkEstimators:
    return slow(links, peer, 500e6)


def machine(node: int, links: LinkEstimators | None = None, cfg: AllreduceConfig = AUTO,
            tree: Tree = TREE) -> FtTreeRound:
    m = FtTreeRound(RoundContext(cfg, tree, node, 0, GRAD.copy(), 0, links or cfg.new_links(), 0.0))
    return m


def data(actions: list) -> list[Send]:  # type: ignore[type-arg]
    return [a for a in actions if isinstance(a, Send) and a.frame.kind == Kind.DATA]


def unit(sender: int, j: int, dtype: DType, m: FtTreeRound) -> Frame:
    ch = m.chunks[j]
    return Frame(Kind.DATA, 0, 0, sender, j, m.n, contributors=frozenset({sender})).with_values(
        GRAD[ch.lo : ch.hi] * sender, dtype)


def final(m: FtTreeRound, j: int, dtype: DType, ids: frozenset[int]) -> Frame:
    ch = m.chunks[j]
    return Frame(Kind.DATA, 0, 0, 0, j, m.n, Flag.BROADCAST | Flag.FINAL, target=m.scope.node,
                 contributors=ids).with_values(GRAD[ch.lo : ch.hi], dtype)


def pull(sender: int, m: FtTreeRound) -> Frame:
    """A PULL of the whole result, paid for (answer_budget.py)."""
    ask = Frame(Kind.PULL, 0, 0, sender, 0, m.n, Flag.BROADCAST).with_indices([])
    return padded(ask, 2 * m.scope.result_bytes(range(m.n)))


@pytest.mark.parametrize(("children", "parent_slow", "expected"), [
    ((DType.F32, DType.F32), False, DType.F32),  # unmeasured uplink, wide children: float32
    ((DType.I8, DType.F32), False, DType.I8),  # a child on a slow link narrows what goes up
    ((DType.F16, DType.F32), False, DType.F16),
    ((DType.F32, DType.F32), True, DType.I8),  # our own slow uplink does
])
def test_a_unit_goes_up_in_the_narrowest_of_its_links_choice_and_its_childrens_formats(
        children: tuple[DType, DType], parent_slow: bool, expected: DType) -> None:
    links = slow(AUTO.new_links(), 0) if parent_slow else AUTO.new_links()
    inner = machine(1, links)
    inner.start(0.0)
    up: list[Send] = []
    for j in range(inner.n):
        for child, dtype in zip((3, 4), children, strict=True):
            up += [s for s in data(inner.on_frame(unit(child, j, dtype, inner), 0.01)) if s.dst == 0]
    assert [s.frame.dtype for s in up] == [expected] * inner.n
    assert all(s.frame.contributors == frozenset({1, 3, 4}) for s in up)


def test_a_link_is_measured_over_its_whole_drain_not_by_acks_that_bunched_up() -> None:
    leaf = machine(3)
    sent = [s.frame for s in data(leaf.start(0.0))]
    assert [f.dtype for f in sent] == [DType.F32] * 2  # nothing measured: float32
    sizes = [frame_size(f) for f in sent]

    def ack(j: int) -> Frame:
        return Frame(Kind.ACK, 0, 0, 1, j, 2, Flag.NONE, target=3, contributors=frozenset({3}))

    # A 3 MB/s link, but chunk 1's ACK waited behind bulk data on our downlink and came
    # 10 ms after chunk 0's: a single-ACK sample of ~58 MB/s (float32, were it believed).
    leaf.on_frame(ack(0), 0.5)
    leaf.on_frame(ack(1), 0.51)
    assert sizes[1] / 0.01 > 50e6
    typical = leaf.scope.links.typical_rate(1)
    assert typical == pytest.approx(sum(sizes) / 0.51)  # the whole drain: ~3.2 MB/s
    assert len(leaf.scope.links.peers[1].drains) == 1
    assert leaf.uplink.wire_dtype(1, 0) == DType.I8


@pytest.mark.parametrize(("own_rate", "drain", "expected"), [
    (None, None, DType.F32),        # nothing measured yet
    (5e9, 20e6, DType.F32),         # loaded loopback: slow drains, our link reads GB/s
    (50e6, 25e6, DType.I8),         # a 50 MB/s link: its drains keep float32, our link does not
    (100e6, 60e6, DType.F16),       # gigabit-like
    (500e6, 2e6, DType.I8),         # a fast own link never widens a slow peer's link
])
def test_our_own_links_rate_narrows_what_we_send_never_widens_it(own_rate: float | None, drain: float | None,
                                                                 expected: DType) -> None:
    links = AUTO.new_links() if drain is None else slow(AUTO.new_links(), 1, drain)
    ctx = RoundContext(AUTO, TREE, 3, 0, GRAD.copy(), 0, links, 0.0, own_link_rate=own_rate)
    leaf = FtTreeRound(ctx)
    assert {s.frame.dtype for s in data(leaf.start(0.0))} == {expected}


def test_fixed_formats_are_what_they_were() -> None:
    cfg = AllreduceConfig(wire_dtype=DType.F16, round_deadline=5.0)
    leaf = machine(3, slow(cfg.new_links(), 1), cfg)
    assert {s.frame.dtype for s in data(leaf.start(0.0))} == {DType.F16}


def test_the_root_quantizes_the_result_once_and_every_copy_carries_those_bytes() -> None:
    # Child 1's units came in int8, child 2's in float32: the result goes int8.
    root = machine(0, fast(fast(AUTO.new_links(), 2), 1), AUTO_TREE, Tree((0, 1, 2), 2))
    root.start(0.0)
    down: list[Send] = []
    for j in range(root.n):
        down += data(root.on_frame(unit(1, j, DType.I8, root), 0.01))
        down += data(root.on_frame(unit(2, j, DType.F32, root), 0.01))
    assert sorted((s.dst, s.frame.chunk_index) for s in down) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert {s.frame.dtype for s in down} == {DType.I8}
    assert root.result is not None
    for j in range(root.n):
        copies = [s.frame for s in down if s.frame.chunk_index == j]
        assert copies[0].payload == copies[1].payload and copies[0].scale == copies[1].scale
        ch = root.chunks[j]
        # The root applies what it sends, exactly.
        assert np.array_equal(root.result.values[ch.lo : ch.hi], copies[0].values())
    # Child 2 ACKs the result, then asks for it again (it lost it): the same bytes, not float32.
    ack = Frame(Kind.ACK, 0, 0, 2, 1, root.n, Flag.BROADCAST, target=0, contributors=frozenset({0, 1, 2}))
    root.on_frame(ack.with_indices([0, 1]), 0.02)
    answers = data(root.on_frame(pull(2, root), 0.03))
    assert [(s.dst, s.frame.dtype) for s in answers] == [(2, DType.I8)] * root.n
    for s in answers:
        sent = next(d.frame for d in down if d.frame.chunk_index == s.frame.chunk_index)
        assert (s.frame.payload, s.frame.scale) == (sent.payload, sent.scale)


def test_the_roots_own_slow_link_to_a_child_does_not_narrow_the_result() -> None:
    # (Its samples come from the broadcast's ACKs, a share of the root's uplink each.)
    root = machine(0, slow(AUTO.new_links(), 1), AUTO_TREE, Tree((0, 1, 2), 2))
    root.start(0.0)
    down: list[Send] = []
    for j in range(root.n):
        down += data(root.on_frame(unit(1, j, DType.F32, root), 0.01))
        down += data(root.on_frame(unit(2, j, DType.F32, root), 0.01))
    assert len(down) == 2 * root.n and {s.frame.dtype for s in down} == {DType.F32}


def test_an_inner_node_passes_the_roots_format_on_to_its_children_and_to_pullers() -> None:
    inner = machine(1, fast(fast(AUTO.new_links(), 3), 4), AUTO_TREE)  # its own links fast: float32 would fit
    inner.start(0.0)
    ids = frozenset(range(5))
    finals = [final(inner, j, DType.I8, ids) for j in range(inner.n)]
    down: list[Send] = []
    for f in finals:
        down += data(inner.on_frame(f, 0.05))
    assert sorted((s.dst, s.frame.chunk_index) for s in down) == [(3, 0), (3, 1), (4, 0), (4, 1)]
    for s in down:
        f = finals[s.frame.chunk_index]
        assert (s.frame.dtype, s.frame.scale, s.frame.payload) == (DType.I8, f.scale, f.payload)
    answers = data(inner.on_frame(pull(2, inner), 0.06))  # its sibling asks
    assert [s.dst for s in answers] == [2, 2]
    for s in answers:
        f = finals[s.frame.chunk_index]
        assert (s.frame.dtype, s.frame.scale, s.frame.payload) == (DType.I8, f.scale, f.payload)
    assert inner.result is not None
    assert np.array_equal(inner.result.values, np.concatenate([f.values() for f in finals]))


def test_a_root_back_after_a_drop_fans_the_same_bytes_out_again() -> None:
    cfg = AllreduceConfig(wire_auto=True, round_deadline=5.0, broadcast="fanout")
    tree = Tree((0, 1, 2), 2)
    root = machine(0, None, cfg, tree)
    root.start(0.0)
    first: list[Frame] = []
    for j in range(root.n):
        for child, dtype in ((1, DType.F32), (2, DType.I8)):
            first += [a.frame for a in root.on_frame(unit(child, j, dtype, root), 0.01)
                      if isinstance(a, Fanout)]
    assert [f.dtype for f in first] == [DType.I8] * root.n
    again = [a.frame for a in root.reconnected(0.05, away=0.05) if isinstance(a, Fanout)]
    assert [(f.dtype, f.scale, f.payload) for f in again] == [(f.dtype, f.scale, f.payload) for f in first]


# -- a fleet --------------------------------------------------------------------------------


def fleet(slow_link: tuple[int, int] | None = None, rate: float = 0.0, rounds: int = 4,
          broadcast: Broadcast | None = None) -> VirtualFleet:
    config = AUTO if broadcast is None else replace(AUTO, broadcast=broadcast)
    f = VirtualFleet(FleetConfig(nodes=7, rounds=rounds, length=MODEL, allreduce=config,
                                 latency=0.001, compute_time=0.05, max_time=1e3))
    if slow_link is not None:
        f.bus.set_link(*slow_link, bandwidth=rate)
    return f


def formats(record: object, node: int) -> set[str]:
    return set(record.results[node].stats.wire_frames)  # type: ignore[attr-defined]


def assert_identical(records: list) -> None:  # type: ignore[type-arg]
    for r in records:
        assert sorted(r.results) == list(range(7)) and not r.degraded, r.round
        values = [res.values for res in r.results.values()]
        assert all(np.array_equal(values[0], v) for v in values[1:]), r.round


def test_fast_links_stay_float32_everywhere() -> None:
    records = fleet().run()
    assert [r.round for r in records] == [0, 1, 2, 3]
    assert_identical(records)
    assert {name for r in records for n in range(7) for name in formats(r, n)} == {"float32"}


@pytest.mark.parametrize("broadcast", ["fanout", "tree"])
@pytest.mark.parametrize(("rate", "narrow"), [(2e6, "int8"), (12e6, "float16")])
def test_one_slow_link_narrows_its_frames_and_the_result_on_every_member(
    rate: float, narrow: str, broadcast: Broadcast
) -> None:
    # Leaf 3's uplink to its parent 1 is slow; every other link is fast.
    records = fleet((3, 1), rate, broadcast=broadcast).run()
    assert [r.round for r in records] == [0, 1, 2, 3]
    assert_identical(records)
    first, later = records[0], records[1:]
    # Round 0: nothing measured yet, float32 everywhere; the link shows its rate in it.
    assert {name for n in range(7) for name in formats(first, n)} == {"float32"}
    for r in later:
        assert formats(r, 3) == {narrow}  # the slow link's own frames
        assert formats(r, 4) == {"float32"}  # its sibling's fast link: not narrowed
        assert formats(r, 5) == formats(r, 6) == {"float32"}
        assert formats(r, 1) == {narrow}  # its mean went up narrow, and the result came down so
        assert formats(r, 0) == {narrow}  # the root's result
        # A fast subtree's mean up (and, relayed, the result down to its children).
        assert formats(r, 2) == ({"float32", narrow} if broadcast == "tree" else {"float32"})
    # The result every member applied is the narrow format's (int8: at most 255 levels a chunk).
    if narrow == "int8":
        chunk = records[-1].results[5].values[: AUTO.chunk_size]
        assert len(np.unique(chunk)) <= 255
