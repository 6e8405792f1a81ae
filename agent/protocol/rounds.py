"""The machine of one round for the configured algorithm (its own module: the machines import
allreduce.py's shared parts, and this picks among them), and whom its rounds cannot do without."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from agent.protocol.allreduce import Algorithm, RoundContext, RoundMachine
from agent.protocol.ft_tree import FtTreeRound
from agent.protocol.ps_async import PsAsyncRound
from agent.protocol.ps_sync import PsSyncRound
from agent.protocol.ring import RingRound
from agent.protocol.rps import RpsRound
from agent.protocol.tree import PlainTreeRound


def new_round(ctx: RoundContext) -> RoundMachine:
    """The machine of one round for ``ctx.config.algorithm``; call ``start(now)`` next."""
    if ctx.node not in ctx.tree:
        raise ValueError(f"node {ctx.node} is not a member of the round's tree {ctx.tree.members}")
    ctx = replace(ctx, gradient=np.ascontiguousarray(ctx.gradient, dtype=np.float32).ravel())
    return MACHINES[ctx.config.algorithm](ctx)


MACHINES: dict[Algorithm, Callable[[RoundContext], RoundMachine]] = {
    Algorithm.FT_TREE: FtTreeRound,
    Algorithm.TREE: PlainTreeRound,
    Algorithm.RPS: RpsRound,
    Algorithm.PS_SYNC: PsSyncRound,
    Algorithm.PS_ASYNC: PsAsyncRound,
    Algorithm.RING: RingRound,
}


def indispensable(algorithm: Algorithm, members: Sequence[int], root: int) -> frozenset[int]:
    """The members without whom no round of the view ``members`` (its tree rooted at ``root``)
    can finish: every member of a ring (each segment passes them all, and nothing routes
    around one), the root of any other (it averages, serves or starts the broadcast). While
    one of them is down the core starts no round of that view: it waits for the view without
    it (rather than skip round after round, racing ahead of a fleet that cannot follow)."""
    return frozenset(members) if algorithm == Algorithm.RING else frozenset({root})


def root_finishes_first(algorithm: Algorithm) -> bool:
    """Whether a round's result leaves from the view's root and nobody starts the next round
    before it: the trees' (a ring's members finish together, ps-async has no rounds in step)."""
    return algorithm in (Algorithm.FT_TREE, Algorithm.TREE)


def server_holds_the_state(algorithm: Algorithm) -> bool:
    """Whether only the server (the coordinator) holds the fleet's state: under ps-async each
    worker's model lags the server's by its own updates in flight, so no two members agree
    and a state striped over two of them never assembles. A joiner then fetches the whole
    state from the server alone (vouched for by the digest the server announces), and the
    server sends it whole."""
    return algorithm == Algorithm.PS_ASYNC
