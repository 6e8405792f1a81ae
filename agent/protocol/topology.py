"""The allreduce tree of a view: live member ids in a complete k-ary tree, heap order.

Besides its tree links every node has backup links: its siblings (the next one first,
cyclically), or its uncle when it has no sibling. The root has only its child links,
as in the thesis. ``links()`` is the graph of all of them (tree + primary backup).

With ``sites`` (member -> site name) the tree knows the sites: each site's members form a
k-ary subtree of their own under their site root (the site's lowest id; the tree's root for
its own site), and the site roots form a k-ary tree of their own above them, in the order of
their lowest ids. So a round crosses sites only between site roots: one vector per site and
direction. A node's backups stay in its own site (a site root's are other site roots); only
escalation past a silent parent and backups reaches the next site up.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property


def _edge(a: int, b: int) -> tuple[int, int]:
    return (a, b) if a < b else (b, a)


def _heap(ids: tuple[int, ...], arity: int) -> dict[int, tuple[int, ...]]:
    """Children of each of ``ids`` in a complete k-ary tree in that (heap) order."""
    return {m: ids[p * arity + 1: p * arity + 1 + arity] for p, m in enumerate(ids)}


def site_layout(ids: tuple[int, ...], arity: int, site_of: Mapping[int, str]) -> dict[int, tuple[int, ...]]:
    """Children of each member when the tree knows the sites: ``ids[0]`` is the root and its
    site's root; every other site's root is its lowest member."""
    groups: dict[str, list[int]] = {}
    for m in ids:  # ids[0] first: its site comes first, then sites by their lowest id
        groups.setdefault(site_of.get(m, ""), []).append(m)
    site_roots = tuple(g[0] for g in groups.values())
    children = {m: list(kids) for m, kids in _heap(site_roots, arity).items()}
    for group in groups.values():
        for m, kids in _heap(tuple(group), arity).items():
            children.setdefault(m, [])
            children[m] = [*kids, *children[m]]  # in-site children first, then site roots
    return {m: tuple(kids) for m, kids in children.items()}


@dataclass(frozen=True)
class Tree:
    """``members`` in heap order by id, except ``first`` (when given), which is the root.
    With ``sites`` ((member, site) pairs), the site-aware layout of ``site_layout``;
    ``members`` is then in breadth-first order of that tree."""

    members: tuple[int, ...]
    arity: int = 2
    first: int | None = None
    sites: tuple[tuple[int, str], ...] = ()
    _pos: dict[int, int] = field(init=False, repr=False, compare=False)
    _children: dict[int, tuple[int, ...]] = field(init=False, repr=False, compare=False)
    _parent: dict[int, int] = field(init=False, repr=False, compare=False)
    _site: dict[int, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ids = tuple(sorted(set(self.members)))
        if self.first is not None and self.first in ids:
            ids = (self.first, *(m for m in ids if m != self.first))
        if not ids:
            raise ValueError("a tree needs at least one member")
        if self.arity < 2:
            raise ValueError(f"arity must be >= 2, got {self.arity}")
        site_of = {m: s for m, s in self.sites if m in ids}
        children = site_layout(ids, self.arity, site_of) if site_of else _heap(ids, self.arity)
        order = [ids[0]]
        for m in order:  # breadth first: the heap order when the tree ignores sites
            order.extend(children[m])
        object.__setattr__(self, "members", tuple(order))
        object.__setattr__(self, "sites", tuple(sorted(site_of.items())))
        object.__setattr__(self, "_pos", {m: p for p, m in enumerate(order)})
        object.__setattr__(self, "_children", children)
        object.__setattr__(self, "_parent", {c: m for m, kids in children.items() for c in kids})
        object.__setattr__(self, "_site", site_of)

    @classmethod
    def of(cls, members: Iterable[int], arity: int = 2, root: int | None = None,
           sites: Mapping[int, str] | None = None) -> Tree:
        return cls(tuple(members), arity, root, tuple(sorted((sites or {}).items())))

    def __len__(self) -> int:
        return len(self.members)

    def __contains__(self, node: object) -> bool:
        return node in self._pos

    @property
    def root(self) -> int:
        return self.members[0]

    def position(self, node: int) -> int:
        try:
            return self._pos[node]
        except KeyError:
            raise KeyError(f"node {node} is not a member of {self.members}") from None

    def parent(self, node: int) -> int | None:
        self.position(node)
        return self._parent.get(node)

    def children(self, node: int) -> tuple[int, ...]:
        self.position(node)
        return self._children[node]

    def site(self, node: int) -> str:
        """The node's site ("" when the tree does not know the sites)."""
        return self._site.get(node, "")

    def site_root(self, node: int) -> int:
        """The root of the node's site: the highest ancestor (or itself) in its site."""
        top = node
        while (parent := self._parent.get(top)) is not None and self.site(parent) == self.site(node):
            top = parent
        return top

    def siblings(self, node: int) -> tuple[int, ...]:
        """The other children of this node's parent, starting after it, cyclically; with
        sites, those on the node's side only (its parent's site, or the other site roots)."""
        parent = self.parent(node)
        if parent is None:
            return ()
        inside = self.site(node) == self.site(parent)
        group = tuple(c for c in self.children(parent) if (self.site(c) == self.site(parent)) == inside)
        i = group.index(node)
        return group[i + 1 :] + group[:i]

    def uncles(self, node: int) -> tuple[int, ...]:
        parent = self.parent(node)
        if parent is None:
            return ()
        if self.site(node) != self.site(parent):
            return self.siblings(parent)  # a site root: the other site roots
        return tuple(u for u in self.siblings(parent) if self.site(u) == self.site(node))

    def backups(self, node: int) -> tuple[int, ...]:
        """Backup links in the order a sender tries them: siblings, else the first uncle."""
        sibs = self.siblings(node)
        if sibs:
            return sibs
        uncles = self.uncles(node)
        return uncles[:1]

    def backup(self, node: int) -> int | None:
        backups = self.backups(node)
        return backups[0] if backups else None

    def ancestors(self, node: int) -> tuple[int, ...]:
        """Parent, grandparent, ..., root."""
        chain: list[int] = []
        parent = self.parent(node)
        while parent is not None:
            chain.append(parent)
            parent = self.parent(parent)
        return tuple(chain)

    def escalation(self, node: int) -> tuple[int, ...]:
        """Whom to try, in order, when the parent is silent: parent, backups, then the
        grandparent and further ancestors up to the root (no repeats)."""
        order: list[int] = []
        ancestors = self.ancestors(node)
        for peer in (*ancestors[:1], *self.backups(node), *ancestors[1:]):
            if peer not in order:
                order.append(peer)
        return tuple(order)

    def depth(self, node: int) -> int:
        return len(self.ancestors(node))

    @property
    def height(self) -> int:
        return self.depth(self.members[-1])

    def subtree(self, node: int) -> frozenset[int]:
        out: set[int] = set()
        stack = [node]
        while stack:
            n = stack.pop()
            out.add(n)
            stack.extend(self.children(n))
        return frozenset(out)

    def tree_links(self) -> frozenset[tuple[int, int]]:
        return frozenset(
            _edge(m, p) for m in self.members if (p := self.parent(m)) is not None
        )

    def backup_links(self) -> frozenset[tuple[int, int]]:
        return frozenset(
            _edge(m, b) for m in self.members if (b := self.backup(m)) is not None
        )

    @cached_property
    def _all_links(self) -> frozenset[tuple[int, int]]:
        return self.tree_links() | self.backup_links()

    def links(self) -> frozenset[tuple[int, int]]:
        """Every undirected link of the FT-tree graph, as (low id, high id)."""
        return self._all_links

    def neighbours(self, node: int) -> frozenset[int]:
        return frozenset(b if a == node else a for a, b in self.links() if node in (a, b))

    def render(self) -> str:
        """Indented text drawing, one node a line, with its backup link."""
        lines: list[str] = []

        def walk(node: int, indent: str) -> None:
            backup = self.backup(node)
            note = f"   (backup -> {backup})" if backup is not None else ""
            lines.append(f"{indent}{node}{note}")
            for child in self.children(node):
                walk(child, indent + "    ")

        walk(self.root, "")
        return "\n".join(lines)
