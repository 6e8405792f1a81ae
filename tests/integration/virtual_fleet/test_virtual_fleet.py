"""The virtual fleet driver: determinism, callbacks, algorithms compared, drift resync, CLI."""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pytest

from agent.protocol.allreduce import AllreduceConfig
from agent.protocol.chunking import SLOW_LINK_CHUNK_VALUES
from agent.protocol.notes import NoteKind
from simulate import fault_cost
from simulate.virtual_fleet import FaultSpec, count_problems, run_fleet

FAST = dict(chunk_size=8, timeout_mode="fixed", fixed_timeout=0.05, round_deadline=1.0)


def config(**kw: object) -> AllreduceConfig:
    return AllreduceConfig(**{**FAST, **kw})  # type: ignore[arg-type]


def test_same_seed_same_run() -> None:
    faults = (FaultSpec("loss", 0, value=0.2), FaultSpec("cut", 1, 3, 1))
    a = run_fleet(7, 4, length=37, allreduce=config(), faults=faults, seed=5)
    b = run_fleet(7, 4, length=37, allreduce=config(), faults=faults, seed=5)
    for ra, rb in zip(a, b, strict=True):
        assert ra.duration == rb.duration
        assert {n: r.values.tobytes() for n, r in ra.results.items()} == {
            n: r.values.tobytes() for n, r in rb.results.items()}


def test_gradient_callback_sees_the_params_and_training_moves_them() -> None:
    seen: list[tuple[int, int]] = []

    def gradient(node: int, round: int, params: np.ndarray) -> np.ndarray:
        seen.append((node, round))
        return params.copy()  # the gradient of |p|^2 / 2: all params shrink towards 0

    records = run_fleet(5, 6, length=20, allreduce=config(), gradient_fn=gradient, lr=0.1)
    assert sorted(set(seen)) == [(n, r) for n in range(5) for r in range(6)]
    first, last = records[0].start_hashes, records[-1].start_hashes
    assert len(set(last.values())) == 1 and set(first.values()) != set(last.values())


@pytest.mark.parametrize("algorithm", ["tree", "rps"])
def test_baselines_are_exact_without_faults(algorithm: str) -> None:
    records = run_fleet(9, 2, length=37, allreduce=config(algorithm=algorithm), keep_gradients=True)
    for rec in records:
        assert not rec.degraded and len({r.values.tobytes() for r in rec.results.values()}) == 1
        assert count_problems(rec, 8) == []


def test_a_cut_stalls_plain_tree_until_the_deadline_but_not_ft_tree() -> None:
    cut = (FaultSpec("cut", 0, 3, 1),)
    plain = run_fleet(7, 1, length=37, allreduce=config(algorithm="tree"), faults=cut, keep_gradients=True)[0]
    rps = run_fleet(7, 1, length=37, allreduce=config(algorithm="rps"), faults=cut, keep_gradients=True)[0]
    ft = run_fleet(7, 1, length=37, allreduce=config(), faults=cut, keep_gradients=True)[0]
    # The allreduce runs to the deadline (the last round's final sync then finds no two
    # peers with one model to agree on: every node fell back to its own).
    ends = [r.finished_at - plain.start for r in plain.results.values()]
    assert plain.degraded and max(ends) == pytest.approx(1.0, abs=0.01)
    assert rps.degraded  # 3 <-> 1 blocks fall back to the local value
    assert not ft.degraded and ft.duration < 0.2
    for rec in (plain, rps, ft):
        assert count_problems(rec, 8) == []  # fallbacks are still exact means of their sets


def test_degraded_rounds_cause_drift_and_drifted_nodes_resync() -> None:
    # Leaf 6 is cut off from every peer for rounds 1 and 2 (it is alive: it refutes the
    # suspicion, so it stays a member): round 1 ends there without the fleet's result, so it
    # falls back to its own gradient, its model drifts from the fleet's, the next root hash
    # reveals it and it fetches the fleet's state. (Cut for round 1 only, it pulls round 1's
    # result once healed and applies the fleet's mean without itself: no drift at all.)
    # Relayed down the tree: the root's fan-out is no link, and brings the leaf the fleet's
    # mean through the cuts (next test).
    faults = (*(FaultSpec("cut", 1, 6, p) for p in range(6)),
              *(FaultSpec("heal", 3, 6, p) for p in range(6)))
    records = run_fleet(7, 8, length=37, allreduce=config(broadcast="tree"), faults=faults,
                        compute_time=0.01)
    assert records[1].degraded and records[1].results[6].missing_chunks
    assert len(set(records[2].start_hashes.values())) > 1
    notes = [n.kind for rec in records for ns in rec.notes.values() for n in ns]
    assert "drift" in notes and "state_received" in notes
    assert all(6 in rec.members for rec in records)  # alive: never evicted
    assert len(set(records[-1].start_hashes.values())) == 1 and not records[-1].degraded


def test_a_leaf_cut_from_every_peer_still_takes_the_fleets_mean_from_the_fanout() -> None:
    faults = (*(FaultSpec("cut", 1, 6, p) for p in range(6)),
              *(FaultSpec("heal", 3, 6, p) for p in range(6)))
    records = run_fleet(7, 8, length=37, allreduce=config(broadcast="fanout"), faults=faults,
                        compute_time=0.01)
    assert all(6 in rec.members for rec in records)  # alive: never evicted
    # Its own units reach nobody, but the mean of the others reaches it: no model drifts.
    assert all(len(set(rec.start_hashes.values())) == 1 for rec in records)
    assert not records[-1].degraded


@pytest.mark.slow
def test_many_rounds_run_in_seconds() -> None:
    t0 = time.perf_counter()
    records = run_fleet(7, 300, length=100, allreduce=AllreduceConfig(chunk_size=64))
    wall = time.perf_counter() - t0
    print(f"\n300 rounds x 7 nodes: {wall:.2f} s wall, {records[-1].end:.3f} s simulated")
    assert len(records) == 300 and not any(r.degraded for r in records)


def test_fault_cost_command_prints_one_json_document(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    fault_cost.add_arguments(parser)
    args = parser.parse_args(["--nodes", "7", "--timeout", "0.2", "--values", "50000", "--json"])
    assert fault_cost.run(args) == 0
    doc = json.loads(capsys.readouterr().out)
    row = doc["rows"][0]
    assert row["nodes"] == 7 and set(row["seconds"]) == set(fault_cost.SCENARIOS)
    assert 0.5 < row["extra_in_t"]["one_fault"] <= 1.2
    assert 1.0 < row["extra_in_t"]["two_serial"] <= 2.4
    assert fault_cost.run(parser.parse_args(["--nodes", "1"])) == 2
    assert "need --nodes >= 2" in capsys.readouterr().err


def test_fault_cost_table_text(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    fault_cost.add_arguments(parser)
    assert fault_cost.run(parser.parse_args(["--nodes", "3", "--values", "1000"])) == 0
    out = capsys.readouterr().out
    assert "two_serial" in out and "n/a" in out and "2.9 T" in out  # 3 nodes: no serial pair


def test_on_a_slow_downlink_the_coordinator_cuts_the_fleets_chunks_smaller_as_the_agent_does() -> None:
    """Frames cross the bus encoded and are read by the agent's own decode, timed as the MQTT
    transport times them: the coordinator measures its 6 MB/s downlink from the first large
    frames and has the fleet cut the model in 32,768-value chunks and fan the result out (the
    same code as in the agent: agent/core_chunks.py)."""
    model = 407_050  # the thesis model: 2 chunks of the default 262,144 values
    slow = dict(length=model, allreduce=AllreduceConfig(round_deadline=5.0), bandwidth=6e6,
                ingress_bandwidth=6e6, latency=0.001, compute_time=0.05, max_time=1e3)
    records = run_fleet(7, 4, **slow)  # type: ignore[arg-type]
    chunks = [{len(res.contributors) for res in r.results.values()} for r in records]
    assert chunks[0] == {2} and chunks[-1] == {-(-model // SLOW_LINK_CHUNK_VALUES)}, chunks
    notes = [n for r in records for n in r.notes.get(0, []) if n.kind == NoteKind.CHUNKS]
    assert len(notes) == 1 and "32,768 values per chunk, broadcast fanout" in notes[0].detail
    assert not any(r.degraded for r in records)
    fixed = run_fleet(7, 4, **{**slow, "adapt_chunks": False})  # type: ignore[arg-type]
    assert {len(res.contributors) for r in fixed for res in r.results.values()} == {2}
    fast = run_fleet(7, 4, **{**slow, "ingress_bandwidth": None, "bandwidth": None})  # type: ignore[arg-type]
    assert {len(res.contributors) for r in fast for res in r.results.values()} == {2}
