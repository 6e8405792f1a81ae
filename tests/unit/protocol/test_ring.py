"""The ring allreduce's round machine on the in-memory bus: reduce-scatter and all-gather to
one identical mean, successor-only links, a silent member ending the round, never a hang."""

from __future__ import annotations

import numpy as np
import pytest

from agent.protocol.allreduce import AllreduceConfig, RoundContext
from agent.protocol.ring import RingRound, ring_segments
from agent.protocol.rounds import new_round
from tests.unit.protocol.baseline_bus import Bus

CFG = AllreduceConfig(algorithm="ring", round_deadline=2.0)
MEMBERS = (0, 2, 3, 5, 9)


def grads(length: int = 23) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(7)
    return {n: rng.standard_normal(length).astype(np.float32) for n in MEMBERS}


def test_segments_cover_the_vector() -> None:
    assert ring_segments(10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert ring_segments(2, 3) == [(0, 0), (0, 1), (1, 2)]


@pytest.mark.parametrize("members", [(0,), (0, 1), MEMBERS])
def test_every_member_ends_with_the_same_exact_mean(members: tuple[int, ...]) -> None:
    bus = Bus(CFG, members)
    g = {n: v for n, v in grads().items() if n in members} if members == MEMBERS else {
        n: np.arange(23, dtype=np.float32) * (n + 1) for n in members}
    machines = bus.run_round(0, g)
    assert all(isinstance(m, RingRound) for m in machines.values())
    values = {m.result.values.tobytes() for m in machines.values() if m.result is not None}
    assert len(values) == 1 and all(m.result is not None and not m.result.degraded for m in machines.values())
    first = machines[members[0]].result
    assert first is not None
    assert np.allclose(first.values, np.mean([g[n] for n in members], axis=0), atol=1e-5)
    # 2 (N - 1) hops per member: N - 1 in the reduce-scatter, N - 1 in the all-gather.
    assert bus.sent == len(members) * 2 * (len(members) - 1)


def test_each_member_sends_only_to_its_successor() -> None:
    bus = Bus(CFG, MEMBERS)
    sends: list[tuple[int, int]] = []
    post = bus._post

    def spy(node: int, actions: list) -> None:  # type: ignore[type-arg]
        sends.extend((node, a.dst) for a in actions if hasattr(a, "dst"))
        post(node, actions)

    bus._post = spy  # type: ignore[method-assign]
    bus.run_round(0, grads())
    ring = {MEMBERS[i]: MEMBERS[(i + 1) % len(MEMBERS)] for i in range(len(MEMBERS))}
    assert sends and all(ring[src] == dst for src, dst in sends)


def test_a_silent_member_skips_the_round_at_the_deadline_never_a_hang() -> None:
    bus = Bus(CFG, MEMBERS, silent=frozenset({3}))
    machines = bus.run_round(0, grads())
    assert bus.now == pytest.approx(CFG.round_deadline)
    for m in machines.values():
        # Every segment passes the silent member: no mean anywhere, nothing applied anywhere.
        assert m.result is not None and m.result.degraded and not m.result.values.any()


def test_a_member_declared_down_ends_the_round_at_once() -> None:
    bus = Bus(CFG, MEMBERS, silent=frozenset({3}))
    bus.run_round(0, grads(), until=0.05)
    for m in bus.machines.values():
        assert m.result is None
        m.peer_down(3, bus.now)
        assert m.result is not None and m.result.degraded and m.result.finished_at == bus.now
        assert not m.result.values.any()


def test_every_member_takes_the_roots_model_hash_for_the_drift_check() -> None:
    bus = Bus(CFG, MEMBERS)
    hashes = {n: 100 + n for n in MEMBERS}  # every member on a model of its own
    g = grads()
    bus.machines = {n: new_round(RoundContext(CFG, bus.tree, n, 1, g[n], hashes[n], CFG.new_links(), 0.0))
                    for n in MEMBERS}
    for n, m in bus.machines.items():
        bus._post(n, m.start(bus.now))
    while any(m.result is None for m in bus.machines.values()):
        bus._step(bus.now + 5)
    # Only members unlike the root (the lowest id) then fetch the fleet's state.
    assert {m.result.root_model_hash for m in bus.machines.values() if m.result is not None} == {hashes[0]}


def test_a_round_skipped_before_it_started_sends_nothing() -> None:
    # The core tells a machine about members known down before it starts it: a ring without
    # one ends at once, and passing a segment on would only load the broker with a dead round.
    g = grads()
    for n in (0, 2, 5, 9):
        machine = new_round(RoundContext(CFG, Bus(CFG, MEMBERS).tree, n, 4, g[n], 0, CFG.new_links(), 0.0))
        machine.peer_down(3, 0.0)
        assert machine.result is not None and machine.result.degraded and not machine.result.values.any()
        assert machine.start(0.0) == []
