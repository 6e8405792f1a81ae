"""ps-async's round machine on the in-memory bus: each worker answered as its gradient arrives,
the ledger paying every worker every update the server applied, a silent worker or server."""

from __future__ import annotations

import numpy as np
import pytest

from agent.protocol.allreduce import AllreduceConfig, RoundContext, Send
from agent.protocol.ps_async import PsAsyncRound
from agent.protocol.rounds import new_round
from tests.unit.protocol.baseline_bus import Bus

CFG = AllreduceConfig(algorithm="ps-async", chunk_size=5, round_deadline=2.0, reduce_fraction=0.5)
MEMBERS = (0, 1, 2, 3)


def grads(seed: int, length: int = 12) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(length).astype(np.float32) for n in MEMBERS}


def test_the_server_applies_the_round_mean_and_answers_each_worker_what_it_applied_so_far() -> None:
    bus = Bus(CFG, MEMBERS)
    g = grads(1)
    machines = bus.run_round(0, g)
    assert all(isinstance(m, PsAsyncRound) for m in machines.values())
    server = machines[0].result
    assert server is not None and not server.degraded
    assert np.allclose(server.values, np.mean([g[n] for n in MEMBERS], axis=0), atol=1e-6)
    # Worker 1's chunks arrive first: its answer holds the server's and its own quarter only.
    first = machines[1].result
    assert first is not None and not first.degraded
    assert np.allclose(first.values, (g[0] + g[1]) / 4, atol=1e-6)
    assert len({m.result.values.tobytes() for m in machines.values() if m.result is not None}) > 1


def test_every_worker_gets_every_update_the_server_applied_late_but_in_full() -> None:
    bus = Bus(CFG, MEMBERS)
    applied = {n: np.zeros(12) for n in MEMBERS}
    for rnd in range(6):
        for n, m in bus.run_round(rnd, grads(10 + rnd)).items():
            assert m.result is not None and not m.result.missing_chunks
            applied[n] += m.result.values
    ledger = bus.ledgers[0]
    # Worker 1, answered first, is owed the rest of the last round; worker 3, last, nothing.
    assert not np.allclose(applied[1], applied[0], atol=1e-4)
    assert np.allclose(ledger.owed[3], 0.0, atol=1e-6)
    for worker in MEMBERS[1:]:
        assert np.allclose(applied[worker] + ledger.owed[worker], applied[0], atol=1e-5)


def test_a_silent_worker_is_left_out_after_the_gather_timeout_the_others_answered_at_once() -> None:
    bus = Bus(CFG, MEMBERS, silent=frozenset({2}))
    g = grads(3)
    machines = bus.run_round(0, g)
    assert bus.now == pytest.approx(CFG.round_deadline * CFG.reduce_fraction, abs=0.01)
    assert all(m.result is not None and m.result.finished_at < 0.01 for n, m in machines.items() if n != 0)
    server = machines[0].result
    assert server is not None and server.degraded
    assert np.allclose(server.values, (g[0] + g[1] + g[3]) / 4, atol=1e-6)
    # The silent worker is owed the whole round's update, to come with its next answer.
    assert np.allclose(bus.ledgers[0].owed[2], server.values, atol=1e-6)


def test_a_worker_whose_server_is_down_skips_the_round_at_once() -> None:
    bus = Bus(CFG, MEMBERS, silent=frozenset({0}))
    bus.run_round(0, grads(4), until=0.01)
    worker = bus.machines[1]
    assert worker.result is None
    worker.peer_down(0, bus.now)
    assert worker.result is not None and worker.result.degraded and not worker.result.values.any()


def test_a_late_worker_is_answered_with_the_rounds_update_without_its_own() -> None:
    bus = Bus(CFG, MEMBERS, silent=frozenset({2}))
    g = grads(5)
    machines = bus.run_round(0, g)
    server = machines[0]
    assert server.result is not None
    worker = new_round(RoundContext(CFG, bus.tree, 2, 0, g[2], 0, CFG.new_links(), 1.5))
    frames = [a.frame for a in worker.start(1.5) if isinstance(a, Send)]  # sent late
    answers = [a for f in frames for a in server.on_frame(f, 2.0) if isinstance(a, Send)]
    assert len(answers) == 3  # one per chunk
    values = np.concatenate([a.frame.values() for a in answers])
    assert np.allclose(values, server.result.values, atol=1e-6)
    assert np.allclose(bus.ledgers[0].owed[2], 0.0, atol=1e-6)  # paid, but for the wire's rounding


def test_a_round_skipped_before_it_started_sends_nothing() -> None:
    g = grads(3)
    for n in (1, 3):
        machine = new_round(RoundContext(CFG, Bus(CFG, MEMBERS).tree, n, 2, g[n], 0, CFG.new_links(), 0.0))
        machine.peer_down(0, 0.0)  # the server
        assert machine.result is not None and machine.result.degraded and not machine.result.values.any()
        assert not [a for a in machine.start(0.0) if isinstance(a, Send)]
