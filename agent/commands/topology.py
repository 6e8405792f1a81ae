"""`edgegrove topology`: the allreduce tree of N live members, with its backup links.

Members are the ids 0..N-1 (or those given with --members), sorted, in heap order. Each
node's backup link goes to its next sibling, or to its uncle when it has no sibling; the
root has none. The escalation chain is whom a node tries, in order, when its parent is
silent: parent, backup(s), grandparent, ... root.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from agent.protocol.topology import Tree

DESCRIPTION = __doc__
MAX_NODES = 1024  # node ids on the wire are 0..1023


def add_arguments(parser: argparse.ArgumentParser) -> None:
    who = parser.add_mutually_exclusive_group(required=True)
    who.add_argument("--nodes", type=int, help="number of live members; ids are 0..N-1")
    who.add_argument("--members", type=int, nargs="+", metavar="ID",
                     help="explicit live member ids (any order; they are sorted)")
    parser.add_argument("--arity", type=int, default=2, help="children per node (k of the k-ary tree)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON document: per node parent/children/backup/escalation, and the link list")


def _members(args: argparse.Namespace) -> tuple[int, ...] | str:
    """The member ids, or a message saying what is wrong with the options."""
    if args.members is not None:
        ids = tuple(sorted(set(args.members)))
        if any(not 0 <= i < MAX_NODES for i in ids):
            return f"--members: ids must be in 0..{MAX_NODES - 1}"
        return ids
    if not 1 <= args.nodes <= MAX_NODES:
        return f"--nodes must be between 1 and {MAX_NODES}, got {args.nodes}"
    return tuple(range(args.nodes))


def describe(tree: Tree) -> dict[str, Any]:
    """The JSON document of a tree (also used by the dashboard and simulator reports)."""
    nodes = {
        str(m): {
            "position": tree.position(m),
            "depth": tree.depth(m),
            "parent": tree.parent(m),
            "children": list(tree.children(m)),
            "backup": tree.backup(m),
            "backups": list(tree.backups(m)),
            "escalation": list(tree.escalation(m)),
        }
        for m in tree.members
    }
    return {
        "members": list(tree.members),
        "arity": tree.arity,
        "root": tree.root,
        "height": tree.height,
        "tree_links": sorted([list(e) for e in tree.tree_links()]),
        "backup_links": sorted([list(e) for e in tree.backup_links()]),
        "links": sorted([list(e) for e in tree.links()]),
        "link_counts": {"tree": len(tree.tree_links()), "backup": len(tree.backup_links()),
                        "total": len(tree.links())},
        "nodes": nodes,
    }


def _text(tree: Tree) -> str:
    lines = [tree.render(), ""]
    lines.append(f"nodes {len(tree)}, arity {tree.arity}, height {tree.height}")
    lines.append(f"links: {len(tree.tree_links())} tree + {len(tree.backup_links())} backup "
                 f"= {len(tree.links())} in the FT graph")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    members = _members(args)
    if isinstance(members, str):
        print(f"edgegrove topology: {members}", file=sys.stderr)
        return 2
    if args.arity < 2:
        print(f"edgegrove topology: --arity must be >= 2, got {args.arity}", file=sys.stderr)
        return 2
    tree = Tree(members, args.arity)
    print(json.dumps(describe(tree), indent=2) if args.json else _text(tree))
    return 0
