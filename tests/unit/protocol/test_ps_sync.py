"""ps-sync's round machine on the in-memory bus: the server's mean, a silent worker left out
after the gather timeout, a silent server."""

from __future__ import annotations

import numpy as np
import pytest

from agent.protocol.allreduce import AllreduceConfig, RoundContext, Send
from agent.protocol.ps_sync import PsSyncRound
from agent.protocol.rounds import new_round
from tests.unit.protocol.baseline_bus import Bus

CFG = AllreduceConfig(algorithm="ps-sync", chunk_size=5, round_deadline=2.0, reduce_fraction=0.5)
MEMBERS = (0, 1, 2, 3, 4)


def grads(seed: int = 1, length: int = 12) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(length).astype(np.float32) for n in MEMBERS}


def test_every_member_applies_the_servers_mean_and_only_the_server_talks_to_workers() -> None:
    bus = Bus(CFG, MEMBERS)
    g = grads()
    machines = bus.run_round(0, g)
    assert all(isinstance(m, PsSyncRound) for m in machines.values())
    mean = np.mean([g[n] for n in MEMBERS], axis=0)
    results = {n: m.result for n, m in machines.items()}
    assert all(r is not None and not r.degraded for r in results.values())
    assert len({r.values.tobytes() for r in results.values() if r is not None}) == 1
    assert np.allclose(results[0].values, mean, atol=1e-6)  # type: ignore[union-attr]
    # 3 chunks: each worker sends 3 to the server, the server 3 to each of 4 workers.
    assert bus.sent == 4 * 3 + 4 * 3
    assert bus.now < 0.01


def test_a_silent_worker_is_left_out_after_the_gather_timeout() -> None:
    bus = Bus(CFG, MEMBERS, silent=frozenset({3}))
    g = grads()
    machines = bus.run_round(0, g)
    results = [m.result for m in machines.values()]
    assert all(r is not None for r in results)
    assert bus.now == pytest.approx(CFG.round_deadline * CFG.reduce_fraction, abs=0.01)
    live_mean = np.mean([g[n] for n in MEMBERS if n != 3], axis=0)
    assert len({r.values.tobytes() for r in results if r is not None}) == 1
    first = results[0]
    assert first is not None and first.degraded and not first.missing_chunks
    assert np.allclose(first.values, live_mean, atol=1e-6)
    assert all(c == frozenset({0, 1, 2, 4}) for c in first.contributors)


def test_a_worker_the_fleet_declares_down_is_not_waited_for() -> None:
    bus = Bus(CFG, MEMBERS, silent=frozenset({3}))
    g = grads()
    bus.run_round(0, g, until=0.01)
    server = bus.machines[0]
    assert server.result is None
    server.peer_down(3, bus.now)
    assert server.result is not None and server.result.contributors[0] == frozenset({0, 1, 2, 4})


def test_without_the_server_every_worker_skips_the_round_at_the_deadline_alike() -> None:
    bus = Bus(CFG, MEMBERS, silent=frozenset({0}))
    machines = bus.run_round(0, grads())
    assert bus.now == pytest.approx(CFG.round_deadline)
    for m in machines.values():
        assert m.result is not None and m.result.degraded
        assert not m.result.values.any()  # nothing applied: the models stay identical


def test_a_server_the_fleet_declares_down_ends_the_round_at_once() -> None:
    bus = Bus(CFG, MEMBERS, silent=frozenset({0}))
    bus.run_round(0, grads(), until=0.01)
    worker = bus.machines[2]
    assert worker.result is None
    worker.peer_down(0, bus.now)
    assert worker.result is not None and worker.result.degraded and not worker.result.values.any()


def test_a_worker_takes_the_servers_model_hash_for_the_drift_check() -> None:
    bus = Bus(CFG, MEMBERS)
    machines = bus.run_round(0, grads())
    assert all(m.result is not None and m.result.root_model_hash == 0 for m in machines.values())


def test_a_round_skipped_before_it_started_sends_nothing() -> None:
    # The server is known down as the round starts: no mean can come, and sending to it
    # would only load the broker.
    g = grads()
    for n in (1, 4):
        machine = new_round(RoundContext(CFG, Bus(CFG, MEMBERS).tree, n, 2, g[n], 0, CFG.new_links(), 0.0))
        machine.peer_down(0, 0.0)
        assert machine.result is not None and machine.result.degraded and not machine.result.values.any()
        assert not [a for a in machine.start(0.0) if isinstance(a, Send)]
