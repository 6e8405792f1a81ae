"""A lossy link is not a dead link: with chunk loss p = 0.1 on every link (no cuts) the FT-tree
retransmits on the same links instead of rerouting, so rounds stay short and complete.

Before same-link retransmission (one lost ACK declared the whole link dead), this fleet had a
median round of 3.5 s (7 T) and 14 of 20 rounds degraded."""

from __future__ import annotations

import functools
import statistics
from dataclasses import replace

from agent.protocol.allreduce import AllreduceConfig
from agent.protocol.topology import Tree
from simulate.virtual_fleet import FaultSpec, RoundRecord, count_problems, run_fleet

NODES = 7
ROUNDS = 20
CHUNK = 1024
TIMEOUT = 0.5
CONFIG = AllreduceConfig(chunk_size=CHUNK, timeout_mode="fixed", fixed_timeout=TIMEOUT, round_deadline=5.0)


SEEDS = range(16)  # one seed's fleet is chaotic (a lost frame moves every later draw): judged pooled


@functools.cache
def lossy_fleet(seed: int, config: AllreduceConfig = CONFIG) -> list[RoundRecord]:
    return run_fleet(NODES, ROUNDS, length=8 * CHUNK, allreduce=config, seed=seed, latency=0.0005,
                     broker_bandwidth=500e6, keep_gradients=True, max_time=1e4,
                     faults=(FaultSpec("loss", 0, value=0.1),))


def reroutes(records: list[RoundRecord]) -> int:
    return sum(res.stats.reroutes for r in records for res in r.results.values())


def test_loss_on_every_link_costs_retransmissions_not_reroutes() -> None:
    """Relayed down the tree, the broadcast's units are resent too (the fan-out's losses are
    pulled instead: the test below). One seed decides little: a frame 23 bytes larger moved
    seed 1 from 43 to 183 reroutes (a different frame lost, then every later draw differs), so
    the bounds hold over 16 seeds. There, per 100 retransmissions: 17 reroutes on main, 31 with
    honest relayed results refused (issue 54.3's carriers), 17 once the refused child asks its
    parent straight (ft_pull.ask_parent)."""
    retransmits = rerouted = degraded = dead = 0
    durations: list[float] = []
    for seed in SEEDS:
        records = lossy_fleet(seed, replace(CONFIG, broadcast="tree"))
        assert [r.round for r in records] == list(range(ROUNDS)), f"seed {seed}: the fleet halted"
        for rec in records:
            if not rec.degraded:
                assert count_problems(rec, CHUNK) == [], (seed, rec.round)
        durations += [r.duration for r in records]
        degraded += sum(r.degraded for r in records)
        retransmits += sum(res.stats.retransmits for r in records for res in r.results.values())
        rerouted += reroutes(records)
        # Links are rarely declared dead for mere loss (before: ~160 times a seed here).
        dead += sum(n.kind == "link_dead" for r in records for notes in r.notes.values() for n in notes)
    rounds = ROUNDS * len(SEEDS)
    assert retransmits > 0, "p = 0.1 loss must have caused retransmissions"
    assert rerouted <= retransmits // 5, (rerouted, retransmits)
    assert statistics.median(durations) < 3 * TIMEOUT
    assert degraded <= rounds // 5, f"{degraded} of {rounds} rounds degraded"
    assert dead <= rounds, dead


def test_under_loss_the_fanout_reroutes_no_more_than_the_relayed_broadcast() -> None:
    """With the fan-out our parent sends us nothing but ACKs: a lost ACK must not send a unit
    that the root's result already counts to the backup (before: 51 and 78 reroutes in seeds
    0 and 1, against 38 and 59 relayed down the tree; the fan-out resends less, so the ratio
    above does not apply to it). Pooled over seeds: one seed is a coin flip either way."""
    fanout, tree = replace(CONFIG, broadcast="fanout"), replace(CONFIG, broadcast="tree")
    fanned = relayed = 0
    for seed in SEEDS[:8]:
        records = lossy_fleet(seed, fanout)
        assert [r.round for r in records] == list(range(ROUNDS)), "the fleet halted"
        assert statistics.median(r.duration for r in records) < 3 * TIMEOUT
        assert sum(r.degraded for r in records) <= ROUNDS // 5
        for rec in records:
            if not rec.degraded:
                assert count_problems(rec, CHUNK) == [], rec.round
        fanned += reroutes(records)
        relayed += reroutes(lossy_fleet(seed, tree))
    assert fanned <= relayed, (fanned, relayed)


def test_a_silent_peer_is_still_declared_dead_after_one_timeout() -> None:
    """A cut link (the peer says nothing at all) still costs about one timeout, not retries."""
    tree = Tree(tuple(range(NODES)), 2)
    leaf = tree.members[-1]
    parent = tree.parent(leaf)
    assert parent is not None
    base = run_fleet(NODES, 1, length=8 * CHUNK, allreduce=CONFIG, latency=0.0005)[0]
    cut = run_fleet(NODES, 1, length=8 * CHUNK, allreduce=CONFIG, latency=0.0005,
                    faults=(FaultSpec("cut", 0, leaf, parent),))[0]
    assert not cut.degraded
    assert cut.duration <= base.duration + 1.2 * TIMEOUT
    notes = [n for notes in cut.notes.values() for n in notes]
    assert any(n.kind == "link_dead" for n in notes)


def test_a_resync_nobody_can_answer_is_given_up_and_the_node_goes_on() -> None:
    # Found by hypothesis: 1 -> 2 and 0 -> 1 cut one way plus loss: node 1 falls back, its
    # state pull can never be answered (its only ways in are cut); it must not stall.
    config = AllreduceConfig(chunk_size=8, timeout_mode="fixed", fixed_timeout=0.05, round_deadline=1.0)
    faults = (FaultSpec("loss", 0, value=0.25), FaultSpec("cut", 0, 1, 2, one_way=True),
              FaultSpec("cut", 0, 0, 1, one_way=True))
    records = run_fleet(3, 3, length=37, keep_gradients=True, allreduce=config, faults=faults,
                        seed=0, max_time=60.0)
    assert [r.round for r in records] == [0, 1, 2]
    for rec in records:
        assert sorted(rec.ended) == [0, 1, 2], f"round {rec.round}: {sorted(rec.ended)}"
        assert count_problems(rec, 8) == []
