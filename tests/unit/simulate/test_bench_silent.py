"""bench silent: the per-episode figures from the agents' telemetry, and its section."""

from __future__ import annotations

from typing import Any

from simulate.bench import silent


def _tel(node: int, rnd: int, allreduce: float, model_hash: str = "aa", degraded: bool = False) -> dict[str, Any]:
    return {"type": "telemetry", "node": node, "round": rnd, "t": float(rnd),
            "phase_seconds": {"allreduce": allreduce}, "model_hash": model_hash, "degraded": degraded}


def test_an_episode_measures_the_silent_round_the_rounds_without_the_node_and_the_rejoin() -> None:
    tels: dict[int, dict[int, dict[str, Any]]] = {}
    for rnd in range(20):
        tels[rnd] = {}
        for node in range(4):
            if node == 2 and 5 <= rnd < 12:
                continue  # frozen: it reports nothing
            slow = 0.9 if rnd == 5 else 0.1
            stale = "bb" if node == 2 and rnd == 12 else "aa"  # back, but not yet in step
            tels[rnd][node] = _tel(node, rnd, slow, stale)
    e = silent.episode_result(tels, node=2, start=5, end=10, last=19)
    assert e["silent_round_s"] == 0.9 and e["silent_median_s"] == 0.1
    assert e["degraded_while_silent"] == 0 and e["max_survivor_hashes"] == 1
    assert e["silent_p90_s"] == 0.1  # rounds 7-9: the silent round itself is not in it
    assert e["rounds_to_rejoin"] == 3  # round 13 is its first round with the fleet's hash


def test_the_flapping_ends_at_its_last_will_not_at_the_clean_exit() -> None:
    records = [{"type": "status", "node": 1, "state": "offline", "t": t} for t in (10.0, 11.5, 13.0)]
    records += [_tel(0, r, 0.1) | {"t": 9.0 + r * 0.5} for r in range(40)]
    records.append({"type": "status", "node": 1, "state": "offline", "t": 60.0})  # the end
    assert silent._flap_end(records, 1, 2) == 9  # round 8 ended at t=13.0


def test_the_table_has_a_row_per_episode() -> None:
    doc = {"short_rounds": 5, "long_seconds": 30.0, "results": [
        {"case": "fault-free", "nodes": 7, "median_s": 0.15, "p90_s": 0.18, "max_s": 0.3, "episodes": [],
         "identical_at_end": True, "accuracy_drop_pp": 0.0},
        {"case": "hang-leaf", "nodes": 7, "median_s": 0.16, "identical_at_end": True, "accuracy_drop_pp": 0.1,
         "episodes": [{"start": 30, "end": 35, "silent_round_s": 0.8, "silent_median_s": 0.15,
                       "silent_max_s": 0.2, "silent_p90_s": 0.17, "degraded_while_silent": 0, "max_survivor_hashes": 1,
                       "rounds_to_rejoin": 2, "after_median_s": 0.15}]}]}
    doc["results"][0]["round_times_s"] = [0.15] * 9 + [0.3]
    doc["results"][1]["episodes"][0]["silent_times_s"] = [0.15, 0.2, 0.23]
    doc["results"][0]["ordinary_max_s"] = 0.2
    doc["results"][0]["ordinary_round_times_s"] = [0.15] * 8
    doc["results"][1]["episodes"][0] |= {"silent_ordinary_max_s": 0.19, "after_ordinary_max_s": 0.21,
                                         "silent_ordinary_times_s": [0.15, 0.19], "before_median_s": 0.12}
    rows = silent.table_rows(doc)
    assert rows == [["hang-leaf", 7, "5 rounds", 0.15, 0.8, 0.15, 0.17, 0.18, 0.2, 0.3, 0.19, 0.2, "1 of 3 (33 %)",
                     "1 of 10 (10 %)", "0 of 2 (0 %)", "0 of 8 (0 %)", 0.12, "1 of 2 (50 %)", 0, 1, 2, 2, 0.15,
                     0.21, True, 0.1]]
    assert "hang-leaf" in silent.render_table(doc)


def test_accuracy_is_compared_at_the_last_round_both_runs_evaluated() -> None:
    results = [{"case": "fault-free", "nodes": 7, "accuracy_by_round": {"24": 0.90, "49": 0.92, "79": 0.93}},
               {"case": "hang-leaf", "nodes": 7, "accuracy_by_round": {"24": 0.90, "49": 0.915, "99": 0.94}},
               {"case": "crash-root", "nodes": 7, "accuracy_by_round": {}}]
    silent.add_accuracy_drops(results)
    assert results[1]["accuracy_drop_pp"] == 0.5 and results[1]["accuracy_compared_at_round"] == 49
    assert results[2]["accuracy_drop_pp"] is None


def test_the_p90_is_the_ninth_tenth_round_not_the_worst() -> None:
    times = [0.1] * 18 + [0.5, 2.0]  # two slow rounds (a checkpoint, an evaluation) in 20
    assert silent._p90(times) == 0.1 and silent._p90([*times, 3.0]) == 0.5
    assert silent._p90([]) is None


def test_a_round_that_waited_on_a_dead_roots_tree_counts_the_wait() -> None:
    waited = _tel(0, 31, 0.02) | {"phase_seconds": {"allreduce": 0.02, "wait": 4.98}}
    assert silent._allreduce_max([waited, _tel(1, 31, 0.1)]) == 5.0


def test_a_restart_is_also_counted_from_when_the_restarted_agent_was_up() -> None:
    """The respawn at round 50; the process is up (online) when the fleet is at round 64, and
    back with the fleet's hash at 66: 16 rounds from the restart, 2 after its start-up."""
    records = [{"type": "fault", "kind": "crash", "round": 30, "t": 3.0},
               {"type": "fault", "kind": "crash", "round": 50, "t": 5.0},
               {"type": "status", "node": 0, "state": "online", "t": 1.0},  # the first start
               {"type": "status", "node": 0, "state": "online", "t": 6.45}]
    records += [_tel(1, r, 0.1) | {"t": r / 10} for r in range(80)]
    assert silent._started_round(records, 0, 50) == 64
    assert silent._started_round(records, 0, 51) is None
    tels = {r: {n: _tel(n, r, 0.1) for n in range(3) if n != 0 or not 30 <= r < 66} for r in range(80)}
    e = silent.episode_result(tels, node=0, start=30, end=50, last=79, started=64)
    assert e["rounds_to_rejoin"] == 16 and e["rounds_to_rejoin_after_start"] == 2


def test_checkpoint_and_evaluation_rounds_are_left_out_of_the_worst_ordinary_round() -> None:
    assert [r for r in range(18, 28) if silent.periodic(r)] == [20, 25, 26]
    assert silent._ordinary_max({19: 0.2, 20: 0.9, 25: 1.0, 26: 0.8, 27: 0.3}) == 0.3
    assert silent._ordinary_max({20: 0.9}) is None


def test_ordinary_rounds_over_the_median_leave_out_checkpoint_and_evaluation_rounds() -> None:
    tels = {rnd: {n: _tel(n, rnd, 0.5 if rnd in (20, 23) else 0.1) for n in range(3)} for rnd in range(16, 30)}
    e = silent.episode_result(tels, node=2, start=16, end=28, last=29)
    assert sorted(e["silent_times_s"]) [-2:] == [0.5, 0.5]  # both slow rounds count here
    assert max(e["silent_ordinary_times_s"]) == 0.5  # round 23 is ordinary, 20 a checkpoint
    assert len(e["silent_ordinary_times_s"]) == len(e["silent_times_s"]) - 3  # 20, 25, 26 left out


def test_an_episode_also_has_its_own_runs_median_from_the_ordinary_rounds_before_it() -> None:
    """The host got busier between the fault-free run and this one: the rounds before the
    fault say what this run's rounds cost without it (checkpoint round 20 left out)."""
    tels = {rnd: {n: _tel(n, rnd, 0.9 if rnd == 20 else 0.2 if rnd < 30 else 0.25) for n in range(3)}
            for rnd in range(0, 40)}
    e = silent.episode_result(tels, node=2, start=30, end=36, last=39)
    assert e["before_median_s"] == 0.2
    assert silent._over(e["silent_ordinary_times_s"], e["before_median_s"]) == "0 of 4 (0 %)"
    assert silent._over(e["silent_ordinary_times_s"], 0.15) == "4 of 4 (100 %)"  # a quieter host's median


def test_a_scenario_injects_each_of_its_faults_once() -> None:
    toml = silent._scenario("crash-inner", 7, 20, [(5, 8), (12, 14)]).toml()
    assert toml.count("[[faults]]") == 2
    assert toml.count("at_round = 5") == 1 and toml.count("restart_round = 14") == 1
