"""A link to another site waits at least the drain of a few vectors on the uplinks: its ACKs
queue behind the whole site's traffic there (a rejoining site's state transfers)."""

from __future__ import annotations

import numpy as np

from agent.protocol.allreduce import AllreduceConfig, RoundContext
from agent.protocol.chunking import (
    ASSUMED_UPLINK_RATE,
    CROSS_SITE_QUEUED_VECTORS,
    cross_site_timeout,
)
from agent.protocol.ft_scope import RoundScope
from agent.protocol.topology import Tree

VALUES = 100_000  # 400 kB float32: 6 vectors drain in 0.24 s at 10 MB/s
SITES = {0: "s0", 1: "s0", 2: "s1", 3: "s1"}


def _scope(node: int, sites: dict[int, str] | None, **cfg: object) -> RoundScope:
    config = AllreduceConfig(**cfg)  # type: ignore[arg-type]
    tree = Tree.of([0, 1, 2, 3], 2, sites=sites)
    links = config.new_links()
    for peer in range(4):
        for _ in range(8):
            links.observe(peer, 0.002)  # a fast link's round trips: the RTO floor (min_timeout)
    return RoundScope(RoundContext(config, tree, node, 0, np.zeros(VALUES, np.float32), 0, links, 0.0))


def test_a_link_to_another_site_waits_for_the_uplinks_queue() -> None:
    floor = CROSS_SITE_QUEUED_VECTORS * VALUES * 4 / ASSUMED_UPLINK_RATE
    scope = _scope(0, SITES, min_timeout=0.02)
    assert scope.rto(2) == floor and scope.rto(3) == floor
    assert scope.rto(1) == 0.02  # the own site's link: as measured
    assert _scope(2, SITES, min_timeout=0.02).rto(0) == floor


def test_without_sites_or_with_fixed_timeouts_nothing_changes() -> None:
    assert _scope(0, None, min_timeout=0.02).rto(2) == 0.02
    assert _scope(0, SITES, timeout_mode="fixed", fixed_timeout=0.05).rto(2) == 0.05


def test_the_floor_never_passes_the_max_timeout() -> None:
    assert cross_site_timeout(10**9, 2.0) == 2.0
