"""The allreduce tree of a view: live member ids in a complete k-ary tree, heap order.

Besides its tree links every node has backup links: its siblings (the next one first,
cyclically), or its uncle when it has no sibling. The root has only its child links,
as in the thesis. ``links()`` is the graph of all of them (tree + primary backup).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property


def _edge(a: int, b: int) -> tuple[int, int]:
    return (a, b) if a < b else (b, a)


@dataclass(frozen=True)
class Tree:
    """``members`` in heap order by id, except ``first`` (when given), which is the root."""

    members: tuple[int, ...]
    arity: int = 2
    first: int | None = None
    _pos: dict[int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ids = tuple(sorted(set(self.members)))
        if self.first is not None and self.first in ids:
            ids = (self.first, *(m for m in ids if m != self.first))
        if not ids:
            raise ValueError("a tree needs at least one member")
        if self.arity < 2:
            raise ValueError(f"arity must be >= 2, got {self.arity}")
        object.__setattr__(self, "members", ids)
        object.__setattr__(self, "_pos", {m: p for p, m in enumerate(ids)})

    @classmethod
    def of(cls, members: Iterable[int], arity: int = 2, root: int | None = None) -> Tree:
        return cls(tuple(members), arity, root)

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
        pos = self.position(node)
        return None if pos == 0 else self.members[(pos - 1) // self.arity]

    def children(self, node: int) -> tuple[int, ...]:
        first = self.position(node) * self.arity + 1
        return self.members[first : first + self.arity]

    def siblings(self, node: int) -> tuple[int, ...]:
        """The other children of this node's parent, starting after it, cyclically."""
        parent = self.parent(node)
        if parent is None:
            return ()
        group = self.children(parent)
        i = group.index(node)
        return group[i + 1 :] + group[:i]

    def uncles(self, node: int) -> tuple[int, ...]:
        parent = self.parent(node)
        return () if parent is None else self.siblings(parent)

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
