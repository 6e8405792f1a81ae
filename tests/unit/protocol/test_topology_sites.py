"""The site-aware tree: each site reduces inside itself, only site roots cross sites."""

from __future__ import annotations

import itertools

import pytest

from agent.protocol.topology import Tree


def _sites(*blocks: range) -> dict[int, str]:
    return {m: f"s{i}" for i, block in enumerate(blocks) for m in block}


THREE_BY_SEVEN = _sites(range(0, 7), range(7, 14), range(14, 21))


def _cross_site_links(tree: Tree, links: frozenset[tuple[int, int]]) -> set[tuple[int, int]]:
    return {(a, b) for a, b in links if tree.site(a) != tree.site(b)}


def test_each_site_is_a_subtree_under_its_lowest_member() -> None:
    tree = Tree.of(range(21), 2, sites=THREE_BY_SEVEN)
    assert tree.root == 0
    for low, site in ((0, range(0, 7)), (7, range(7, 14)), (14, range(14, 21))):
        assert tree.site_root(low) == low
        assert all(tree.site_root(m) == low for m in site)
        in_site = {m for m in tree.subtree(low) if tree.site(m) == tree.site(low)}
        assert in_site == set(site)
    assert tree.parent(7) == 0 and tree.parent(14) == 0


def test_only_site_roots_are_linked_across_sites() -> None:
    tree = Tree.of(range(21), 2, sites=THREE_BY_SEVEN)
    assert _cross_site_links(tree, tree.tree_links()) == {(0, 7), (0, 14)}
    # backups stay in the site; a site root's backup is another site root
    assert _cross_site_links(tree, tree.backup_links()) == {(7, 14)}
    for m in range(21):
        assert all(tree.site(b) == tree.site(m) or tree.site_root(m) == m for b in tree.backups(m))


def test_site_blind_tree_crosses_sites_on_many_links() -> None:
    blind = Tree.of(range(21), 2)
    crossing = {(a, b) for a, b in blind.tree_links() if THREE_BY_SEVEN[a] != THREE_BY_SEVEN[b]}
    assert len(crossing) > 2  # what the site-aware tree avoids


def test_the_coordinator_roots_its_own_site_and_the_tree() -> None:
    tree = Tree.of([1, 2, 3, 4, 5, 6], 2, root=4, sites=_sites(range(0, 3), range(3, 7)))
    assert tree.root == 4 and tree.site_root(3) == 4
    assert tree.parent(1) == 4  # the other site's root (its lowest live member) hangs below
    assert tree.parent(3) == 4 and tree.site_root(2) == 1


def test_a_failed_site_root_is_replaced_from_its_own_site() -> None:
    members = [m for m in range(21) if m != 7]
    tree = Tree.of(members, 2, sites=THREE_BY_SEVEN)
    assert tree.parent(8) == 0 and tree.site(8) == "s1"
    assert {m for m in tree.subtree(8) if tree.site(m) == "s1"} == set(range(8, 14))
    assert _cross_site_links(tree, tree.tree_links()) == {(0, 8), (0, 14)}


@pytest.mark.parametrize("arity,nodes,sites", [(2, 21, 3), (3, 12, 4), (2, 5, 5), (4, 30, 2)])
def test_every_member_has_one_parent_and_the_tree_is_whole(arity: int, nodes: int, sites: int) -> None:
    site_of = {m: f"s{m % sites}" for m in range(nodes)}  # sites interleaved by id
    tree = Tree.of(range(nodes), arity, sites=site_of)
    assert sorted(tree.members) == list(range(nodes))
    assert tree.subtree(tree.root) == frozenset(range(nodes))
    assert all(tree.parent(c) == m for m in range(nodes) for c in tree.children(m))
    site_roots = {tree.site_root(m) for m in range(nodes)}
    assert len(site_roots) == sites
    cross = _cross_site_links(tree, tree.tree_links())
    assert all(a in site_roots and b in site_roots for a, b in cross)
    assert len(cross) == sites - 1


def test_escalation_reaches_the_root_from_every_member() -> None:
    tree = Tree.of(range(21), 2, sites=THREE_BY_SEVEN)
    for m in range(1, 21):
        order = tree.escalation(m)
        assert order[0] == tree.parent(m) and 0 in order
        assert len(order) == len(set(order))


def test_without_sites_the_heap_layout_is_unchanged() -> None:
    for n, k in itertools.product((1, 2, 7, 15), (2, 3)):
        tree = Tree.of(range(n), k)
        for m in range(1, n):
            assert tree.parent(m) == (m - 1) // k
        assert tree.members == tuple(range(n))
