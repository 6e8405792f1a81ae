"""FT-tree allreduce on the in-memory bus: exactness, no double counting, link cuts, loss."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.protocol.allreduce import AllreduceConfig, Outbox, RoundStats, chunk_bounds, merge_means
from agent.protocol.topology import Tree
from agent.protocol.wire import DType, Flag, Frame, Kind
from simulate.virtual_fleet import FaultSpec, RoundRecord, count_problems, run_fleet

CHUNK = 8
LENGTH = 37  # 5 chunks, the last one short


def fast_config(**kw: object) -> AllreduceConfig:
    base: dict[str, object] = dict(chunk_size=CHUNK, timeout_mode="fixed", fixed_timeout=0.05,
                                   round_deadline=2.0)
    base.update(kw)
    return AllreduceConfig(**base)  # type: ignore[arg-type]


def exact_mean(record: RoundRecord) -> np.ndarray:
    stack = np.stack([record.gradients[n].astype(np.float64) for n in sorted(record.gradients)])
    return stack.mean(axis=0)


def assert_full_mean_everywhere(record: RoundRecord, nodes: int) -> None:
    assert sorted(record.results) == list(range(nodes))
    first = record.results[0].values
    for node, result in record.results.items():
        assert result.values.tobytes() == first.tobytes(), f"node {node} differs"
        assert not result.degraded and not result.missing_chunks
        assert all(ids == frozenset(range(nodes)) for ids in result.contributors)
    np.testing.assert_allclose(first, exact_mean(record), rtol=0, atol=2e-6)


def connected(tree: Tree, cuts: set[tuple[int, int]]) -> bool:
    alive = [e for e in tree.links() if e not in cuts]
    seen, stack = {tree.root}, [tree.root]
    while stack:
        n = stack.pop()
        for a, b in alive:
            for x, y in ((a, b), (b, a)):
                if x == n and y not in seen:
                    seen.add(y)
                    stack.append(y)
    return len(seen) == len(tree)


def test_merge_means_is_a_weighted_mean_of_disjoint_sets() -> None:
    ids, mean = merge_means([(frozenset({1}), np.array([3.0], np.float32)),
                             (frozenset({2, 3}), np.array([6.0], np.float32))])
    assert ids == {1, 2, 3} and mean[0] == pytest.approx(5.0)
    with pytest.raises(ValueError):
        merge_means([(frozenset({1}), np.zeros(1)), (frozenset({1, 2}), np.zeros(1))])


def test_chunk_bounds_cover_the_vector() -> None:
    assert chunk_bounds(37, 8) == [(0, 8), (8, 16), (16, 24), (24, 32), (32, 37)]
    assert chunk_bounds(0, 8) == [(0, 0)]


def tree_shapes(arity: int, largest: int = 64) -> list[int]:
    """Fleet sizes that make every kind of tree of this arity up to ``largest`` nodes: every
    size up to 20 (each partly filled last level of the first levels), and around each full
    tree beyond (one node short, full, one node into a new level) and the largest. The sizes
    in between repeat shapes these already have: a partly filled last level."""
    sizes, full, level = set(range(1, 21)), 1, 1
    while full <= largest + 1:
        sizes |= {full - 1, full, full + 1}
        level *= arity
        full += level
    return sorted(n for n in sizes | {largest} if 1 <= n <= largest)


@pytest.mark.parametrize("arity", [2, 3, 4])
def test_no_faults_every_node_gets_the_exact_mean_byte_identical(arity: int) -> None:
    for nodes in tree_shapes(arity):
        records = run_fleet(nodes, 1, length=LENGTH, arity=arity, allreduce=fast_config(),
                            keep_gradients=True, seed=nodes)
        assert_full_mean_everywhere(records[0], nodes)


def test_no_faults_several_rounds_and_wire_dtypes_stay_identical() -> None:
    for dtype in (DType.F32, DType.F16, DType.I8):
        records = run_fleet(9, 3, length=LENGTH, allreduce=fast_config(wire_dtype=dtype),
                            keep_gradients=True)
        for rec in records:
            values = {r.values.tobytes() for r in rec.results.values()}
            assert len(values) == 1 and not rec.degraded
            atol = 2e-6 if dtype == DType.F32 else 0.05
            np.testing.assert_allclose(rec.results[0].values, exact_mean(rec), atol=atol)


def test_rounds_are_fast_and_clean_without_faults() -> None:
    records = run_fleet(15, 4, length=LENGTH, allreduce=fast_config(), keep_gradients=True)
    for rec in records:
        assert rec.duration < 0.05  # no timeout (0.05 s) was ever needed
        assert all(r.stats.timeouts == 0 and r.stats.reroutes == 0 for r in rec.results.values())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.integers(2, 16), arity=st.sampled_from([2, 3, 4]), data=st.data())
def test_any_cut_set_that_keeps_the_ft_graph_connected_gives_the_full_mean(
    nodes: int, arity: int, data: st.DataObject
) -> None:
    tree = Tree(tuple(range(nodes)), arity)
    links = sorted(tree.links())
    chosen = data.draw(st.lists(st.sampled_from(links), unique=True, max_size=len(links)))
    cuts: set[tuple[int, int]] = set()
    for link in chosen:
        if connected(tree, cuts | {link}):
            cuts.add(link)
    faults = tuple(FaultSpec("cut", 0, a, b) for a, b in sorted(cuts))
    records = run_fleet(nodes, 2, length=LENGTH, arity=arity, keep_gradients=True,
                        allreduce=fast_config(), faults=faults)
    for rec in records:
        assert_full_mean_everywhere(rec, nodes)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.integers(2, 15), loss=st.floats(0.0, 0.3), seed=st.integers(0, 10_000),
       data=st.data())
def test_loss_and_random_cuts_end_every_round_by_its_deadline_without_double_count(
    nodes: int, loss: float, seed: int, data: st.DataObject
) -> None:
    tree = Tree(tuple(range(nodes)), 2)
    links = sorted(tree.links())
    cuts = data.draw(st.lists(st.sampled_from(links), unique=True, max_size=3))
    one_way = data.draw(st.booleans())
    faults = (FaultSpec("loss", 0, value=loss),
              *(FaultSpec("cut", 0, a, b, one_way=one_way) for a, b in cuts))
    config = fast_config(round_deadline=1.0)
    records = run_fleet(nodes, 3, length=LENGTH, keep_gradients=True, allreduce=config,
                        faults=faults, seed=seed, max_time=60.0)
    assert [r.round for r in records] == [0, 1, 2], "the fleet halted"
    for rec in records:
        assert sorted(rec.ended) == list(range(nodes))
        for node, result in rec.results.items():
            assert result.finished_at <= rec.starts[node] + config.round_deadline + 1e-9
        assert count_problems(rec, CHUNK) == []


@pytest.mark.parametrize("broadcast", ["tree", "fanout"])
def test_a_lost_ack_and_a_resend_do_not_double_count(broadcast: str) -> None:
    # 3 -> 1 one way: data arrives, every ACK is lost. Relayed down the tree, the resend comes
    # by relay via 4, and the next round remembers the dead link: straight to the relay, no
    # timeout paid again. With the fan-out, the root's result counts 3's units, so they
    # arrived: no timeout at all; the ACKs that did not come mark the link (the dashboard shows
    # it, a drift resync avoids it).
    faults = (FaultSpec("cut", 0, 1, 3, one_way=True),)
    records = run_fleet(7, 2, length=LENGTH, keep_gradients=True,
                        allreduce=fast_config(broadcast=broadcast), faults=faults)
    for rec in records:
        assert_full_mean_everywhere(rec, 7)
        assert count_problems(rec, CHUNK) == []
    if broadcast == "tree":
        assert records[0].results[3].stats.timeouts >= 1
        assert records[1].results[3].stats.timeouts == 0
        assert records[1].results[3].link_states[1] == "failed"
    else:
        assert [r.results[3].stats.timeouts for r in records] == [0, 0]
        assert [r.results[3].link_states[1] for r in records] == ["rerouted", "rerouted"]


def test_a_permanent_cut_costs_one_timeout_once_and_a_healed_link_is_used_again() -> None:
    # Link 1-3 cut both ways as round 1 starts (the tail of round 0 may see it), healed in round 4.
    faults = (FaultSpec("cut", 1, 1, 3), FaultSpec("heal", 4, 1, 3))
    records = run_fleet(7, 7, length=LENGTH, keep_gradients=True, allreduce=fast_config(),
                        faults=faults)
    for rec in records:
        assert_full_mean_everywhere(rec, 7)
        assert count_problems(rec, CHUNK) == []
    timeouts = [rec.results[3].stats.timeouts + rec.results[1].stats.timeouts for rec in records]
    assert sum(timeouts[:2]) >= 1
    assert timeouts[2:4] == [0, 0], "a remembered dead link was timed out again"
    assert [rec.results[3].link_states[1] for rec in records[2:4]] == ["failed", "failed"]
    # Healed: the probe's answer puts the direct link back in use, no relay needed.
    assert [rec.results[3].link_states[1] for rec in records[5:]] == ["ok", "ok"]
    assert [rec.results[4].stats.relays for rec in records[5:]] == [0, 0]
    fault_free = records[0].duration
    assert records[2].duration < fault_free + 0.05, "the remembered cut still costs a timeout"


def test_without_memory_a_permanent_cut_is_detected_again_every_round() -> None:
    faults = (FaultSpec("cut", 1, 1, 3),)
    records = run_fleet(7, 5, length=LENGTH, keep_gradients=True, faults=faults,
                        allreduce=fast_config(remember_dead_links=False))
    for rec in records[2:]:
        assert_full_mean_everywhere(rec, 7)
        assert rec.results[3].stats.timeouts >= 1
        assert rec.duration >= fast_config().fixed_timeout



def test_wire_frames_count_the_formats_units_went_in_not_the_audit_copies() -> None:
    out = Outbox(RoundStats())
    unit = Frame(Kind.DATA, 1, 0, 3, 0, 1, Flag.NONE, origin=3, contributors=frozenset({3}))
    out.send(1, unit.with_values(np.ones(4, np.float32), DType.F32))
    out.send(0, replace(unit, flags=Flag.AUDIT).with_values(np.ones(4, np.float32), DType.I8))
    assert out.stats.wire_frames == {"float32": 1}
    assert out.stats.frames_sent == 2  # sent all the same
