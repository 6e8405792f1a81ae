"""What every piece of one FT-tree round reads: the round's context, the facts derived from its
tree, what membership said about peers this round, and the outbox all pieces write to.

The context stays one object (``ctx``): a piece asks the scope for the config, the tree or the
link estimators rather than keeping its own copy.
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import replace

import numpy as np

from agent.protocol.allreduce import (
    AllreduceConfig,
    LinkBook,
    Outbox,
    RoundContext,
    RoundStats,
    chunk_bounds,
)
from agent.protocol.answer_budget import values_frame_bytes
from agent.protocol.chunking import cross_site_timeout
from agent.protocol.rto import LinkEstimators
from agent.protocol.topology import Tree
from agent.protocol.wire import HEADER_SIZE, NO_NODE, Flag, Frame, Kind, value_bytes


class Hop(enum.StrEnum):
    """How a unit travels, or how it came to us."""

    DIRECT = "direct"  # straight over the link to its peer
    RELAY = "relay"  # through a backup neighbour
    FLOOD = "flood"  # over every live link of the FT graph


class RoundScope:
    def __init__(self, ctx: RoundContext) -> None:
        self.ctx = ctx
        # Adaptive timeouts (not fixed ones): asked by every timer computation, so kept here.
        self.adaptive = ctx.config.timeout_mode != "fixed"
        tree, node = ctx.tree, ctx.node
        self.parent = tree.parent(node)
        self.children = tree.children(node)
        self.subtree = tree.subtree(node)
        self.neighbours = sorted(tree.neighbours(node))
        self.bounds = chunk_bounds(len(ctx.gradient), ctx.config.chunk_size)
        self.n = len(self.bounds)
        # Bytes of the largest DATA frame of this round (its transmission time counts in waits).
        self.unit_bytes = HEADER_SIZE + max(hi - lo for lo, hi in self.bounds) * value_bytes(ctx.config.wire_dtype)
        vector_bytes = len(ctx.gradient) * value_bytes(ctx.config.wire_dtype)
        self.cross_site_floor = cross_site_timeout(vector_bytes, ctx.config.max_timeout)
        self.stats = RoundStats()
        self.book = LinkBook()
        self.book.known(self.neighbours)
        self.out = Outbox(self.stats)  # what this round's pieces queue: frames, notes
        # Membership, this round: peers known offline, and peers whose Will came and that are
        # given a moment to come back.
        self.down: set[int] = set()
        self.away: set[int] = set()
        # Peers whose direct link from here is dead this round (or, remembered, since an
        # earlier round: those are probed and healed by a round trip).
        self.dead: set[int] = set()
        # Members whose contribution we still wait for (shrinks on excuses and departures).
        self.expected: set[int] = set(self.subtree)
        # The root's model hash: ours at the root, the root's from its first result frame.
        self.root_hash: int | None = ctx.model_hash if self.parent is None else None
        # Backups this node itself made carriers of this round's result: peers it pulled the
        # result from, relays its own units went up through (see ``result_carriers``).
        self.carriers: set[int] = set()

    # ------------------------------------------------------------------ the context

    @property
    def cfg(self) -> AllreduceConfig:
        return self.ctx.config

    @cfg.setter
    def cfg(self, config: AllreduceConfig) -> None:
        self.ctx = replace(self.ctx, config=config)
        self.adaptive = config.timeout_mode != "fixed"

    @property
    def tree(self) -> Tree:
        return self.ctx.tree

    @property
    def node(self) -> int:
        return self.ctx.node

    @property
    def round(self) -> int:
        return self.ctx.round

    @property
    def grad(self) -> np.ndarray:
        return self.ctx.gradient

    @property
    def links(self) -> LinkEstimators:
        return self.ctx.links

    @property
    def start_time(self) -> float:
        return self.ctx.now

    # ------------------------------------------------------------------ shared helpers

    def rto(self, peer: int | None) -> float:
        if not self.adaptive:
            return self.ctx.config.fixed_timeout
        base = self.ctx.links.rto(-1 if peer is None else peer)
        if peer is None or not self._across_sites(peer):
            return base
        return max(base, self.cross_site_floor)

    def _across_sites(self, peer: int) -> bool:
        mine = self.tree.site(self.node)
        return bool(mine) and self.tree.site(peer) not in ("", mine)

    def transmit(self, peer: int, nbytes: int) -> float:
        """Seconds ``nbytes`` take on the link to ``peer`` (0 with fixed timeouts)."""
        if not self.adaptive:
            return 0.0
        return self.ctx.links.transmit_time(peer, nbytes)

    def arrival(self, peer: int, nbytes: int, sharing: int = 1, headroom: bool = True) -> float:
        """Seconds ``nbytes`` from ``peer`` take to reach us while ``sharing`` peers send us as
        much (0 with fixed timeouts); ``headroom``: as timers count a rate (see rto.py)."""
        if not self.adaptive:
            return 0.0
        return self.ctx.links.arrival_time(peer, nbytes, sharing, headroom)

    def result_carriers(self) -> set[int]:
        """Backups that may bring us this round's result (``result_source``): those we made
        carriers, and all of them once our parent is lost to us (down, its Will in, or our
        link to it dead): then the result comes around it."""
        if self.parent is not None and self.parent in self.down | self.away | self.dead:
            return self.carriers | set(self.tree.backups(self.node))
        return self.carriers

    def result_bytes(self, chunks: Collection[int]) -> int:
        """Bytes of the result frames of ``chunks`` at most (in the round's widest format,
        every member counted): what a pull of them pays for (answer_budget.py)."""
        item, top = value_bytes(self.cfg.wire_dtype), max(self.tree.members)
        return sum(values_frame_bytes(hi - lo, item, top) for lo, hi in (self.bounds[j] for j in chunks))

    def frame(self, kind: Kind, j: int, flags: Flag, ids: frozenset[int], target: int = NO_NODE) -> Frame:
        return Frame(kind, self.cfg.job, self.round, self.node, j, self.n, flags,
                     origin=self.node, target=target, model_hash=self.root_hash or 0,
                     contributors=ids)



class UnitSource(enum.Enum):
    """Whether a reduce unit may come to ``node`` as it did (``unit_source``)."""

    BELOW = "below"  # from below us, its contributors within its origin's subtree: weighed
    NOT_OURS = "not_ours"  # nothing, us, or an origin not below us (a stale tree's): dropped
    OUTSIDE_SUBTREE = "outside_subtree"  # contributors beyond its origin's subtree: refused
    RELAY_NOT_A_BACKUP = "relay_not_a_backup"  # relayed by a node its origin never relays by


def unit_source(tree: Tree, node: int, frame: Frame, how: Hop) -> UnitSource:
    """A unit speaks for its origin's subtree in this round's tree, no more (one that claimed
    {1, 2, 3} from node 1 was counted by the root); relayed, it comes through a backup of its
    origin (its uplink's only relays). A flood may come over any link: its origin's claim is
    checked, its path cannot be."""
    ids, origin = frame.contributors, frame.origin
    if not ids or node in ids or origin == node or origin not in tree or node not in tree:
        return UnitSource.NOT_OURS
    if node not in tree.ancestors(origin):
        return UnitSource.NOT_OURS
    if not ids <= tree.subtree(origin):
        return UnitSource.OUTSIDE_SUBTREE
    if how == Hop.RELAY and frame.sender not in tree.backups(origin):
        return UnitSource.RELAY_NOT_A_BACKUP
    return UnitSource.BELOW


class ResultSource(enum.Enum):
    """Whether a round's result may come to a node from where it did (``result_source``)."""

    ABOVE = "above"  # the root's path (our ancestors), or a backup that carries it to us: taken
    ELSEWHERE = "elsewhere"  # anyone else: refused
    BACKUP_NOT_ROUTED = "backup_not_routed"  # a backup nothing we know of made carry it: refused


def result_source(tree: Tree, node: int, frame: Frame, carriers: Collection[int]) -> ResultSource:
    """A round's result comes down the root's path: from our ancestors, directly. A backup
    (a sibling, an uncle) carries it only when our own knowledge says so this round: we
    pulled from it, our units went up through it, or our parent is lost to us (see
    ``RoundScope.result_carriers``); both the frame's origin and its last hop must be such.
    Results sent by a node off every route were taken (the victim's model differed in 139 of
    150 rounds), and so were a sibling's that nobody asked for (189 of 200)."""
    if node not in tree:
        return ResultSource.ELSEWHERE
    ancestors = set(tree.ancestors(node))
    backups = set(tree.backups(node)) - ancestors
    hops = {frame.sender, frame.origin}
    if not hops <= ancestors | backups:
        return ResultSource.ELSEWHERE
    if not hops & backups <= set(carriers):
        return ResultSource.BACKUP_NOT_ROUTED
    return ResultSource.ABOVE


def flood_key(frame: Frame) -> tuple[object, ...]:
    """What identifies one flooded frame, whichever neighbour passed it on."""
    return (frame.kind, frame.is_broadcast, frame.origin, frame.target, frame.chunk_index,
            frame.contributors)


def latest(*times: float | None) -> float | None:
    """The latest of ``times`` that are known (None: never)."""
    known = [t for t in times if t is not None]
    return max(known) if known else None

