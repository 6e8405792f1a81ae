"""The Figure-11 analysis: deterministic, consistent with exact enumeration and with a
naive step-by-step simulation, and showing the trends the thesis reports."""

from __future__ import annotations

import numpy as np
import pytest

from agent.protocol.isolation import (
    exact_mean_failed,
    failed_links_until_isolation,
    full_tree,
    full_tree_size,
    isolation,
    isolation_table,
)
from agent.protocol.topology import Tree


def naive_failed_links(tree: Tree, order: list[tuple[int, int]]) -> int:
    """Remove links in this order, one at a time, until a node has no link left."""
    degree = {m: len(tree.neighbours(m)) for m in tree.members}
    for removed, (a, b) in enumerate(order, start=1):
        degree[a] -= 1
        degree[b] -= 1
        if degree[a] == 0 or degree[b] == 0:
            return removed
    raise AssertionError("every link removed and nobody isolated")


def test_full_tree_sizes() -> None:
    assert [full_tree_size(h, 2) for h in range(7)] == [1, 3, 7, 15, 31, 63, 127]
    assert full_tree_size(2, 3) == 13
    assert full_tree(2).members == tuple(range(7)) and full_tree(2).height == 2
    with pytest.raises(ValueError, match="height"):
        full_tree_size(-1, 2)
    with pytest.raises(ValueError, match="nodes"):
        full_tree(40, 2)


def test_same_seed_same_results_other_seed_other_results() -> None:
    first = isolation_table([2, 3, 4], 2, 500, np.random.default_rng(7))
    again = isolation_table([2, 3, 4], 2, 500, np.random.default_rng(7))
    other = isolation_table([2, 3, 4], 2, 500, np.random.default_rng(8))
    assert first == again
    assert [r.mean_failed for r in first] != [r.mean_failed for r in other]


def test_the_triangle_always_isolates_at_the_second_failure() -> None:
    result = isolation(1, 2, 200, np.random.default_rng(0))
    assert (result.nodes, result.links) == (3, 3)
    assert result.mean_failed == result.min_failed == result.max_failed == 2
    assert result.exact_mean_failed == 2.0


def test_exact_enumeration_agrees_with_the_naive_loop_on_7_nodes() -> None:
    # 9 links; P(T > t) = (t-subsets isolating nobody) / C(9, t). Nobody is isolated after
    # one failure, so E[T] > 2; a naive removal loop over random orders agrees.
    tree = full_tree(2)
    exact = exact_mean_failed(tree)
    rng = np.random.default_rng(1)
    links = sorted(tree.links())
    naive = np.mean([naive_failed_links(tree, [links[i] for i in rng.permutation(len(links))])
                     for _ in range(4000)])
    assert 2 < exact < 9
    assert abs(naive - exact) < 0.1  # std is ~1.15: 4000 samples give a standard error ~0.02


@pytest.mark.parametrize("height", [2, 3])
def test_monte_carlo_agrees_with_exact_enumeration(height: int) -> None:
    result = isolation(height, 2, 20_000, np.random.default_rng(3))
    assert result.exact_mean_failed is not None
    standard_error = result.std_failed / np.sqrt(result.trials)
    assert abs(result.mean_failed - result.exact_mean_failed) < 5 * standard_error


def test_vectorized_trials_match_the_naive_removal_loop() -> None:
    # Same distribution: compare means of two independent estimators on a bigger tree.
    tree = full_tree(4)
    fast = failed_links_until_isolation(tree, 4000, np.random.default_rng(5))
    rng = np.random.default_rng(6)
    links = sorted(tree.links())
    slow = [naive_failed_links(tree, [links[i] for i in rng.permutation(len(links))])
            for _ in range(1500)]
    error = np.hypot(fast.std() / np.sqrt(fast.size), np.std(slow) / np.sqrt(len(slow)))
    assert abs(fast.mean() - np.mean(slow)) < 5 * error


def test_thesis_trends_count_rises_and_fraction_falls_with_height() -> None:
    results = isolation_table([2, 3, 4, 5, 6], 2, 2000, np.random.default_rng(0))
    counts = [r.mean_failed for r in results]
    fractions = [r.mean_fraction for r in results]
    assert counts == sorted(counts) and len(set(counts)) == len(counts)
    assert fractions == sorted(fractions, reverse=True) and len(set(fractions)) == len(fractions)
    for r in results:
        assert 0 < r.mean_fraction < 1
        assert r.links == 3 * (2**r.height - 1)
        assert r.min_failed >= 2  # the FT graph has no bridge and no node of degree 1
        assert r.max_failed < r.links
        assert r.mean_fraction == pytest.approx(r.mean_failed / r.links)


def test_other_arities_work_too() -> None:
    result = isolation(2, 3, 1000, np.random.default_rng(0))
    assert result.nodes == 13 and 0 < result.mean_fraction < 1
    assert result.exact_mean_failed is None  # 24 links: too many to enumerate


def test_bad_arguments_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="trials"):
        failed_links_until_isolation(full_tree(2), 0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="no links"):
        failed_links_until_isolation(full_tree(0), 10, np.random.default_rng(0))
    with pytest.raises(ValueError, match="enumerate"):
        exact_mean_failed(full_tree(4))
