"""Properties of the FT-tree topology, for any member set and arity."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.protocol.topology import Tree

member_sets = st.sets(st.integers(0, 1023), min_size=1, max_size=80)
arities = st.integers(2, 5)


def _connected(nodes: tuple[int, ...], links: frozenset[tuple[int, int]]) -> bool:
    adjacent: dict[int, set[int]] = {n: set() for n in nodes}
    for a, b in links:
        adjacent[a].add(b)
        adjacent[b].add(a)
    seen = {nodes[0]}
    queue = deque([nodes[0]])
    while queue:
        for peer in adjacent[queue.popleft()] - seen:
            seen.add(peer)
            queue.append(peer)
    return seen == set(nodes)


def expected_link_count(n: int, k: int) -> int:
    """Tree links n-1; backup links: a sibling group of 2 shares one link, a group of g >= 3
    is a ring of g links; an only child (not of the root) has one link to its uncle."""
    groups = [min(k, n - first) for first in range(1, n, k)]
    backup = sum(1 if g == 2 else g if g >= 3 else 0 for g in groups)
    lone_child_of_non_root = groups and groups[-1] == 1 and n - 1 > k
    return n - 1 + backup + (1 if lone_child_of_non_root else 0)


@given(member_sets, arities)
def test_heap_order_parent_and_children(members: set[int], k: int) -> None:
    tree = Tree.of(members, k)
    ordered = sorted(members)
    assert tree.members == tuple(ordered)
    assert tree.root == ordered[0]
    assert tree.parent(tree.root) is None
    for pos, node in enumerate(ordered[1:], start=1):
        assert tree.parent(node) == ordered[(pos - 1) // k]
        assert node in tree.children(tree.parent(node))  # type: ignore[arg-type]
    # Every non-root node is the child of exactly one node.
    child_lists = [c for m in ordered for c in tree.children(m)]
    assert sorted(child_lists) == ordered[1:]
    assert all(len(tree.children(m)) <= k for m in ordered)


@given(member_sets, arities)
def test_backups_are_siblings_else_one_uncle_and_root_has_none(members: set[int], k: int) -> None:
    tree = Tree.of(members, k)
    assert tree.backup(tree.root) is None and tree.backups(tree.root) == ()
    for node in tree.members[1:]:
        parent = tree.parent(node)
        assert parent is not None
        siblings = set(tree.children(parent)) - {node}
        backups = tree.backups(node)
        assert node not in backups and parent not in backups
        if siblings:
            assert set(backups) == siblings
        elif parent == tree.root:
            assert backups == ()  # the root's only child: nobody else to ask
        else:
            grandparent = tree.parent(parent)
            assert grandparent is not None
            assert len(backups) == 1
            assert backups[0] in tree.children(grandparent) and backups[0] != parent


@given(member_sets, arities)
def test_escalation_climbs_to_the_root_without_repeats(members: set[int], k: int) -> None:
    tree = Tree.of(members, k)
    assert tree.escalation(tree.root) == ()
    for node in tree.members[1:]:
        chain = tree.escalation(node)
        ancestors = tree.ancestors(node)
        assert len(chain) == len(set(chain)), "no repeats"
        assert node not in chain
        assert chain[0] == tree.parent(node)
        assert tree.root in chain
        assert chain == (ancestors[0], *tree.backups(node), *ancestors[1:])
        if tree.depth(node) >= 2:
            assert chain[-1] == tree.root  # the chain ends at the root
        # The parent and the primary backup are links of the FT graph (further siblings
        # of a k >= 3 group are extra tries, not links of the graph).
        primary = tree.backup(node)
        assert primary is None or primary in tree.neighbours(node)
        assert chain[0] in tree.neighbours(node)


@given(member_sets, arities)
def test_ft_graph_is_connected_and_survives_any_single_link_cut(members: set[int], k: int) -> None:
    tree = Tree.of(members, k)
    links = tree.links()
    assert tree.tree_links() <= links
    assert all(a < b and a in tree and b in tree for a, b in links)
    assert _connected(tree.members, links)
    if len(tree) >= 3:  # with a backup link somewhere, no link is a bridge
        for link in links:
            assert _connected(tree.members, links - {link}), f"{link} is a bridge"


@settings(max_examples=60)
@given(st.integers(1, 300), arities)
def test_link_counts(n: int, k: int) -> None:
    tree = Tree.of(range(n), k)
    assert len(tree.tree_links()) == n - 1
    assert len(tree.links()) == expected_link_count(n, k)


@pytest.mark.parametrize("height", range(1, 9))
def test_full_binary_tree_has_three_links_per_internal_node(height: int) -> None:
    # Full binary tree of height h: 2^(h+1)-1 nodes, 2^(h+1)-2 tree links, and one sibling
    # link per internal node (2^h - 1 of them): 3 (2^h - 1) links in all.
    tree = Tree.of(range(2 ** (height + 1) - 1), 2)
    assert tree.height == height
    assert len(tree.links()) == 3 * (2**height - 1)


def test_thesis_figure_10_tree() -> None:
    # The thesis's 7-node example: node 3 hangs on its parent 1 and its sibling 4 only.
    tree = Tree.of(range(7))
    assert tree.neighbours(3) == {1, 4}
    assert tree.neighbours(0) == {1, 2}
    assert tree.render().splitlines()[0] == "0"
    assert "3   (backup -> 4)" in tree.render()


def test_uncle_backup_for_an_only_child() -> None:
    tree = Tree.of([10, 20, 30, 40, 50, 60])  # 60 is the only child of 30
    assert tree.children(30) == (60,)
    assert tree.backups(60) == (20,)
    assert tree.escalation(60) == (30, 20, 10)


@pytest.mark.parametrize(("members", "arity"), [((), 2), ((1, 2), 1)])
def test_invalid_trees_are_refused_with_a_message(members: tuple[int, ...], arity: int) -> None:
    with pytest.raises(ValueError, match=r"member|arity"):
        Tree(members, arity)


def test_unknown_node_names_itself() -> None:
    with pytest.raises(KeyError, match="not a member"):
        Tree.of([1, 2, 3]).parent(9)
